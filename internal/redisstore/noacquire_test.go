// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"errors"
	"testing"

	sm "github.com/idemsvc/idemsvc/internal/statemachine"
)

// A Begin with NoAcquire (a tenant over its stored-bytes budget) replays
// and returns the owner's live lease, but starts no attempt, and writes
// nothing where it would have.
func TestNoAcquireOnlyReplays(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		s := newSubject(t, store)
		if _, err := s.begin(sm.BeginRequest{NoAcquire: true}); !errors.Is(err, sm.ErrAcquireRefused) {
			t.Fatalf("new key: got %v, want ErrAcquireRefused", err)
		}
		if got := s.shape(); got != absent {
			t.Fatalf("after a refused begin: %+v, want no record", got)
		}

		lease := s.mustBegin(sm.BeginRequest{Owner: "o", Lease: shortLease}).Lease
		again := s.mustBegin(sm.BeginRequest{Owner: "o", NoAcquire: true})
		if !again.Acquired || again.Lease != lease {
			t.Errorf("same owner: got %+v, want its lease %+v", again, lease)
		}
		var busy *sm.InProgressError
		if _, err := s.begin(sm.BeginRequest{NoAcquire: true}); !errors.As(err, &busy) {
			t.Errorf("in progress: got %v, want in progress", err)
		}
		s.waitLeaseExpiry()
		if _, err := s.begin(sm.BeginRequest{NoAcquire: true}); !errors.Is(err, sm.ErrAcquireRefused) {
			t.Errorf("expired lease: got %v, want ErrAcquireRefused (no takeover)", err)
		}
		if got := s.shape(); got != inProgress(1) {
			t.Errorf("after a refused takeover: %+v, want attempt 1 in progress", got)
		}

		s.mustBegin(sm.BeginRequest{})
		if _, err := s.fail(true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.begin(sm.BeginRequest{NoAcquire: true}); !errors.Is(err, sm.ErrAcquireRefused) {
			t.Errorf("released: got %v, want ErrAcquireRefused", err)
		}
		s.mustBegin(sm.BeginRequest{})
		if _, err := s.complete("paid"); err != nil {
			t.Fatal(err)
		}
		replay := s.mustBegin(sm.BeginRequest{NoAcquire: true})
		if replay.Acquired || replay.Record.State != sm.StateCompleted || replay.Record.Response.Body != "paid" {
			t.Errorf("completed: got %+v, want the replay", replay)
		}
	})
}
