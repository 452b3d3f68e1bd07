// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// Twenty callers of one key at once: fn runs once, and every caller gets
// its result, all but one replayed.
func TestDoConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)

	const callers = 20
	var runs atomic.Int32
	fn := func(context.Context) (idem.Response, error) {
		n := runs.Add(1)
		// Hold the attempt until every caller has sent its begin, so that
		// they all meet it in progress.
		if !idemtest.Poll(5*time.Second, func() bool { return svc.calls.get("/v1/begin") >= callers }) {
			t.Error("not every caller sent its begin while fn ran")
		}
		return idem.Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"},
			Body: fmt.Appendf(nil, `{"charge":"ch_%d"}`, n)}, nil
	}

	results := make([]idem.Result, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = c.Do(ctx, "order-1/charge", idem.DoOptions{}, fn)
		})
	}
	close(start)
	wg.Wait()

	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want once", n)
	}
	fresh := 0
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !res.Replayed {
			fresh++
		}
		if res.Response.StatusCode != 201 || string(res.Response.Body) != `{"charge":"ch_1"}` ||
			res.Response.Headers["Content-Type"] != "application/json" || res.Failed || res.Attempt != 1 {
			t.Errorf("caller %d got %+v, want fn's response of attempt 1", i, res)
		}
	}
	if fresh != 1 {
		t.Errorf("%d callers got a result that was not replayed, want 1 (the one that ran fn)", fresh)
	}
}

// A fn running for four times its lease keeps the lease through extends:
// nobody else acquires the key meanwhile, and fn's result is stored.
func TestDoExtendsTheLeaseOfALongOperation(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	other := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "long-report"
	const lease = 300 * time.Millisecond

	var runs atomic.Int32
	var duplicate sync.WaitGroup
	var dupResult idem.Result
	var dupErr error
	res, err := c.Do(ctx, key, idem.DoOptions{Lease: lease}, func(fnCtx context.Context) (idem.Response, error) {
		runs.Add(1)
		// A duplicate Do that waits for this attempt's outcome.
		duplicate.Go(func() {
			dupResult, dupErr = other.Do(ctx, key, idem.DoOptions{Lease: lease, Wait: 200 * time.Millisecond},
				func(context.Context) (idem.Response, error) {
					runs.Add(1)
					return idem.Response{Body: []byte("the duplicate ran")}, nil
				})
		})
		// 1.2 s of work, probing every 100 ms that nobody else gets the key.
		for i := range 12 {
			time.Sleep(100 * time.Millisecond)
			if err := fnCtx.Err(); err != nil {
				return idem.Response{}, fmt.Errorf("after %d00 ms: %w", i+1, context.Cause(fnCtx))
			}
			_, err := other.Begin(ctx, idem.BeginParams{Key: key, Lease: lease})
			if !errors.Is(err, idem.ErrInProgress) {
				t.Errorf("after %d00 ms another caller's begin answered %v, want ErrInProgress", i+1, err)
			}
			st, err := other.Status(ctx, key, false)
			if err != nil || st.State != idem.StateInProgress || st.Attempt != 1 ||
				st.LeaseExpired == nil || *st.LeaseExpired {
				t.Errorf("after %d00 ms status is %+v, %v; want attempt 1 in progress with a live lease", i+1, st, err)
			}
		}
		return idem.Response{StatusCode: 200, Body: []byte("report ready")}, nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if res.Replayed || res.Attempt != 1 || string(res.Response.Body) != "report ready" {
		t.Errorf("Do = %+v, want fn's response of attempt 1", res)
	}

	duplicate.Wait()
	if dupErr != nil || !dupResult.Replayed || string(dupResult.Response.Body) != "report ready" {
		t.Errorf("the duplicate Do = %+v, %v; want the replayed report", dupResult, dupErr)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want once", n)
	}

	st, err := c.Status(ctx, key, true)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.State != idem.StateCompleted || st.Attempt != 1 || st.Response == nil {
		t.Fatalf("status = %+v, want attempt 1 completed with its response", st)
	}
	stored, err := st.Response.Decode()
	if err != nil || stored.StatusCode != 200 || string(stored.Body) != "report ready" {
		t.Errorf("stored response = %+v, %v; want fn's", stored, err)
	}
}

// When the caller's context ends while fn goes on running, the lease is
// still extended until fn returns: a duplicate waits and gets fn's
// outcome instead of running it alongside.
func TestDoKeepsTheLeaseAfterTheCallerGivesUp(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	const key = "caller-gives-up"
	const lease = 300 * time.Millisecond
	ctx, giveUp := context.WithCancel(testContext(t))
	var runs atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, key, idem.DoOptions{Lease: lease}, func(fnCtx context.Context) (idem.Response, error) {
			runs.Add(1)
			giveUp()
			<-fnCtx.Done()        // fn sees it,
			time.Sleep(3 * lease) // but goes on past the lease
			return idem.Response{Body: []byte("done once")}, nil
		})
		done <- err
	}()
	idemtest.Eventually(t, 5*time.Second, "fn running", func() bool { return runs.Load() == 1 })
	time.Sleep(2 * lease)
	res, err := newClient(t, svc.URL).Do(testContext(t), key, idem.DoOptions{Lease: lease, Wait: 2 * time.Second},
		func(context.Context) (idem.Response, error) {
			runs.Add(1)
			return idem.Response{Body: []byte("ran twice")}, nil
		})
	if err != nil || !res.Replayed || string(res.Response.Body) != "done once" || runs.Load() != 1 {
		t.Errorf("the duplicate got %+v, %v after %d runs; want the replay of the one run", res, err, runs.Load())
	}
	if err := <-done; err != nil {
		t.Errorf("the first Do: %v", err)
	}
}

