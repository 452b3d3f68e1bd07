// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

// A begin that acquired the key but whose reply was lost is retried with
// the same owner and gets the same lease: the caller does not lock itself
// out for the lease's 30 s.
func TestDoBeginReplyLost(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c, lossy := lossyClient(t, svc.URL)
	lossy.drop["/v1/begin"] = 1
	ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second) // well under the lease
	defer cancel()

	var runs atomic.Int32
	res, err := c.Do(ctx, "begin-lost", idem.DoOptions{}, constant(&runs, idem.Response{Body: []byte("charged")}))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if runs.Load() != 1 || res.Replayed || res.Attempt != 1 || string(res.Response.Body) != "charged" {
		t.Errorf("Do = %+v after %d runs; want fn run once as attempt 1", res, runs.Load())
	}
	if n := lossy.sent.get("/v1/begin"); n != 2 {
		t.Errorf("idemsvc got %d begins, want 2 (the lost one and its retry)", n)
	}
	st, err := c.Status(ctx, "begin-lost", false)
	if err != nil || st.State != idem.StateCompleted || st.Attempt != 1 {
		t.Errorf("status = %+v, %v; want attempt 1 completed", st, err)
	}
}

// Begin's own retry returns the same lease, not a new one.
func TestBeginRetryGetsTheSameLease(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c, lossy := lossyClient(t, svc.URL)
	lossy.drop["/v1/begin"] = 2
	ctx := testContext(t)

	res, err := c.Begin(ctx, idem.BeginParams{Key: "k", Owner: "req-1"})
	if err != nil || res.Lease == nil {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	// The same owner, again: the same lease.
	again, err := c.Begin(ctx, idem.BeginParams{Key: "k", Owner: "req-1"})
	if err != nil || again.Lease == nil || again.Lease.LeaseToken != res.Lease.LeaseToken || again.Lease.Attempt != 1 {
		t.Errorf("Begin by the same owner = %+v, %v; want lease %+v", again.Lease, err, res.Lease)
	}
	// Another owner: in progress.
	_, err = c.Begin(ctx, idem.BeginParams{Key: "k", Owner: "req-2"})
	var e *idem.Error
	if !errors.Is(err, idem.ErrInProgress) || !errors.As(err, &e) || e.StatusCode != http.StatusConflict ||
		e.RetryAfter < time.Second || e.Problem.Attempt == nil || *e.Problem.Attempt != 1 || e.Problem.LeaseExpiresAt == nil {
		t.Errorf("Begin by another owner = %v (%+v), want a 409 *Error with Retry-After, attempt and lease expiry", err, e)
	}
	if n := lossy.sent.get("/v1/begin"); n != 5 {
		t.Errorf("idemsvc got %d begins, want 5", n)
	}
}

// A complete that stored the response but whose reply was lost is retried
// with the same token, which idemsvc accepts again.
func TestDoCompleteReplyLost(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c, lossy := lossyClient(t, svc.URL)
	lossy.drop["/v1/complete"] = 1
	ctx := testContext(t)
	want := idem.Response{StatusCode: 201, Headers: map[string]string{"Location": "/charges/ch_1"}, Body: []byte(`{"id":"ch_1"}`)}

	var runs atomic.Int32
	res, err := c.Do(ctx, "complete-lost", idem.DoOptions{}, constant(&runs, want))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if runs.Load() != 1 || res.Replayed || string(res.Response.Body) != `{"id":"ch_1"}` {
		t.Errorf("Do = %+v after %d runs; want fn's response", res, runs.Load())
	}
	if n := lossy.sent.get("/v1/complete"); n != 2 {
		t.Errorf("idemsvc got %d completes, want 2 (the lost one and its retry)", n)
	}

	st, err := c.Status(ctx, "complete-lost", true)
	if err != nil || st.State != idem.StateCompleted || st.Attempt != 1 || st.Response == nil {
		t.Fatalf("status = %+v, %v; want attempt 1 completed with its response", st, err)
	}
	stored, err := st.Response.Decode()
	if err != nil || stored.StatusCode != 201 || string(stored.Body) != `{"id":"ch_1"}` || stored.Headers["Location"] != "/charges/ch_1" {
		t.Errorf("stored = %+v, %v; want fn's response", stored, err)
	}
	res, err = c.Do(ctx, "complete-lost", idem.DoOptions{}, constant(&runs, idem.Response{}))
	if err != nil || !res.Replayed || runs.Load() != 1 || string(res.Response.Body) != `{"id":"ch_1"}` {
		t.Errorf("next Do = %+v, %v; want fn's response replayed", res, err)
	}
}

// A fail whose reply was lost is retried with the same token: a terminal
// failure is stored once and replayed.
func TestDoFailReplyLost(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c, lossy := lossyClient(t, svc.URL)
	lossy.drop["/v1/fail"] = 1
	ctx := testContext(t)

	_, err := c.Do(ctx, "fail-lost", idem.DoOptions{}, func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 409}, idem.Terminal(errors.New("duplicate order"))
	})
	if !errors.Is(err, idem.ErrFailed) || errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("Do = %v, want ErrFailed with the failure stored", err)
	}
	if n := lossy.sent.get("/v1/fail"); n != 2 {
		t.Errorf("idemsvc got %d fails, want 2", n)
	}
	res, err := c.Do(ctx, "fail-lost", idem.DoOptions{}, func(context.Context) (idem.Response, error) {
		t.Error("fn ran after a terminal failure")
		return idem.Response{}, nil
	})
	if !errors.Is(err, idem.ErrFailed) || !res.Replayed || res.Error != "duplicate order" || res.Response.StatusCode != 409 {
		t.Errorf("next Do = %+v, %v; want the failure replayed", res, err)
	}
}

