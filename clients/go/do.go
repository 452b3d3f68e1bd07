package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DoOptions configure Do. Zero values take the defaults.
type DoOptions struct {
	Fingerprint string        // compared with the key's first begin; a difference is ErrFingerprintMismatch
	Lease       time.Duration // the lease, extended every Lease/3 while fn runs (default 30 s)
	Retention   time.Duration // how long the outcome is replayed (default: the service's, a day)
	Wait        time.Duration // how long each begin waits for another caller's attempt (default 5 s)

	// omitBody stores a response too large to store as its status and
	// headers, with BodyOmittedHeader, instead of failing the attempt
	// (Middleware: a caller whose first answer was lost still learns it
	// succeeded).
	omitBody bool
}

// BodyOmittedHeader marks a replay whose body was too large to store.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// Defaults of DoOptions.
const (
	DefaultLease = 30 * time.Second
	DefaultWait  = 5 * time.Second
)

// Result is the outcome of Do: fn's, or the stored one of an earlier call.
type Result struct {
	Response Response
	Replayed bool   // fn did not run here: this is the stored outcome
	Failed   bool   // the outcome is a terminal failure
	Error    string // a terminal failure's message
	Attempt  int64  // the attempt that produced the outcome
}

// ErrFailed is a terminal failure, replayed or just stored.
var ErrFailed = errors.New("idem: failed terminally")

// Do runs fn at most once for key, across every caller of idemsvc, and
// gives every caller its outcome:
//
//   - a key completed or terminally failed before is replayed without
//     calling fn (Result.Replayed);
//   - a key in progress elsewhere is waited for, and begun again with
//     backoff, until ctx ends;
//   - otherwise fn runs with a context that is cancelled, with cause
//     ErrLeaseLost, if the lease is lost; Do's error then matches
//     ErrLeaseLost too. The lease is extended every
//     Lease/3 while fn runs.
//
// fn's response is then completed; a response idemsvc refuses to store
// (over its size limit) fails the attempt terminally instead, so that no
// duplicate runs fn again. An error fails the attempt: terminally
// when it is marked with Terminal, storing fn's response for replay;
// otherwise retryably, releasing the key for the next caller. A panic in fn
// fails the attempt retryably and is raised again.
func (c *Client) Do(ctx context.Context, key string, opts DoOptions, fn func(ctx context.Context) (Response, error)) (Result, error) {
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Wait <= 0 {
		opts.Wait = DefaultWait
	}
	begin := BeginParams{Key: key, Fingerprint: opts.Fingerprint, Owner: newOwner(),
		Lease: opts.Lease, Retention: opts.Retention, Wait: opts.Wait}
	for attempt := 0; ; attempt++ {
		res, err := c.Begin(ctx, begin)
		if errors.Is(err, ErrInProgress) {
			if serr := sleep(ctx, c.backoff(attempt)); serr != nil {
				return Result{}, within(key, errors.Join(serr, err))
			}
			continue
		}
		if err != nil {
			return Result{}, within(key, err)
		}
		switch {
		case res.Replay != nil:
			return replayed(res.Replay)
		case res.Lease == nil:
			return Result{}, fmt.Errorf("idem: do %q: begin answered neither a lease nor an outcome", key)
		}
		return c.run(ctx, key, res.Lease, opts, fn)
	}
}

// replayed is the Result of a finished attempt's stored outcome.
func replayed(r *BeginReplay) (Result, error) {
	resp, err := r.Response.Decode()
	out := Result{Response: resp, Replayed: true, Attempt: r.Attempt}
	if err != nil {
		return out, err
	}
	if r.Status == FinishedStateFailed {
		out.Failed = true
		if r.Error != nil {
			out.Error = *r.Error
		}
		return out, fmt.Errorf("%w: %s", ErrFailed, out.Error)
	}
	return out, nil
}

