// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
)

// startLimited serves an idemsvc whose tenant "limited" (API key
// "sk-limited") has limits.
func startLimited(t *testing.T, limits string) string {
	t.Helper()
	k := idemtest.Keyring(t, idemtest.Tenant{Name: "limited", Key: "sk-limited", Limits: limits})
	limiter := quota.NewMemory(quota.Options{FlushInterval: 50 * time.Millisecond})
	t.Cleanup(limiter.Close)
	return idemtest.Serve(t, handlers.Config{Keyring: k, Limiter: limiter}).URL
}

// A begin over the tenant's rate is retried after Retry-After within the
// retry budget, and beyond it returns ErrRateLimited.
func TestRateLimitedIsRetried(t *testing.T) {
	t.Parallel()
	url := startLimited(t, "{begins_per_s: 1, burst: 1}")
	ctx := testContext(t)
	c := newClient(t, url, idem.WithAPIKey("sk-limited"))
	if _, err := c.Begin(ctx, idem.BeginParams{Key: "a"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := c.Begin(ctx, idem.BeginParams{Key: "b"})
	if err != nil || res.Lease == nil {
		t.Fatalf("Begin over the rate = %+v, %v; want a lease after a retry", res, err)
	}
	if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Errorf("retried after %v, sooner than Retry-After: 1", waited)
	}

	short := newClient(t, url, idem.WithAPIKey("sk-limited"), idem.WithRetryBudget(500*time.Millisecond))
	_, err = short.Begin(ctx, idem.BeginParams{Key: "c"})
	var e *idem.Error
	if !errors.Is(err, idem.ErrRateLimited) || !errors.As(err, &e) || e.StatusCode != http.StatusTooManyRequests ||
		e.RetryAfter != time.Second || errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("Begin with a short budget = %v, want a 429 *Error matching ErrRateLimited with RetryAfter 1 s", err)
	}
}

// Over its stored-bytes budget a tenant gets ErrQuotaExceeded for a new
// key at once (its Retry-After is beyond the budget), while finished keys
// still replay.
func TestQuotaExceeded(t *testing.T) {
	t.Parallel()
	url := startLimited(t, "{stored_bytes: 10}")
	ctx := testContext(t)
	c := newClient(t, url, idem.WithAPIKey("sk-limited"))
	res, err := c.Begin(ctx, idem.BeginParams{Key: "done"})
	if err != nil || res.Lease == nil {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if _, err := c.Complete(ctx, "done", res.Lease.LeaseToken, idem.Response{Body: []byte("twenty bytes of body")}, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Begin(ctx, idem.BeginParams{Key: "new"})
	var e *idem.Error
	if !errors.Is(err, idem.ErrQuotaExceeded) || !errors.As(err, &e) || e.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("Begin of a new key = %v, want a 429 matching ErrQuotaExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v, want at once", d)
	}
	replay, err := c.Begin(ctx, idem.BeginParams{Key: "done"})
	if err != nil || replay.Replay == nil {
		t.Fatalf("replay over budget = %+v, %v", replay, err)
	}
}

// Behind the middleware, a begin idemsvc refuses for a limit answers 429
// with its kind and Retry-After, and the handler does not run.
func TestMiddlewareOverLimits(t *testing.T) {
	t.Parallel()
	url := startLimited(t, "{begins_per_s: 1, burst: 1}")
	c := newClient(t, url, idem.WithAPIKey("sk-limited"), idem.WithRetryBudget(100*time.Millisecond))
	var runs atomic.Int32
	app := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
	})
	if a := send(t, http.MethodPost, app+"/orders", "order-1", []byte("{}")); a.status != http.StatusOK {
		t.Fatalf("first request = %d %s", a.status, a.body)
	}
	a := send(t, http.MethodPost, app+"/orders", "order-2", []byte("{}"))
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "1" || problemKind(a) != "rate-limited" {
		t.Errorf("over the rate = %d %v %s; want 429 rate-limited with Retry-After 1", a.status, a.header, a.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}
