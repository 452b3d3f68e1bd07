// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// startOnOwnRedis serves a store over a Redis of the test's own, with a
// short store timeout.
func startOnOwnRedis(t *testing.T) (*env, *redistest.Server) {
	t.Helper()
	srv := redistest.NewPrivateServer(t) // stopped and started again
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	store := redisstore.New(rdb, redisstore.Options{Timeout: 300 * time.Millisecond})
	return startOn(t, store), srv
}

// requireUnavailable checks that every call is refused with 503
// store-unavailable and Retry-After, and that readiness fails while the
// process stays alive.
func requireUnavailable(t *testing.T, e *env, key, token string) {
	t.Helper()
	c := e.as(t, "")
	check := func(op string, resp *http.Response, body []byte) {
		t.Helper()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s with the store down: got %d %s, want 503", op, resp.StatusCode, body)
		}
		requireProblem(t, resp, body, http.StatusServiceUnavailable, "store-unavailable")
		requireRetryAfter(t, resp, 1, 60)
	}
	rb := c.begin(idem.BeginRequest{Key: idemtest.Unique("fresh"), Owner: ptr("req-1")})
	check("begin of a new key", rb.HTTPResponse, rb.Body)
	if rb.Headers503 == nil || rb.Headers503.RetryAfter < 1 {
		t.Fatalf("Retry-After not parsed by the client: %+v", rb.Headers503)
	}
	rb = c.begin(idem.BeginRequest{Key: key, WaitMs: ptr[int64](200)})
	check("begin of a held key with wait_ms", rb.HTTPResponse, rb.Body)
	rc := c.complete(idem.CompleteRequest{Key: key, LeaseToken: token, Response: &idem.StoredResponse{Body: ptr("x")}})
	check("complete", rc.HTTPResponse, rc.Body)
	rf := c.fail(idem.FailRequest{Key: key, LeaseToken: token})
	check("fail", rf.HTTPResponse, rf.Body)
	rx := c.extend(idem.ExtendRequest{Key: key, LeaseToken: token})
	check("extend", rx.HTTPResponse, rx.Body)
	rs := c.status(idem.GetStatusParams{Key: key})
	check("status", rs.HTTPResponse, rs.Body)
	rd := c.del(idem.DeleteKeyParams{Key: key})
	check("delete", rd.HTTPResponse, rd.Body)

	rr, err := c.c.ReadyzWithResponse(bg)
	must(t, err)
	if rr.StatusCode() != http.StatusServiceUnavailable || rr.JSON503 == nil ||
		len(rr.JSON503.Failures) != 1 || rr.JSON503.Failures[0].Check != idem.ReadinessFailureCheckReachable {
		t.Fatalf("readyz with the store down: %d %s, want 503 naming the unreachable node", rr.StatusCode(), rr.Body)
	}
	hr, err := c.c.HealthzWithResponse(bg)
	must(t, err)
	if hr.StatusCode() != http.StatusOK {
		t.Fatalf("healthz with the store down: %d, want 200", hr.StatusCode())
	}
}

// awaitReady polls /readyz until the store answers again.
func awaitReady(t *testing.T, e *env) {
	t.Helper()
	c := e.client(t, "")
	idemtest.Eventually(t, 15*time.Second, "readyz 200 again", func() bool {
		r, err := c.ReadyzWithResponse(bg)
		return err == nil && r.StatusCode() == http.StatusOK
	})
}

