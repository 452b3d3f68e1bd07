// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"errors"
	"fmt"
	"time"
)

// The errors a Store returns, tested with errors.Is. Each may be wrapped with
// detail; HTTP maps each to one problem type.
var (
	ErrInvalid             = errors.New("statemachine: invalid request")
	ErrInProgress          = errors.New("statemachine: in progress")
	ErrLeaseLost           = errors.New("statemachine: lease lost")
	ErrFingerprintMismatch = errors.New("statemachine: fingerprint mismatch")
	ErrNotFound            = errors.New("statemachine: not found")
	ErrTooLarge            = errors.New("statemachine: too large")
	// ErrAcquireRefused answers a Begin with NoAcquire that would acquire.
	ErrAcquireRefused = errors.New("statemachine: acquire refused")
	// ErrReplayRefused answers a Begin with NoReplay that would replay.
	ErrReplayRefused = errors.New("statemachine: replay refused")
	// ErrStoreUnavailable means the store could not be reached or did not
	// answer in time. The transition may or may not have happened: a retry
	// with the same owner or token is safe.
	ErrStoreUnavailable = errors.New("statemachine: store unavailable")
	// ErrOverloaded is ErrStoreUnavailable for a call refused before it
	// reached Redis, because as many calls as the store allows were in
	// flight: it did not take effect.
	ErrOverloaded = fmt.Errorf("%w: too many calls to Redis in flight", ErrStoreUnavailable)
	// ErrNoRoom is ErrStoreUnavailable for a begin that would have started
	// an attempt on a Redis master whose free memory under maxmemory is
	// under the reserve kept for the outcomes of the attempts in flight
	// (redisstore.Options.ReserveBytes). It changed nothing.
	ErrNoRoom = fmt.Errorf("%w: no room for the outcomes of new attempts", ErrStoreUnavailable)
	// ErrEvicting is ErrStoreUnavailable for a begin that would have
	// started an attempt on a Redis master whose eviction policy may drop
	// records, eviction not being allowed. It changed nothing.
	ErrEvicting = fmt.Errorf("%w: the eviction policy may drop records", ErrStoreUnavailable)
)

// NotApplied reports whether err refused a call before the store ran it
// (shed, or a begin on a master that keeps no room or may evict): unlike
// other ErrStoreUnavailable errors, the call cannot have taken effect.
func NotApplied(err error) bool {
	return errors.Is(err, ErrOverloaded) || errors.Is(err, ErrNoRoom) || errors.Is(err, ErrEvicting)
}

// InProgressError is ErrInProgress with the attempt that holds the key.
type InProgressError struct {
	Attempt        int64
	LeaseExpiresAt time.Time
	// Since is the attempt's last transition (its acquisition, or its
	// last extend), and Now the store's clock when it answered: the
	// attempt has been running for at least Now - Since.
	Since, Now time.Time
}

// RetryIn is when a retry is worth making: after about as long as the
// attempt has run since Since (at least a second), and no later than the
// lease's end. An attempt that began 300 ms ago is retried in a second, not
// at the end of its 30 s lease.
func (e *InProgressError) RetryIn() time.Duration {
	d := max(e.Now.Sub(e.Since), time.Second)
	return min(d, e.LeaseExpiresAt.Sub(e.Now))
}

// Detail says which attempt holds the lease, and until when.
func (e *InProgressError) Detail() string {
	return fmt.Sprintf("attempt %d holds the lease until %s", e.Attempt, e.LeaseExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z"))
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("statemachine: in progress: attempt %d holds the lease until %s",
		e.Attempt, e.LeaseExpiresAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrInProgress) hold.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// InvalidError is ErrInvalid naming the offending request field: the one
// error of a request that does not fit the API, from the JSON decoder to
// the store's limits.
type InvalidError struct {
	Field  string // as the API names it, e.g. "lease_ms" or "response.headers"; "" for the body as a whole
	Reason string
}

// Detail names the field and what is wrong with it.
func (e *InvalidError) Detail() string {
	if e.Field == "" {
		return "request body: " + e.Reason
	}
	return e.Field + ": " + e.Reason
}

func (e *InvalidError) Error() string { return "statemachine: invalid request: " + e.Detail() }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// TooLargeError is ErrTooLarge saying what was too large, how large it was
// (0 when unknown) and its limit, in bytes.
type TooLargeError struct {
	What        string // e.g. "the response"
	Size, Limit int64
}

func (e *TooLargeError) Error() string { return "statemachine: too large: " + e.Detail() }

// Detail says what was too large, for the problem detail.
func (e *TooLargeError) Detail() string {
	if e.Size > 0 {
		return fmt.Sprintf("%s is %d bytes, over the limit of %d", e.What, e.Size, e.Limit)
	}
	return fmt.Sprintf("%s is over the limit of %d bytes", e.What, e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) hold.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

func sizeError(size, limit int) error {
	return &TooLargeError{What: "the response", Size: int64(size), Limit: int64(limit)}
}
