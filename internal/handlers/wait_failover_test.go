// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// failoverWaiters is how many begins wait on each key across a failover.
const failoverWaiters = 2

// TestWaitersSurviveFailover parks waiters on keys of a master, kills the
// master, completes the keys once its replica took over, and checks that
// every waiter gets the completed response soon after: the subscriptions
// moved to the new master. The fallback read comes only after a minute, so
// an answer within seconds came by a push.
func TestWaitersSurviveFailover(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.NewClusterWith(t, redistest.ClusterOptions{Private: true}) // a master is killed
		cl.WaitHealthy(t)
		master := cl.Nodes()[0]
		var keys []string
		for len(keys) < 4 {
			if key := idemtest.Unique("failover"); cl.MasterOf(t, redisstore.Key(handlers.DefaultTenant, key)) == master {
				keys = append(keys, key)
			}
		}
		waitAcrossFailover(t, cl.Client(t), keys, func() {
			master.Kill(t)
			idemtest.Eventually(t, 30*time.Second, "the replica takes over", func() bool {
				return cl.MasterOf(t, redisstore.Key(handlers.DefaultTenant, keys[0])) != master
			})
		})
	})

	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		st := redistest.NewSentinel(t)
		st.WaitHealthy(t)
		keys := []string{idemtest.Unique("failover"), idemtest.Unique("failover")}
		waitAcrossFailover(t, st.Client(t), keys, func() {
			st.Master(t).Kill(t)
			st.WaitFailover(t)
		})
	})
}

// waitAcrossFailover acquires keys, parks failoverWaiters waiters on each,
// runs failover, completes the keys and checks every waiter's answer.
// The keys are acquired with WaitReplicas, so that they are on the replica
// before the failover; the rest goes without, as the promoted replica has
// no replica of its own.
func waitAcrossFailover(t *testing.T, client redis.UniversalClient, keys []string, failover func()) {
	store := redisstore.New(client, redisstore.Options{})
	replicated := redisstore.New(client, redisstore.Options{WaitReplicas: 1})
	e := start(t, handlers.Config{Store: store, MaxWait: 2 * time.Minute, WaitFallbackInterval: time.Minute})
	c := e.as(t, "")
	tokens := make([]string, len(keys))
	for i, key := range keys {
		res, err := replicated.Begin(t.Context(), handlers.DefaultTenant, statemachine.BeginRequest{Key: key, Lease: 2 * time.Minute})
		must(t, err)
		tokens[i] = res.Lease.Token
	}
	answers := make(chan waited, len(keys)*failoverWaiters)
	for _, key := range keys {
		for range failoverWaiters {
			go func() {
				start := time.Now()
				r, err := c.c.BeginWithResponse(bg, idem.BeginRequest{Key: key, WaitMs: ptr[int64](120_000)})
				answers <- waited{r, err, time.Since(start)}
			}()
		}
	}
	idemtest.Eventually(t, 30*time.Second, "begins waiting, their watches in force", func() bool {
		return e.metricValue(t, "idemsvc_waiters") == float64(len(keys)*failoverWaiters) &&
			e.metricValue(t, "idemsvc_wait_polls_total") >= float64(len(keys))
	})

	failover()

	for i, key := range keys {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := store.Complete(t.Context(), handlers.DefaultTenant, statemachine.CompleteRequest{
				Key: key, Token: tokens[i], Response: statemachine.Response{Body: "after the failover"}})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("complete %s after the failover: %v", key, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	completed := time.Now()
	for range len(keys) * failoverWaiters {
		select {
		case w := <-answers:
			must(t, w.err)
			requireJSON(t, w.r.HTTPResponse, w.r.Body, http.StatusOK)
			if w.r.JSON200.Status != idem.FinishedStateCompleted || *w.r.JSON200.Response.Body != "after the failover" {
				t.Fatalf("waiter's answer: %s", w.r.Body)
			}
		case <-time.After(10*time.Second - time.Since(completed)):
			t.Fatalf("a waiter did not answer within 10s of the completions after the failover")
		}
	}
	t.Logf("every waiter answered within %v of the completions", time.Since(completed).Round(time.Millisecond))
}