// run runs fn under lease and completes or fails the attempt.
func (c *Client) run(ctx context.Context, key string, lease *BeginAcquired, opts DoOptions, fn func(ctx context.Context) (Response, error)) (Result, error) {
	token := lease.LeaseToken
	fnCtx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	stop := c.heartbeat(fnCtx, lost, key, token, opts.Lease)
	// The operation ran: its outcome is stored even if ctx ends meanwhile.
	finishCtx := context.WithoutCancel(ctx)

	resp, err := func() (resp Response, err error) {
		defer func() {
			if p := recover(); p != nil {
				stop()
				_, _ = c.Fail(finishCtx, key, token, FailParams{Error: fmt.Sprintf("panic: %v", p)})
				panic(p)
			}
		}()
		return fn(fnCtx)
	}()
	stop()

	out := Result{Response: resp, Attempt: lease.Attempt}
	if err == nil {
		_, cerr := c.Complete(finishCtx, key, token, resp, opts.Retention)
		if errors.Is(cerr, ErrTooLarge) && opts.omitBody {
			headers := map[string]string{BodyOmittedHeader: "true"}
			for name, value := range resp.Headers {
				headers[name] = value
			}
			_, cerr = c.Complete(finishCtx, key, token, Response{StatusCode: resp.StatusCode, Headers: headers}, opts.Retention)
		}
		if errors.Is(cerr, ErrTooLarge) || errors.Is(cerr, ErrInvalid) {
			// The operation ran but its outcome cannot be stored: a
			// terminal failure keeps duplicates from running it again.
			out.Failed, out.Error = true, "the response could not be stored: "+cerr.Error()
			_, ferr := c.Fail(finishCtx, key, token, FailParams{Terminal: true, Error: out.Error})
			return out, errors.Join(within(key, cerr), ferr)
		}
		if cerr != nil {
			return out, within(key, cerr)
		}
		return out, nil
	}
	if cause := context.Cause(fnCtx); errors.Is(cause, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	if IsTerminal(err) {
		out.Failed, out.Error = true, err.Error()
		_, ferr := c.Fail(finishCtx, key, token, FailParams{Terminal: true, Error: err.Error(), Response: resp})
		if errors.Is(ferr, ErrTooLarge) {
			// Store the failure without its response rather than not at all.
			_, ferr = c.Fail(finishCtx, key, token, FailParams{Terminal: true, Error: err.Error()})
		}
		return out, errors.Join(fmt.Errorf("%w: %w", ErrFailed, err), ferr)
	}
	_, ferr := c.Fail(finishCtx, key, token, FailParams{Error: err.Error()})
	return out, errors.Join(err, ferr)
}

// heartbeat extends the lease every lease/3 until stop is called. When the
// lease is lost, or cannot be extended before it runs out, it cancels ctx
// with ErrLeaseLost.
func (c *Client) heartbeat(ctx context.Context, lost context.CancelCauseFunc, key, token string, lease time.Duration) (stop func()) {
	// stop cancels an extend in flight: the caller completes at once
	// instead of waiting for a slow idemsvc while the lease runs down.
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		expires := time.Now().Add(lease) // on this clock; a little late at worst
		ticker := time.NewTicker(lease / 3)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
			case <-done:
				return
			case <-ctx.Done():
				return
			}
			extendCtx, cancel := context.WithDeadline(ctx, expires)
			sent := time.Now()
			_, err := c.Extend(extendCtx, key, token, lease)
			cancel()
			switch {
			case err == nil:
				expires = sent.Add(lease)
			case ctx.Err() != nil:
				return // stopped, or the caller's context ended
			case errors.Is(err, ErrLeaseLost):
				lost(err)
				return
			case errors.Is(err, ErrNotFound): // the record is gone, and the lease with it
				lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
				return
			case !time.Now().Before(expires):
				lost(fmt.Errorf("%w: not extended before it ran out: %w", ErrLeaseLost, err))
				return
			}
		}
	}()
	var once bool
	return func() {
		if !once {
			once = true
			close(done)
			cancel()
			<-stopped
		}
	}
}

// Terminal marks err as a terminal failure: Do stores it, and every later
// call for the key gets it replayed instead of running the operation.
// Unmarked errors are retryable: the key is released.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err}
}

// IsTerminal reports whether err was marked with Terminal.
func IsTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }
