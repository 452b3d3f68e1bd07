// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
)

// waited is the answer of a begin that waited.
type waited struct {
	r       *idem.BeginResponse
	err     error
	elapsed time.Duration
}

// startWaiters sends n begins of req (which carries wait_ms) in the
// background, and returns once the service counts them all as waiting.
func startWaiters(t *testing.T, e *env, req idem.BeginRequest, n int) <-chan waited {
	t.Helper()
	c := e.client(t, "")
	out := make(chan waited, n)
	for range n {
		go func() {
			start := time.Now()
			r, err := c.BeginWithResponse(bg, req)
			out <- waited{r, err, time.Since(start)}
		}()
	}
	idemtest.Eventually(t, 10*time.Second, "begins waiting", func() bool {
		return e.metricValue(t, "idemsvc_waiters") == float64(n)
	})
	return out
}

// receive takes one answer of a waiter, failing the test after 15s.
func receive(t *testing.T, answers <-chan waited) *idem.BeginResponse {
	t.Helper()
	select {
	case w := <-answers:
		if w.err != nil {
			t.Fatalf("waiting begin: %v", w.err)
		}
		return w.r
	case <-time.After(15 * time.Second):
		t.Fatalf("a waiting begin did not answer")
	}
	return nil
}

// A begin with wait_ms on a key in progress waits for the attempt to end
// and answers as a begin would then.
func TestE2EWait(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		t.Run("waiters get the completed response", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("holder")})
			answers := startWaiters(t, e, idem.BeginRequest{Key: key, WaitMs: ptr[int64](10000)}, 5)
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{
				StatusCode: ptr(201), Headers: map[string]string{"Location": "/charges/1"}, Body: ptr("charged")}})
			for range 5 {
				r := receive(t, answers)
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				rp := r.JSON200
				if rp.Status != idem.FinishedStateCompleted || rp.Attempt != 1 || *rp.Response.Body != "charged" ||
					*rp.Response.StatusCode != 201 || rp.Response.Headers["Location"] != "/charges/1" {
					t.Fatalf("waiter's answer: %s", r.Body)
				}
			}
		})

		t.Run("after a retryable failure one waiter acquires, the others get its response", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			answers := startWaiters(t, e, idem.BeginRequest{Key: key, WaitMs: ptr[int64](10000)}, 3)
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(true)})

			r := receive(t, answers)
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusCreated)
			if r.JSON201.Attempt != 2 || r.JSON201.Recovered {
				t.Fatalf("the waiter that acquired: %s", r.Body)
			}
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: r.JSON201.LeaseToken, Response: &idem.StoredResponse{Body: ptr("second try")}})
			for range 2 {
				r := receive(t, answers)
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				if r.JSON200.Attempt != 2 || *r.JSON200.Response.Body != "second try" {
					t.Fatalf("a later waiter: %s", r.Body)
				}
			}
		})

		t.Run("a waiter gets a terminal failure", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			answers := startWaiters(t, e, idem.BeginRequest{Key: key, WaitMs: ptr[int64](10000)}, 1)
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false), Error: ptr("card declined")})
			r := receive(t, answers)
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			if r.JSON200.Status != idem.FinishedStateFailed || *r.JSON200.Error != "card declined" {
				t.Fatalf("waiter's answer: %s", r.Body)
			}
		})

		t.Run("a waiter takes over a lease that runs out", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](300)})
			w := e.client(t, "")
			r, err := w.BeginWithResponse(bg, idem.BeginRequest{Key: key, WaitMs: ptr[int64](10000)})
			must(t, err)
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusCreated)
			if !r.JSON201.Recovered || r.JSON201.Attempt != 2 || r.JSON201.LeaseToken == l.LeaseToken {
				t.Fatalf("waiter after the lease ran out: %s", r.Body)
			}
		})

		t.Run("a waiter whose wait ends gets 409", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](30000)})
			before := c.snapshot(key)
			start := time.Now()
			r := c.begin(idem.BeginRequest{Key: key, WaitMs: ptr[int64](300)})
			elapsed := time.Since(start)
			p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
			requireRetryAfter(t, r.HTTPResponse, 1, 30)
			if *p.Attempt != 1 || !sameTime(*p.LeaseExpiresAt, l.LeaseExpiresAt) {
				t.Fatalf("409 after waiting: %s", r.Body)
			}
			// It did wait: the 409 is the end of the wait, not the first look.
			if elapsed < 300*time.Millisecond {
				t.Fatalf("answered after %s, before its wait_ms of 300ms ended", elapsed)
			}
			if after := c.snapshot(key); after != before {
				t.Fatalf("waiting changed the record:\n%s\n%s", before, after)
			}
		})

		t.Run("a waiter learns of a completion on another replica by a push", func(t *testing.T) {
			t.Parallel()
			// The fallback read comes after a minute: an answer sooner came
			// by the push. Each replica has a store of its own.
			a := start(t, handlers.Config{Store: b.Open(t), WaitFallbackInterval: time.Minute})
			other := startOn(t, b.Open(t)).as(t, "")
			key := idemtest.Unique("order")
			l := other.acquire(idem.BeginRequest{Key: key})
			answers := startWaiters(t, a, idem.BeginRequest{Key: key, WaitMs: ptr[int64](30000)}, 3)
			other.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("done")}})
			for range 3 {
				select {
				case w := <-answers:
					must(t, w.err)
					requireJSON(t, w.r.HTTPResponse, w.r.Body, http.StatusOK)
					if *w.r.JSON200.Response.Body != "done" {
						t.Fatalf("waiter's answer: %s", w.r.Body)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("a waiter did not answer within 5s of the completion on another replica")
				}
			}
			// One read when the watch came into force, shared by the three.
			if polls := a.metricValue(t, "idemsvc_wait_polls_total"); polls > 1 {
				t.Fatalf("the waiters' replica read the key %v times, want at most 1", polls)
			}
		})

		t.Run("deleting the key wakes its waiters, who acquire it", func(t *testing.T) {
			t.Parallel()
			e := start(t, handlers.Config{Store: b.Open(t), WaitFallbackInterval: time.Minute})
			c := e.as(t, "")
			key := idemtest.Unique("order")
			c.acquire(idem.BeginRequest{Key: key})
			answers := startWaiters(t, e, idem.BeginRequest{Key: key, WaitMs: ptr[int64](30000)}, 1)
			c.del(idem.DeleteKeyParams{Key: key})
			select {
			case w := <-answers:
				must(t, w.err)
				requireJSON(t, w.r.HTTPResponse, w.r.Body, http.StatusCreated)
				if w.r.JSON201.Attempt != 1 {
					t.Fatalf("the waiter after the delete: %s", w.r.Body)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the waiter did not answer within 5s of the delete")
			}
		})

		t.Run("StopWaiting answers the waiters now", func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c := e.as(t, "")
			key := idemtest.Unique("order")
			c.acquire(idem.BeginRequest{Key: key})
			answers := startWaiters(t, e, idem.BeginRequest{Key: key, WaitMs: ptr[int64](30000)}, 2)
			e.svc.StopWaiting()
			for range 2 {
				r := receive(t, answers)
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
			}
			// Later begins do not wait either: this one answers well before
			// its wait_ms would end.
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			r, err := c.c.BeginWithResponse(ctx, idem.BeginRequest{Key: key, WaitMs: ptr[int64](30000)})
			must(t, err)
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
		})
	})
}