// Deleting the key under a running fn cancels fn's context with
// ErrLeaseLost as its cause.
func TestDoCancelsFnWhenTheKeyIsDeleted(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "deleted-under-fn"

	running := make(chan struct{})
	var cause error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := c.Do(ctx, key, idem.DoOptions{Lease: 300 * time.Millisecond}, func(fnCtx context.Context) (idem.Response, error) {
			close(running)
			select {
			case <-fnCtx.Done():
				cause = context.Cause(fnCtx)
				return idem.Response{}, cause
			case <-time.After(5 * time.Second):
				return idem.Response{}, errors.New("fn's context was not cancelled")
			}
		})
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Do = %v, want an error matching ErrLeaseLost", err)
		}
	}()

	recv(t, running, "fn to run")
	if err := c.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	recv(t, done, "Do to return")
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("context.Cause(fnCtx) = %v, want ErrLeaseLost", cause)
	}
	// The failed attempt did not bring the record back.
	if _, err := c.Status(ctx, key, false); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Status after the delete = %v, want ErrNotFound", err)
	}
}

// A holder that cannot extend its lease learns it lost the lease when it
// runs out; another caller then takes over, and the old holder's complete
// is fenced off.
func TestDoLeaseRunsOutAndIsTakenOver(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c, lossy := lossyClient(t, svc.URL)
	lossy.refuse["/v1/extend"] = true // every heartbeat fails
	other := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "taken-over"

	var cause error
	var takeover idem.BeginResult
	_, err := c.Do(ctx, key, idem.DoOptions{Lease: 300 * time.Millisecond}, func(fnCtx context.Context) (idem.Response, error) {
		select {
		case <-fnCtx.Done():
			cause = context.Cause(fnCtx)
		case <-time.After(5 * time.Second):
			return idem.Response{}, errors.New("fn's context was not cancelled")
		}
		var err error
		takeover, err = other.Begin(ctx, idem.BeginParams{Key: key})
		if err != nil {
			t.Errorf("another caller's begin after the lease ran out: %v", err)
		}
		// A holder that ignores the cancellation still cannot complete.
		return idem.Response{Body: []byte("stale")}, nil
	})
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("context.Cause(fnCtx) = %v, want ErrLeaseLost", cause)
	}
	if takeover.Lease == nil || !takeover.Lease.Recovered || takeover.Lease.Attempt != 2 {
		t.Errorf("the takeover's begin = %+v, want attempt 2 acquired, recovered", takeover.Lease)
	}
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Do = %v, want the stale complete to fail with ErrLeaseLost", err)
	}
	st, err := other.Status(ctx, key, false)
	if err != nil || st.State != idem.StateInProgress || st.Attempt != 2 {
		t.Errorf("status = %+v, %v; want attempt 2 still in progress", st, err)
	}
}