// Fail closed: while Redis is unreachable or silent every call gets 503
// store-unavailable, and the same service serves again once Redis is back.
func TestE2EStoreUnavailable(t *testing.T) {
	t.Parallel()
	t.Run("stopped", func(t *testing.T) {
		t.Parallel()
		e, srv := startOnOwnRedis(t)
		c := e.as(t, "")
		key := idemtest.Unique("order")
		l := c.acquire(idem.BeginRequest{Key: key})

		srv.Stop(t)
		requireUnavailable(t, e, key, l.LeaseToken)

		srv.Start(t) // empty: the test server keeps nothing on disk
		awaitReady(t, e)
		again := c.acquire(idem.BeginRequest{Key: key})
		if again.Attempt != 1 {
			t.Fatalf("begin on the restarted, empty Redis: %+v", again)
		}
		c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: again.LeaseToken})
		if r := c.begin(idem.BeginRequest{Key: key}); r.StatusCode() != http.StatusOK {
			t.Fatalf("replay after Redis came back: %d %s", r.StatusCode(), r.Body)
		}
	})

	t.Run("not answering", func(t *testing.T) {
		t.Parallel()
		e, srv := startOnOwnRedis(t)
		c := e.as(t, "")
		key := idemtest.Unique("order")
		l := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](60000)})

		resume := srv.Pause(t)
		requireUnavailable(t, e, key, l.LeaseToken)
		resume()

		awaitReady(t, e)
		// Nothing was lost and nothing was let through: the lease is still
		// the holder's.
		r := c.begin(idem.BeginRequest{Key: key})
		requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
		c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("done")}})
		if rec := c.record(key); rec.State != idem.StateCompleted || rec.Attempt != 1 {
			t.Fatalf("record after Redis answered again: %+v", rec)
		}
	})
}

// Three idemsvc instances over one Redis Cluster: of 300 concurrent begins
// of one key, spread over the three, exactly one acquires.
func TestE2EReplicasShareCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.SharedCluster(t)
	var clients []*idem.ClientWithResponses
	var envs []*env
	for range 3 {
		// A generous store timeout: 300 requests at once on a small
		// machine must not turn into 503s, which this test is not about.
		e := startOn(t, redisstore.New(cluster.Client(t), redisstore.Options{Timeout: 10 * time.Second}))
		envs = append(envs, e)
		clients = append(clients, e.client(t, ""))
		awaitReady(t, e) // the cluster client has loaded the slot map
	}
	key := idemtest.Unique("order")
	const n = 300
	results := make([]*idem.BeginResponse, n)
	errs := make([]error, n)
	startCh := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-startCh
			results[i], errs[i] = clients[i%3].BeginWithResponse(bg, idem.BeginRequest{
				Key: key, Owner: ptr(fmt.Sprintf("caller-%d", i)), LeaseMs: ptr[int64](60000)})
		})
	}
	close(startCh)
	wg.Wait()

	var winner *idem.BeginAcquired
	winnerAt := -1
	conflicts := 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("begin %d: %v", i, errs[i])
		}
		switch r.StatusCode() {
		case http.StatusCreated:
			if winner != nil {
				t.Fatalf("two begins acquired the key: %d (%s) and %d (%s)", winnerAt, winner.LeaseToken, i, r.JSON201.LeaseToken)
			}
			winner, winnerAt = r.JSON201, i
		case http.StatusConflict:
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
			if p := r.ApplicationproblemJSON409; *p.Attempt != 1 {
				t.Fatalf("begin %d: in progress by attempt %d, want 1", i, *p.Attempt)
			}
			conflicts++
		default:
			t.Fatalf("begin %d: %d %s", i, r.StatusCode(), r.Body)
		}
	}
	if winner == nil || conflicts != n-1 {
		t.Fatalf("%d conflicts and winner %v; want exactly one 201 and %d 409s", conflicts, winner, n-1)
	}
	for i, r := range results {
		if i != winnerAt && !sameTime(*r.ApplicationproblemJSON409.LeaseExpiresAt, winner.LeaseExpiresAt) {
			t.Fatalf("begin %d saw lease_expires_at %s, the winner's is %s", i, r.ApplicationproblemJSON409.LeaseExpiresAt, winner.LeaseExpiresAt)
		}
	}

	// The winner completes through another instance; every instance
	// replays the outcome.
	other := envs[(winnerAt+1)%3].as(t, "")
	other.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: winner.LeaseToken, Response: &idem.StoredResponse{Body: ptr("once")}})
	for i, e := range envs {
		r := e.as(t, "").begin(idem.BeginRequest{Key: key})
		if r.StatusCode() != http.StatusOK || *r.JSON200.Response.Body != "once" || r.JSON200.Attempt != 1 {
			t.Fatalf("instance %d replay: %d %s", i, r.StatusCode(), r.Body)
		}
	}
}