// flakyProxy stands in front of idemsvc: it answers the first n requests
// itself with a 503 problem (with Retry-After when retryAfter is not
// empty), then passes requests on.
type flakyProxy struct {
	URL        string
	n          int
	retryAfter string

	mu       sync.Mutex
	requests int
	last503  time.Time     // when the last 503 was sent
	gaps     time.Duration // the shortest time between a 503 and the next request
}

func startFlakyProxy(t *testing.T, target string, n int, retryAfter string) *flakyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{n: n, retryAfter: retryAfter, gaps: time.Hour}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests++
		if !p.last503.IsZero() {
			p.gaps = min(p.gaps, time.Since(p.last503))
		}
		unavailable := p.requests <= p.n || p.n < 0
		if unavailable {
			p.last503 = time.Now()
		}
		p.mu.Unlock()
		if !unavailable {
			rp.ServeHTTP(w, r)
			return
		}
		if p.retryAfter != "" {
			w.Header().Set("Retry-After", p.retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(idem.Problem{Type: "https://idemsvc.dev/problems/store-unavailable",
			Title: "Service Unavailable", Status: 503, Detail: "the store cannot be reached"})
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *flakyProxy) stats() (requests int, shortestGap time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, p.gaps
}

// A 503 with Retry-After is retried, no sooner than Retry-After says.
func TestRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	proxy := startFlakyProxy(t, svc.URL, 1, "1")
	c := newClient(t, proxy.URL)
	ctx := testContext(t)

	res, err := c.Begin(ctx, idem.BeginParams{Key: "after-503"})
	if err != nil || res.Lease == nil {
		t.Fatalf("Begin = %+v, %v; want the retry to acquire", res, err)
	}
	requests, gap := proxy.stats()
	if requests != 2 {
		t.Errorf("the proxy got %d requests, want 2", requests)
	}
	if gap < time.Second {
		t.Errorf("retried %v after a 503 with Retry-After: 1", gap)
	}
}

// Without Retry-After, 503s are retried with backoff until the retry budget
// is spent; then the last answer is returned.
func TestRetryBudgetBoundsRetries(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	proxy := startFlakyProxy(t, svc.URL, -1, "")
	c := newClient(t, proxy.URL, idem.WithRetryBudget(300*time.Millisecond))
	ctx := testContext(t)

	errc := make(chan error, 1)
	go func() {
		_, err := c.Begin(ctx, idem.BeginParams{Key: "always-503"})
		errc <- err
	}()
	var err error
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second): // the default budget is 15 s
		t.Fatal("Begin still retrying after 5 s with a 300 ms budget")
	}
	var e *idem.Error
	if !errors.Is(err, idem.ErrUnavailable) || !errors.As(err, &e) || e.StatusCode != 503 || e.Kind() != "store-unavailable" {
		t.Errorf("Begin = %v, want the 503 *Error matching ErrUnavailable", err)
	}
	if requests, _ := proxy.stats(); requests < 2 {
		t.Errorf("the proxy got %d requests, want retries", requests)
	}
	if n := svc.calls.get("/v1/begin"); n != 0 {
		t.Errorf("idemsvc got %d begins through a proxy that answered every one", n)
	}
}

