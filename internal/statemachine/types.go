// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"context"
	"fmt"
	"time"
)

// State is where a record stands.
type State uint8

// The states of a record. A retryable failure is StateFailed with
// Record.Retryable set: the next Begin acquires it.
const (
	StateInProgress State = 1
	StateCompleted  State = 2
	StateFailed     State = 3
)

// String returns the state's name as the API spells it.
func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Response is what an operation produced, replayed byte for byte to every
// duplicate. Every part is optional.
type Response struct {
	StatusCode int // 100–599, or 0 when not given
	Headers    map[string]string
	Body       string // any bytes; immutable, so the readers of a record share it
	// Base64 records that the body was sent base64-encoded, so that replays
	// encode it the same way.
	Base64 bool
	// Ref, when set, is where the body is kept instead of Body: an object
	// of the blob store of large responses (internal/blob).
	Ref *BodyRef
	// Zstd, when set, is the body as a record keeps it compressed: a zstd
	// frame (compress.go) that decodes to ZstdSize bytes. A complete may
	// give it beside Body, compressed once by a caller that had to know
	// its compressed size, or instead of Body, for a streamed body
	// compressed as it arrived and never held whole. A read that asks for
	// it (WithStreamedBodies) gets a long body this way, Body empty, to
	// decode as it writes it (OpenBody).
	Zstd     string
	ZstdSize int64
}

// BodySize is the length of the body as sent, whether it is held in Body
// or only compressed (Zstd); not counting a body in the blob store.
func (r *Response) BodySize() int64 {
	if r.Body == "" && r.Zstd != "" {
		return r.ZstdSize
	}
	return int64(len(r.Body))
}

// BodyRef names a stored body kept in the blob store: its object, length,
// SHA-256 and encoding ("" is identity, the body's own bytes).
type BodyRef struct {
	Object   string
	Size     int64
	SHA256   [32]byte
	Encoding string
}

// IsZero reports whether no part of the response was given.
func (r Response) IsZero() bool {
	return r.StatusCode == 0 && len(r.Headers) == 0 && len(r.Body) == 0 && !r.Base64 && r.Ref == nil && r.Zstd == ""
}

// Lease is a caller's right to run the current attempt.
type Lease struct {
	Token     string // opaque; fences Complete, Fail and Extend
	Attempt   int64  // strictly increasing per key: usable as a fencing token
	ExpiresAt time.Time
	Recovered bool // an expired lease of an earlier attempt was taken over
}

// Record is what a store holds for one (tenant, key). Times are UTC.
type Record struct {
	Tenant         string
	Key            string
	State          State
	Attempt        int64
	Owner          string
	Fingerprint    string
	CreatedAt      time.Time
	UpdatedAt      time.Time // the last transition (extend included): completed_at or failed_at once finished
	LeaseExpiresAt time.Time // while in progress
	LeaseExpired   bool      // while in progress: the lease ran out and nobody took over yet
	ExpiresAt      time.Time // end of retention
	Retention      time.Duration
	Retryable      bool     // failed: the next Begin acquires
	Error          string   // failed: the caller's message
	Response       Response // finished; filled by Status only when asked for
	// StoredBytes is what the response takes in the store: the body as
	// stored (compressed or not), header names and values. Set by Complete
	// and Fail, for the tenant's stored_bytes.
	StoredBytes int64
}

// BeginRequest starts an attempt. Zero durations take the defaults of Limits.
type BeginRequest struct {
	Key         string
	Fingerprint string // compared when both the record and the request carry one
	Owner       string // a Begin by the live lease's owner returns that lease again
	Lease       time.Duration
	Retention   time.Duration
	// NoAcquire refuses to start an attempt: the Begin only replays a
	// finished record, returns the owner's live lease, or fails, with
	// ErrAcquireRefused where it would have acquired. For a tenant over
	// its stored-bytes budget.
	NoAcquire bool
	// Waited marks a Begin sent again after waiting for another attempt
	// to end: a store that refuses calls under overload (redisstore.Store) does
	// not refuse it, as its caller has waited for this answer.
	Waited bool
	// NoReplay refuses to replay: a Begin on a finished record fails with
	// ErrReplayRefused, without reading its response. For a tenant over
	// its read budget.
	NoReplay bool
	// StreamedBody replays a long compressed body compressed
	// (Response.Zstd), for a caller that decodes it as it writes it; as
	// WithStreamedBodies does for the reads of a context.
	StreamedBody bool
	// Token is the lease token the attempt gets if the Begin acquires, in
	// Lease.Token's form (NewToken); "" for a random one. The caller knows
	// it beforehand: the in_progress limit counts the lease under it.
	Token string
}

// BeginResult is either an acquired Lease or a finished Record to replay.
type BeginResult struct {
	Acquired bool
	Lease    Lease  // when Acquired
	Record   Record // the record after Begin; when not Acquired, State is Completed or Failed
}

// CompleteRequest stores the response of the current attempt.
type CompleteRequest struct {
	Key       string
	Token     string
	Response  Response
	Retention time.Duration // zero keeps the retention given to Begin
}

// FailRequest ends the current attempt with a failure. A retryable failure
// releases the key; a terminal one is replayed by Begin until retention ends.
type FailRequest struct {
	Key       string
	Token     string
	Retryable bool
	Error     string
	Response  Response
	Retention time.Duration // zero keeps the retention given to Begin
}

// ExtendRequest pushes the lease of the current attempt to now + Lease.
type ExtendRequest struct {
	Key   string
	Token string
	Lease time.Duration
}

// Store keeps records and moves them through their states. Every method takes
// the tenant the caller acts for: the same key under two tenants names two
// unrelated records.
type Store interface {
	// Begin acquires the key, or returns its finished record; it fails with
	// ErrInProgress (as *InProgressError) or ErrFingerprintMismatch.
	Begin(ctx context.Context, tenant string, req BeginRequest) (BeginResult, error)
	// Complete finishes the attempt with its response. It returns the
	// record without its response.
	Complete(ctx context.Context, tenant string, req CompleteRequest) (Record, error)
	// Fail finishes or releases the attempt. It returns the record without
	// its response.
	Fail(ctx context.Context, tenant string, req FailRequest) (Record, error)
	// Extend renews the lease of the current attempt.
	Extend(ctx context.Context, tenant string, req ExtendRequest) (Lease, error)
	// Status reads the record; the response is filled only if withResponse.
	Status(ctx context.Context, tenant, key string, withResponse bool) (Record, error)
	// Delete forgets the record; deleting an absent record is not an error.
	Delete(ctx context.Context, tenant, key string) error
	// List returns a page of the tenant's records in one state, without
	// their responses. A record that exists for the whole listing is in
	// one of its pages at least once.
	List(ctx context.Context, tenant string, req ListRequest) (ListPage, error)
	// Limits are the limits the store enforces, defaults filled in.
	Limits() Limits
	// Ping reports whether the store can be reached.
	Ping(ctx context.Context) error
	// Readiness reports every failed readiness check, within 500 ms:
	// none when the store can serve.
	Readiness(ctx context.Context) []Failure
	Batcher
}
