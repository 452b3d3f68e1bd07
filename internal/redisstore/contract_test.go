// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// forEachBackend runs test, in parallel, against every store
// implementation.
func forEachBackend(t *testing.T, test func(t *testing.T, open func(t *testing.T) sm.Store)) {
	for _, b := range idemtest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			test(t, func(t *testing.T) sm.Store { return b.Open(t) })
		})
	}
}

var ctx = context.Background()

// subject is one record under test: a store, a tenant and a key.
type subject struct {
	t      *testing.T
	store  sm.Store
	tenant string
	key    string
	lease  sm.Lease // the last lease acquired through begin
}

func newSubject(t *testing.T, store sm.Store) *subject {
	return &subject{t: t, store: store, tenant: idemtest.Unique("t"), key: idemtest.Unique("order")}
}

func (s *subject) begin(req sm.BeginRequest) (sm.BeginResult, error) {
	req.Key = s.key
	res, err := s.store.Begin(ctx, s.tenant, req)
	if err == nil && res.Acquired {
		s.lease = res.Lease
	}
	return res, err
}

func (s *subject) mustBegin(req sm.BeginRequest) sm.BeginResult {
	s.t.Helper()
	res, err := s.begin(req)
	if err != nil {
		s.t.Fatalf("begin: %v", err)
	}
	return res
}

func (s *subject) complete(body string) (sm.Record, error) {
	return s.store.Complete(ctx, s.tenant, sm.CompleteRequest{
		Key: s.key, Token: s.lease.Token,
		Response: sm.Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "text/plain"}, Body: body},
	})
}

func (s *subject) fail(retryable bool) (sm.Record, error) {
	return s.store.Fail(ctx, s.tenant, sm.FailRequest{
		Key: s.key, Token: s.lease.Token, Retryable: retryable, Error: "card declined",
		Response: sm.Response{StatusCode: 402, Body: `{"error":"declined"}`},
	})
}

func (s *subject) extend(lease time.Duration) (sm.Lease, error) {
	return s.store.Extend(ctx, s.tenant, sm.ExtendRequest{Key: s.key, Token: s.lease.Token, Lease: lease})
}

// status returns the record, or nil when there is none.
func (s *subject) status() *sm.Record {
	s.t.Helper()
	rec, err := s.store.Status(ctx, s.tenant, s.key, true)
	if errors.Is(err, sm.ErrNotFound) {
		return nil
	}
	if err != nil {
		s.t.Fatalf("status: %v", err)
	}
	return &rec
}

// shape is the part of a record a table row states.
type shape struct {
	state     sm.State // 0: no record
	attempt   int64
	retryable bool
}

func (s *subject) shape() shape {
	s.t.Helper()
	rec := s.status()
	if rec == nil {
		return shape{}
	}
	return shape{rec.State, rec.Attempt, rec.Retryable}
}

var (
	absent     = shape{}
	inProgress = func(attempt int64) shape { return shape{sm.StateInProgress, attempt, false} }
	completed  = shape{sm.StateCompleted, 1, false}
	failedTerm = shape{sm.StateFailed, 1, false}
	released   = shape{sm.StateFailed, 1, true}
)

const shortLease = 100 * time.Millisecond

// waitLeaseExpiry sleeps past the subject's lease.
func (s *subject) waitLeaseExpiry() {
	time.Sleep(time.Until(s.lease.ExpiresAt) + 20*time.Millisecond)
}

func TestTransitions(t *testing.T) {
	type row struct {
		name    string
		setup   func(s *subject)
		before  shape
		op      func(s *subject) error
		wantErr error
		after   shape
	}
	acquire := func(s *subject) { s.mustBegin(sm.BeginRequest{Owner: "owner-a", Fingerprint: "fp-1"}) }
	acquireNoFP := func(s *subject) { s.mustBegin(sm.BeginRequest{Owner: "owner-a"}) }
	acquireShort := func(s *subject) { s.mustBegin(sm.BeginRequest{Owner: "owner-a", Lease: shortLease}) }
	then := func(steps ...func(s *subject)) func(s *subject) {
		return func(s *subject) {
			for _, step := range steps {
				step(s)
			}
		}
	}
	must := func(op func(s *subject) error) func(s *subject) {
		return func(s *subject) {
			s.t.Helper()
			if err := op(s); err != nil {
				s.t.Fatalf("setup: %v", err)
			}
		}
	}
	completeOp := func(s *subject) error { _, err := s.complete("done"); return err }
	failOp := func(retryable bool) func(s *subject) error {
		return func(s *subject) error { _, err := s.fail(retryable); return err }
	}
	extendOp := func(s *subject) error { _, err := s.extend(time.Second); return err }
	beginAs := func(owner, fp string) func(s *subject) error {
		return func(s *subject) error { _, err := s.begin(sm.BeginRequest{Owner: owner, Fingerprint: fp}); return err }
	}
	expire := func(s *subject) { s.waitLeaseExpiry() }
	takeOver := func(s *subject) {
		stale := s.lease
		s.mustBegin(sm.BeginRequest{Owner: "owner-b"})
		s.lease = stale // later steps present the dead token
	}

	rows := []row{
		{name: "begin new key acquires", setup: func(*subject) {}, before: absent,
			op: beginAs("owner-a", ""), after: inProgress(1)},
		{name: "begin by another owner on a live lease is in progress", setup: acquire, before: inProgress(1),
			op: beginAs("owner-b", ""), wantErr: sm.ErrInProgress, after: inProgress(1)},
		{name: "begin without owner on a live lease is in progress", setup: acquire, before: inProgress(1),
			op: beginAs("", ""), wantErr: sm.ErrInProgress, after: inProgress(1)},
		{name: "begin by the same owner returns the lease", setup: acquire, before: inProgress(1),
			op: beginAs("owner-a", ""), after: inProgress(1)},
		{name: "begin after lease expiry recovers", setup: then(acquireShort, expire), before: inProgress(1),
			op: beginAs("owner-b", ""), after: inProgress(2)},
		{name: "begin on completed replays", setup: then(acquire, must(completeOp)), before: completed,
			op: beginAs("owner-b", ""), after: completed},
		{name: "begin on terminal failure replays", setup: then(acquire, must(failOp(false))), before: failedTerm,
			op: beginAs("owner-b", ""), after: failedTerm},
		{name: "begin on released key acquires", setup: then(acquire, must(failOp(true))), before: released,
			op: beginAs("owner-b", ""), after: inProgress(2)},
		{name: "begin with another fingerprint on in progress", setup: acquire, before: inProgress(1),
			op: beginAs("owner-a", "fp-2"), wantErr: sm.ErrFingerprintMismatch, after: inProgress(1)},
		{name: "begin with another fingerprint on completed", setup: then(acquire, must(completeOp)), before: completed,
			op: beginAs("owner-b", "fp-2"), wantErr: sm.ErrFingerprintMismatch, after: completed},
		{name: "begin with another fingerprint on released", setup: then(acquire, must(failOp(true))), before: released,
			op: beginAs("owner-b", "fp-2"), wantErr: sm.ErrFingerprintMismatch, after: released},
		{name: "begin without fingerprint is not compared", setup: then(acquire, must(failOp(true))), before: released,
			op: beginAs("owner-b", ""), after: inProgress(2)},
		{name: "begin with a fingerprint on a record without one", setup: then(acquireNoFP, must(completeOp)), before: completed,
			op: beginAs("owner-b", "fp-9"), after: completed},
		{name: "complete with the current token", setup: acquire, before: inProgress(1),
			op: completeOp, after: completed},
		{name: "complete retried with the same token", setup: then(acquire, must(completeOp)), before: completed,
			op: completeOp, after: completed},
		{name: "complete after the lease ran out, nobody took over", setup: then(acquireShort, expire), before: inProgress(1),
			op: completeOp, after: completed},
		{name: "complete with a token of a taken-over attempt", setup: then(acquireShort, expire, takeOver), before: inProgress(2),
			op: completeOp, wantErr: sm.ErrLeaseLost, after: inProgress(2)},
		{name: "complete after a terminal failure", setup: then(acquire, must(failOp(false))), before: failedTerm,
			op: completeOp, wantErr: sm.ErrLeaseLost, after: failedTerm},
		{name: "complete after a retryable failure", setup: then(acquire, must(failOp(true))), before: released,
			op: completeOp, wantErr: sm.ErrLeaseLost, after: released},
		{name: "complete without a record", setup: then(acquire, func(s *subject) { s.store.Delete(ctx, s.tenant, s.key) }), before: absent,
			op: completeOp, wantErr: sm.ErrNotFound, after: absent},
		{name: "fail terminally", setup: acquire, before: inProgress(1),
			op: failOp(false), after: failedTerm},
		{name: "fail retryably releases", setup: acquire, before: inProgress(1),
			op: failOp(true), after: released},
		{name: "fail retried with the same token", setup: then(acquire, must(failOp(false))), before: failedTerm,
			op: failOp(false), after: failedTerm},
		{name: "fail after complete", setup: then(acquire, must(completeOp)), before: completed,
			op: failOp(false), wantErr: sm.ErrLeaseLost, after: completed},
		{name: "fail with a token of a taken-over attempt", setup: then(acquireShort, expire, takeOver), before: inProgress(2),
			op: failOp(false), wantErr: sm.ErrLeaseLost, after: inProgress(2)},
		{name: "extend the current lease", setup: acquire, before: inProgress(1),
			op: extendOp, after: inProgress(1)},
		{name: "extend a token of a taken-over attempt", setup: then(acquireShort, expire, takeOver), before: inProgress(2),
			op: extendOp, wantErr: sm.ErrLeaseLost, after: inProgress(2)},
		{name: "extend a completed attempt", setup: then(acquire, must(completeOp)), before: completed,
			op: extendOp, wantErr: sm.ErrLeaseLost, after: completed},
		{name: "extend without a record", setup: func(s *subject) { s.lease.Token = strings.Repeat("ab", 16) }, before: absent,
			op: extendOp, wantErr: sm.ErrNotFound, after: absent},
		{name: "delete forgets", setup: then(acquire, must(completeOp)), before: completed,
			op: func(s *subject) error { return s.store.Delete(ctx, s.tenant, s.key) }, after: absent},
		{name: "delete an absent key", setup: func(*subject) {}, before: absent,
			op: func(s *subject) error { return s.store.Delete(ctx, s.tenant, s.key) }, after: absent},
	}
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		for _, r := range rows {
			t.Run(r.name, func(t *testing.T) {
				t.Parallel()
				s := newSubject(t, store)
				r.setup(s)
				if got := s.shape(); got != r.before {
					t.Fatalf("before: got %+v, want %+v", got, r.before)
				}
				err := r.op(s)
				if !errors.Is(err, r.wantErr) || (err == nil) != (r.wantErr == nil) {
					t.Fatalf("op: got error %v, want %v", err, r.wantErr)
				}
				if got := s.shape(); got != r.after {
					t.Fatalf("after: got %+v, want %+v", got, r.after)
				}
			})
		}
	})
}