// A Retry-After longer than what is left of the budget is not waited for.
func TestRetryAfterBeyondBudgetGivesUp(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	proxy := startFlakyProxy(t, svc.URL, -1, "30")
	c := newClient(t, proxy.URL, idem.WithRetryBudget(time.Second))
	ctx := testContext(t)

	_, err := c.Complete(ctx, "k", "00000000000000000000000000000000", idem.Response{}, 0)
	var e *idem.Error
	if !errors.Is(err, idem.ErrUnavailable) || !errors.As(err, &e) || e.RetryAfter != 30*time.Second {
		t.Errorf("Complete = %v, want a 503 *Error with RetryAfter 30 s", err)
	}
	if requests, _ := proxy.stats(); requests != 1 {
		t.Errorf("the proxy got %d requests, want 1", requests)
	}
}

// A zero budget turns retries off.
func TestRetryBudgetZeroDoesNotRetry(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	proxy := startFlakyProxy(t, svc.URL, 1, "")
	c := newClient(t, proxy.URL, idem.WithRetryBudget(0))
	ctx := testContext(t)

	if _, err := c.Status(ctx, "k", false); !errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("Status = %v, want ErrUnavailable", err)
	}
	if requests, _ := proxy.stats(); requests != 1 {
		t.Errorf("the proxy got %d requests, want 1", requests)
	}
}

// Answers other than 503 are final: a 409 is not retried.
func TestNoRetryOfA4xx(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	if _, err := c.Begin(ctx, idem.BeginParams{Key: "busy"}); err != nil {
		t.Fatal(err)
	}
	before := svc.calls.get("/v1/begin")
	_, err := c.Begin(ctx, idem.BeginParams{Key: "busy"})
	if !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("Begin = %v, want ErrInProgress", err)
	}
	_, err = c.Begin(ctx, idem.BeginParams{Key: "bad key"})
	var e *idem.Error
	if !errors.Is(err, idem.ErrInvalid) || !errors.As(err, &e) || e.StatusCode != 400 {
		t.Errorf("Begin of a key with a space = %v, want a 400 matching ErrInvalid", err)
	}
	if n := svc.calls.get("/v1/begin") - before; n != 2 {
		t.Errorf("idemsvc got %d begins for 2 calls answered 4xx", n)
	}
}

// An idemsvc that cannot be reached gives ErrUnavailable once the budget
// is spent.
func TestUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	c := newClient(t, srv.URL, idem.WithRetryBudget(200*time.Millisecond))
	ctx := testContext(t)

	_, err := c.Begin(ctx, idem.BeginParams{Key: "k"})
	var e *idem.Error
	if !errors.Is(err, idem.ErrUnavailable) || errors.As(err, &e) {
		t.Errorf("Begin = %v, want ErrUnavailable without an answer of idemsvc", err)
	}
	var runs atomic.Int32
	if _, err := c.Do(ctx, "k", idem.DoOptions{}, constant(&runs, idem.Response{})); !errors.Is(err, idem.ErrUnavailable) || runs.Load() != 0 {
		t.Errorf("Do = %v after %d runs; want ErrUnavailable, fn not run", err, runs.Load())
	}
}

// A request that hangs is abandoned after the call timeout and retried.
func TestCallTimeoutRetriesAHungRequest(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	u, _ := url.Parse(svc.URL)
	rp := httputil.NewSingleHostReverseProxy(u)
	var requests atomic.Int32
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			<-r.Context().Done() // until the client gives up
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hang.Close)
	c := newClient(t, hang.URL, idem.WithCallTimeout(200*time.Millisecond))
	ctx := testContext(t)

	if _, err := c.Status(ctx, "absent", false); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Status = %v, want the retry's ErrNotFound", err)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

