// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestSentinelFailover: over a Sentinel-managed Redis with WaitReplicas 1,
// a transition is acknowledged only once the replica has it, so a
// completed record survives the master's crash and the replica's
// promotion. While the master is gone, and while the new master has no
// replica to confirm, every call answers ErrStoreUnavailable, never a
// lease; once a replica is back the same store serves again.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	st := redistest.NewSentinel(t)
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            st.MasterName(),
		SentinelAddrs:         st.Addrs(),
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.Options{WaitReplicas: 1})
	master, replica := st.Master(t), st.Replica(t)

	done := newSubject(t, store)
	if res := done.mustBegin(sm.BeginRequest{Owner: "worker-1"}); !res.Acquired {
		t.Fatalf("begin: got %+v, want acquired", res)
	}
	if _, err := done.complete("paid"); err != nil {
		t.Fatalf("complete: %v", err)
	}

	// With the replica hung, a completion is not acknowledged; the retry
	// with the same token is, once the replica confirms.
	unconfirmed := newSubject(t, store)
	unconfirmed.mustBegin(sm.BeginRequest{})
	resume := replica.Pause(t)
	if _, err := unconfirmed.complete("shipped"); !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Fatalf("complete with the replica hung: got %v, want store unavailable", err)
	}
	resume()
	if _, err := unconfirmed.complete("shipped"); err != nil {
		t.Fatalf("retried complete: %v", err)
	}
	st.WaitHealthy(t) // the Sentinels count on the replica again

	master.Kill(t)
	stopBegins := beginUntil(store, done)
	promoted := st.WaitFailover(t)
	calls := stopBegins()
	if promoted != replica {
		t.Fatalf("the Sentinels promoted %s, want the replica %s", promoted.Addr(), replica.Addr())
	}
	// Until the promotion the master is gone; after it, no replica can
	// confirm: either way no caller may proceed.
	t.Logf("%d begins during the failover", len(calls))
	for _, c := range calls {
		switch {
		case c.err == nil && c.res.Acquired:
			t.Errorf("begin %s during the failover acquired attempt %d, which no replica confirmed", c.key, c.res.Lease.Attempt)
		case !errors.Is(c.err, sm.ErrStoreUnavailable):
			t.Errorf("begin %s during the failover: got %+v, %v; want store unavailable", c.key, c.res, c.err)
		}
	}

	// The promoted replica holds both records: they were confirmed before
	// the master died. With no replica of its own, it cannot confirm
	// anything, so the store still fails closed.
	for _, s := range []*subject{done, unconfirmed} {
		if n, err := promoted.Client(t).Exists(ctx, redisstore.Key(s.tenant, s.key)).Result(); err != nil || n != 1 {
			t.Errorf("record %s on the promoted replica: EXISTS = %d, %v; want 1", s.key, n, err)
		}
	}
	if res, err := done.begin(sm.BeginRequest{}); !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Errorf("begin on the new master without a replica: got %+v, %v; want store unavailable", res, err)
	}

	// The old master comes back, empty, as a replica of the new one: the
	// same store serves again and replays the completed records.
	master.Start(t)
	st.WaitHealthy(t)
	for s, body := range map[*subject]string{done: "paid", unconfirmed: "shipped"} {
		res, err := s.begin(sm.BeginRequest{Owner: "worker-2"})
		if err != nil {
			t.Fatalf("begin after the failover: %v", err)
		}
		if res.Acquired || res.Record.State != sm.StateCompleted || res.Record.Attempt != 1 || string(res.Record.Response.Body) != body {
			t.Errorf("begin after the failover: got %+v, want the completed attempt 1 replayed with %q", res, body)
		}
	}
	fresh := newSubject(t, store)
	if res := fresh.mustBegin(sm.BeginRequest{}); !res.Acquired || res.Lease.Attempt != 1 {
		t.Fatalf("begin of a new key after the failover: got %+v", res)
	}
	if _, err := fresh.complete("after failover"); err != nil {
		t.Fatalf("complete after the failover: %v", err)
	}
}

// beginCall is the outcome of one begin.
type beginCall struct {
	key string
	res sm.BeginResult
	err error
}

// beginUntil calls begin, on s's key and on new keys of s's tenant, until
// stop is called; stop returns the outcomes.
func beginUntil(store sm.Store, s *subject) (stop func() []beginCall) {
	var (
		calls []beginCall
		wg    sync.WaitGroup
	)
	quit := make(chan struct{})
	wg.Go(func() {
		for {
			for _, key := range []string{s.key, idemtest.Unique("new")} {
				res, err := store.Begin(ctx, s.tenant, sm.BeginRequest{Key: key})
				calls = append(calls, beginCall{key, res, err})
			}
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() []beginCall {
		close(quit)
		wg.Wait()
		return calls
	}
}

// TestRetryElsewhereWaitsForReplicas: a complete whose WAIT timed out is
// retried through another idemsvc instance, as a caller would. The retry's
// connection has written nothing yet; WAIT must still not confirm before
// the replica has the first run's write, so the retry answers 503 until
// the replica is back.
func TestRetryElsewhereWaitsForReplicas(t *testing.T) {
	t.Parallel()
	st := redistest.NewSentinel(t)
	open := func() *redisstore.Store {
		client := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: st.MasterName(), SentinelAddrs: st.Addrs(), ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { _ = client.Close() })
		// WAIT's timeout leaves a loaded machine's replica time to confirm;
		// a paused replica never does.
		return redisstore.New(client, redisstore.Options{WaitReplicas: 1, WaitTimeout: time.Second})
	}
	first, second := open(), open()
	replica := st.Replica(t)

	s := newSubject(t, first)
	res := s.mustBegin(sm.BeginRequest{Owner: "worker-1"})
	resume := replica.Pause(t)
	if _, err := s.complete("paid"); !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Fatalf("complete with the replica hung: got %v, want store unavailable", err)
	}
	retry := sm.CompleteRequest{Key: s.key, Token: res.Lease.Token, Response: sm.Response{Body: "paid"}}
	if _, err := second.Complete(context.Background(), s.tenant, retry); !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Fatalf("complete retried elsewhere with the replica hung: got %v, want store unavailable", err)
	}
	resume()
	if _, err := second.Complete(context.Background(), s.tenant, retry); err != nil {
		t.Fatalf("complete retried once the replica is back: %v", err)
	}
}
