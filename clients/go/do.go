// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	// streamed, when fn sets it, says that fn stored its answer itself
	// (Middleware, by CompleteStream): no complete follows.
	streamed *bool
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
//     Lease/3 while fn runs, also once ctx has ended, until fn returns.
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
	if err == nil && opts.streamed != nil && *opts.streamed {
		return out, nil
	}
	if err == nil {
		cerr := c.completeInto(finishCtx, key, token, resp, opts.Retention, nil)
		if errors.Is(cerr, ErrTooLarge) && opts.omitBody {
			headers := map[string]string{BodyOmittedHeader: "true"}
			for name, value := range resp.Headers {
				headers[name] = value
			}
			cerr = c.completeInto(finishCtx, key, token, Response{StatusCode: resp.StatusCode, Headers: headers}, opts.Retention, nil)
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

// heartbeat extends the lease every lease/3 until stop is called, also
// after ctx ends (fn may run on after its caller gave up). When the lease
// is lost, or cannot be extended before it runs out, it cancels ctx with
// ErrLeaseLost. It is a timer, not a goroutine, until it first
// fires: an operation shorter than lease/3 costs no more than that.
func (c *Client) heartbeat(ctx context.Context, lost context.CancelCauseFunc, key, token string, lease time.Duration) (stop func()) {
	h := &heartbeat{c: c, parent: ctx, lost: lost, key: key, token: token, lease: lease,
		expires: time.Now().Add(lease)} // on this clock; a little late at worst
	h.mu.Lock() // the timer may fire before AfterFunc returns
	h.timer = time.AfterFunc(lease/3, h.beat)
	h.mu.Unlock()
	return h.stop
}

type heartbeat struct {
	c          *Client
	parent     context.Context
	lost       context.CancelCauseFunc
	key, token string
	lease      time.Duration
	expires    time.Time // of the lease, as last extended; beats run one at a time

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	cancel  context.CancelFunc // of the extend in flight, if any
	beating sync.WaitGroup
}

// beat extends the lease once, and sets the timer for the next beat
// unless the lease is lost or the heartbeat stopped.
func (h *heartbeat) beat() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	// stop cancels an extend in flight: the caller completes at once
	// instead of waiting for a slow idemsvc while the lease runs down.
	// The extend outlives the caller's context: fn may go on running after
	// its caller gave up, and the key must stay held until it returns.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(h.parent), h.expires)
	h.cancel = cancel
	h.beating.Add(1)
	h.mu.Unlock()
	defer h.beating.Done()
	defer cancel()

	sent := time.Now()
	_, err := h.c.Extend(ctx, h.key, h.token, h.lease)
	h.mu.Lock()
	stopped := h.stopped
	h.mu.Unlock()
	switch {
	case err == nil:
		h.expires = sent.Add(h.lease)
	case stopped:
		return
	case errors.Is(err, ErrLeaseLost):
		h.lost(err)
		return
	case errors.Is(err, ErrNotFound): // the record is gone, and the lease with it
		h.lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
		return
	case !time.Now().Before(h.expires):
		h.lost(fmt.Errorf("%w: not extended before it ran out: %w", ErrLeaseLost, err))
		return
	}
	h.mu.Lock()
	if !h.stopped {
		h.timer.Reset(h.lease / 3)
	}
	h.mu.Unlock()
}

// stop ends the heartbeat, and waits for a beat in progress to end.
func (h *heartbeat) stop() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.stopped = true
	h.timer.Stop()
	if h.cancel != nil {
		h.cancel()
	}
	h.mu.Unlock()
	h.beating.Wait()
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