// A canceled context stops the retries and is what the call returns.
func TestRetryStopsWithTheContext(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	proxy := startFlakyProxy(t, svc.URL, -1, "1")
	c := newClient(t, proxy.URL)
	ctx, cancel := context.WithTimeout(testContext(t), 300*time.Millisecond)
	defer cancel()
	if err := c.Delete(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Delete = %v, want the context's deadline", err)
	}
}

// WithAPIKey authenticates; WithTenant lets an admin key act for a tenant.
func TestAPIKeyAndTenant(t *testing.T) {
	t.Parallel()
	keyring := idemtest.Keyring(t, idemtest.Tenant{Name: "payments", Key: "payments-secret"},
		idemtest.Tenant{Name: "ops", Key: "ops-secret", Admin: true})
	svc := startIdemsvc(t, keyring)
	ctx := testContext(t)

	anonymous := newClient(t, svc.URL)
	var e *idem.Error
	if _, err := anonymous.Begin(ctx, idem.BeginParams{Key: "k"}); !errors.Is(err, idem.ErrUnauthorized) || !errors.As(err, &e) || e.StatusCode != 401 {
		t.Errorf("Begin without a key = %v, want 401 ErrUnauthorized", err)
	}
	wrong := newClient(t, svc.URL, idem.WithAPIKey("not-a-key"))
	if _, err := wrong.Begin(ctx, idem.BeginParams{Key: "k"}); !errors.Is(err, idem.ErrUnauthorized) {
		t.Errorf("Begin with a wrong key = %v, want ErrUnauthorized", err)
	}

	payments := newClient(t, svc.URL, idem.WithAPIKey("payments-secret"))
	var runs atomic.Int32
	if _, err := payments.Do(ctx, "order-9", idem.DoOptions{}, constant(&runs, idem.Response{Body: []byte("paid")})); err != nil {
		t.Fatalf("Do with the tenant's key: %v", err)
	}

	opsOwn := newClient(t, svc.URL, idem.WithAPIKey("ops-secret"))
	if _, err := opsOwn.Status(ctx, "order-9", false); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Status in the admin's own tenant = %v, want ErrNotFound", err)
	}
	opsForPayments := newClient(t, svc.URL, idem.WithAPIKey("ops-secret"), idem.WithTenant("payments"))
	st, err := opsForPayments.Status(ctx, "order-9", false)
	if err != nil || st.Tenant != "payments" || st.State != idem.StateCompleted {
		t.Errorf("Status for payments by the admin = %+v, %v; want the completed record", st, err)
	}
	res, err := opsForPayments.Do(ctx, "order-9", idem.DoOptions{}, constant(&runs, idem.Response{}))
	if err != nil || !res.Replayed || string(res.Response.Body) != "paid" || runs.Load() != 1 {
		t.Errorf("Do for payments by the admin = %+v, %v; want the replay", res, err)
	}

	paymentsForOps := newClient(t, svc.URL, idem.WithAPIKey("payments-secret"), idem.WithTenant("ops"))
	if _, err := paymentsForOps.Status(ctx, "order-9", false); !errors.Is(err, idem.ErrForbidden) {
		t.Errorf("Status for another tenant by a tenant key = %v, want ErrForbidden", err)
	}
}

// An error says "idem:" once, however many layers it went through, and
// still matches its kind.
func TestErrorsArePrefixedOnce(t *testing.T) {
	t.Parallel()
	down := newClient(t, "http://127.0.0.1:1", idem.WithRetryBudget(0))
	_, err := down.Do(testContext(t), "order-1", idem.DoOptions{}, func(context.Context) (idem.Response, error) {
		t.Error("fn ran without idemsvc")
		return idem.Response{}, nil
	})
	if !errors.Is(err, idem.ErrUnavailable) || strings.Count(err.Error(), "idem:") != 1 ||
		!strings.HasPrefix(err.Error(), `idem: do "order-1": begin: unavailable: `) {
		t.Errorf("Do without idemsvc: %v", err)
	}

	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	_, err = c.Complete(testContext(t), "nothing-here", "0123456789abcdef0123456789abcdef", idem.Response{}, 0)
	if !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrNotFound) || strings.Count(err.Error(), "idem:") != 1 {
		t.Errorf("complete of a key never begun: %v", err)
	}
}