// A terminal failure is stored and replayed without running fn again.
func TestDoReplaysATerminalFailure(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "declined"
	declined := errors.New("card declined")
	want := idem.Response{StatusCode: 402, Body: []byte(`{"error":"card declined"}`)}

	var runs atomic.Int32
	res, err := c.Do(ctx, key, idem.DoOptions{}, func(context.Context) (idem.Response, error) {
		runs.Add(1)
		return want, idem.Terminal(declined)
	})
	if !errors.Is(err, idem.ErrFailed) || !errors.Is(err, declined) {
		t.Errorf("Do = %v, want an error matching ErrFailed and fn's error", err)
	}
	if !res.Failed || res.Replayed || res.Error != "card declined" || res.Attempt != 1 {
		t.Errorf("Do = %+v, want a fresh terminal failure of attempt 1", res)
	}

	for range 2 {
		res, err = c.Do(ctx, key, idem.DoOptions{}, func(context.Context) (idem.Response, error) {
			runs.Add(1)
			return idem.Response{}, nil
		})
		if !errors.Is(err, idem.ErrFailed) {
			t.Errorf("replayed Do = %v, want ErrFailed", err)
		}
		if !res.Failed || !res.Replayed || res.Error != "card declined" || res.Attempt != 1 ||
			res.Response.StatusCode != want.StatusCode || !bytes.Equal(res.Response.Body, want.Body) {
			t.Errorf("replayed Do = %+v, want the stored failure and its response", res)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want once", n)
	}
	st, err := c.Status(ctx, key, false)
	if err != nil || st.State != idem.StateFailed || st.Retryable == nil || *st.Retryable {
		t.Errorf("status = %+v, %v; want a terminal failure", st, err)
	}
}

// A retryable failure releases the key: the next Do runs fn again.
func TestDoRetryableFailureRunsFnAgain(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "flaky"
	timeout := errors.New("upstream timed out")

	res, err := c.Do(ctx, key, idem.DoOptions{}, func(context.Context) (idem.Response, error) {
		return idem.Response{}, timeout
	})
	if !errors.Is(err, timeout) || errors.Is(err, idem.ErrFailed) {
		t.Errorf("Do = %v, want fn's error, not ErrFailed", err)
	}
	if res.Failed || res.Replayed {
		t.Errorf("Do = %+v, want neither failed terminally nor replayed", res)
	}
	st, err := c.Status(ctx, key, false)
	if err != nil || st.State != idem.StateFailed || st.Retryable == nil || !*st.Retryable ||
		st.Error == nil || *st.Error != timeout.Error() {
		t.Errorf("status = %+v, %v; want a retryable failure with fn's message", st, err)
	}

	var runs atomic.Int32
	res, err = c.Do(ctx, key, idem.DoOptions{}, constant(&runs, idem.Response{Body: []byte("ok")}))
	if err != nil || runs.Load() != 1 || res.Replayed || res.Attempt != 2 || string(res.Response.Body) != "ok" {
		t.Errorf("second Do = %+v, %v after %d runs; want fn run again as attempt 2", res, err, runs.Load())
	}
}

// An error message over idemsvc's limit of 1 KiB still fails the attempt:
// a retryable one releases the key, a terminal one is stored.
func TestDoFailsWithALongErrorMessage(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	long := errors.New("upstream said: " + strings.Repeat("é", 2000))

	t.Run("retryable", func(t *testing.T) {
		ctx := testContext(t)
		_, err := c.Do(ctx, "long-retryable", idem.DoOptions{}, func(context.Context) (idem.Response, error) {
			return idem.Response{}, long
		})
		if !errors.Is(err, long) || errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Do = %.300v, want fn's error alone (the fail accepted)", err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var runs atomic.Int32
		if _, err := c.Do(short, "long-retryable", idem.DoOptions{}, constant(&runs, idem.Response{})); err != nil || runs.Load() != 1 {
			t.Errorf("the next Do = %v after %d runs; want fn run again (the key released)", err, runs.Load())
		}
	})
	t.Run("terminal", func(t *testing.T) {
		ctx := testContext(t)
		_, err := c.Do(ctx, "long-terminal", idem.DoOptions{}, func(context.Context) (idem.Response, error) {
			return idem.Response{Body: []byte("no")}, idem.Terminal(long)
		})
		if !errors.Is(err, idem.ErrFailed) || errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Do = %.300v, want ErrFailed, stored", err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var runs atomic.Int32
		res, err := c.Do(short, "long-terminal", idem.DoOptions{}, constant(&runs, idem.Response{}))
		if !errors.Is(err, idem.ErrFailed) || !res.Replayed || runs.Load() != 0 || string(res.Response.Body) != "no" {
			t.Errorf("the next Do = %+v, %v after %d runs; want the stored failure replayed", res, err, runs.Load())
		}
		if !strings.HasPrefix(res.Error, "upstream said: éé") || len(res.Error) > 1024 {
			t.Errorf("stored message %q: want the start of fn's, at most 1 KiB", res.Error)
		}
	})
}

// A panic in fn fails the attempt retryably and reaches Do's caller.
func TestDoPanicFailsRetryablyAndIsRaised(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "panicky"

	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_, _ = c.Do(ctx, key, idem.DoOptions{}, func(context.Context) (idem.Response, error) {
			panic("boom")
		})
		t.Error("Do returned instead of raising fn's panic")
	}()
	if recovered != "boom" {
		t.Errorf("recovered %v, want fn's panic value", recovered)
	}
	st, err := c.Status(ctx, key, false)
	if err != nil || st.State != idem.StateFailed || st.Retryable == nil || !*st.Retryable ||
		st.Error == nil || !strings.Contains(*st.Error, "boom") {
		t.Errorf("status = %+v, %v; want a retryable failure naming the panic", st, err)
	}

	var runs atomic.Int32
	res, err := c.Do(ctx, key, idem.DoOptions{}, constant(&runs, idem.Response{Body: []byte("second try")}))
	if err != nil || runs.Load() != 1 || res.Replayed || res.Attempt != 2 {
		t.Errorf("Do after the panic = %+v, %v after %d runs; want fn run again as attempt 2", res, err, runs.Load())
	}
}

// A key held by another caller is waited for until ctx ends; fn never runs.
func TestDoWaitsForAnAttemptInProgressUntilCtxEnds(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "held"
	if _, err := c.Begin(ctx, idem.BeginParams{Key: key}); err != nil { // a 30 s lease, never finished
		t.Fatalf("Begin: %v", err)
	}

	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	var runs atomic.Int32
	_, err := c.Do(short, key, idem.DoOptions{Wait: 100 * time.Millisecond}, constant(&runs, idem.Response{}))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, want the context's deadline", err)
	}
	if runs.Load() != 0 {
		t.Error("fn ran while another caller held the key")
	}
	if n := svc.calls.get("/v1/begin"); n < 3 {
		t.Errorf("idemsvc got %d begins, want Do to have begun again after its waits", n)
	}
}

// A Do meeting an attempt in progress waits for it at idemsvc and gets its
// outcome.
func TestDoWaiterGetsTheOutcome(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	const key = "awaited"
	begun, err := c.Begin(ctx, idem.BeginParams{Key: key})
	if err != nil || begun.Lease == nil {
		t.Fatalf("Begin = %+v, %v", begun, err)
	}

	type outcome struct {
		res idem.Result
		err error
	}
	got := make(chan outcome, 1)
	var runs atomic.Int32
	go func() {
		res, err := c.Do(ctx, key, idem.DoOptions{}, constant(&runs, idem.Response{}))
		got <- outcome{res, err}
	}()
	waitFor(t, "the waiting begin", func() bool { return svc.calls.get("/v1/begin") >= 2 })
	time.Sleep(300 * time.Millisecond) // the other attempt takes a while
	if _, err := c.Complete(ctx, key, begun.Lease.LeaseToken, idem.Response{Body: []byte("done elsewhere")}, 0); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	o := recv(t, got, "the waiting Do")
	if o.err != nil || !o.res.Replayed || string(o.res.Response.Body) != "done elsewhere" || runs.Load() != 0 {
		t.Errorf("Do = %+v, %v; want the other attempt's outcome replayed", o.res, o.err)
	}
	if n := svc.calls.get("/v1/begin"); n != 2 {
		t.Errorf("idemsvc got %d begins, want 2: Do's begin should wait at idemsvc (wait_ms), not poll", n)
	}
}

// A key reused with another fingerprint is refused.
func TestDoFingerprintMismatch(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	var runs atomic.Int32
	if _, err := c.Do(ctx, "fp", idem.DoOptions{Fingerprint: "sha256:aaaa"}, constant(&runs, idem.Response{})); err != nil {
		t.Fatalf("Do: %v", err)
	}
	_, err := c.Do(ctx, "fp", idem.DoOptions{Fingerprint: "sha256:bbbb"}, constant(&runs, idem.Response{}))
	if !errors.Is(err, idem.ErrFingerprintMismatch) || runs.Load() != 1 {
		t.Errorf("Do with another fingerprint = %v after %d runs; want ErrFingerprintMismatch, fn not run", err, runs.Load())
	}
	res, err := c.Do(ctx, "fp", idem.DoOptions{Fingerprint: "sha256:aaaa"}, constant(&runs, idem.Response{}))
	if err != nil || !res.Replayed || runs.Load() != 1 {
		t.Errorf("Do with the same fingerprint = %+v, %v; want a replay", res, err)
	}
}

// A binary body and headers come back from a replay exactly as fn gave them.
func TestDoReplaysABinaryBodyByteForByte(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	want := idem.Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "image/png", "ETag": `"v1"`},
		Body: []byte{0x89, 'P', 'N', 'G', 0x00, 0xff, 0xfe, 0x80, '\r', '\n', 0x1a}}
	var runs atomic.Int32
	if _, err := c.Do(ctx, "png", idem.DoOptions{}, constant(&runs, want)); err != nil {
		t.Fatalf("Do: %v", err)
	}
	res, err := c.Do(ctx, "png", idem.DoOptions{}, constant(&runs, idem.Response{}))
	if err != nil || !res.Replayed || runs.Load() != 1 {
		t.Fatalf("second Do = %+v, %v; want a replay", res, err)
	}
	if res.Response.StatusCode != want.StatusCode || !bytes.Equal(res.Response.Body, want.Body) ||
		len(res.Response.Headers) != 2 || res.Response.Headers["Content-Type"] != "image/png" ||
		res.Response.Headers["ETag"] != `"v1"` {
		t.Errorf("replayed %+v, want %+v", res.Response, want)
	}
}

func TestTerminal(t *testing.T) {
	base := errors.New("card declined")
	if idem.Terminal(nil) != nil {
		t.Error("Terminal(nil) is not nil")
	}
	term := idem.Terminal(base)
	if !idem.IsTerminal(term) || !idem.IsTerminal(fmt.Errorf("charge: %w", term)) {
		t.Error("IsTerminal does not see a Terminal error, wrapped or not")
	}
	if idem.IsTerminal(base) || idem.IsTerminal(nil) {
		t.Error("IsTerminal holds for an unmarked error")
	}
	if !errors.Is(term, base) || term.Error() != base.Error() {
		t.Errorf("Terminal(err) = %v: it should unwrap to err and keep its message", term)
	}
}
