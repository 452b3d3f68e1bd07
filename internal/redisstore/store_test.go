// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// resender runs every script twice, as go-redis does when it retries a call
// whose first run happened but whose reply was lost, and keeps both replies.
type resender struct {
	mu      sync.Mutex
	replies [][2]any
}

func (r *resender) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *resender) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (r *resender) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		first := cmd.(*redis.Cmd).Val()
		time.Sleep(2 * time.Millisecond) // so that a second run that changed the record shows it
		err := next(ctx, cmd)
		r.mu.Lock()
		r.replies = append(r.replies, [2]any{first, cmd.(*redis.Cmd).Val()})
		r.mu.Unlock()
		return err
	}
}

// last returns the two replies of the last script run.
func (r *resender) last() (first, second []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.replies[len(r.replies)-1]
	return p[0].([]any), p[1].([]any)
}

// forEachRedis runs test with a client of the shared standalone server and one of the shared cluster.
func forEachRedis(t *testing.T, test func(t *testing.T, client redis.UniversalClient)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		test(t, redistest.SharedServer(t).Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		test(t, redistest.SharedCluster(t).Client(t))
	})
}

func TestResentScriptAnswersAsTheFirstRun(t *testing.T) {
	forEachRedis(t, func(t *testing.T, client redis.UniversalClient) {
		hook := &resender{}
		client.AddHook(hook)
		s := newSubject(t, redisstore.New(client, redisstore.Options{}))
		sameAnswer := func(op string) {
			t.Helper()
			first, second := hook.last()
			// Element 1 is the time of the run; code and record must match.
			if first[0] != second[0] || !reflect.DeepEqual(first[2:], second[2:]) {
				t.Errorf("%s: the second run answered %q, the first %q", op, second, first)
			}
		}

		res := s.mustBegin(sm.BeginRequest{}) // no owner: only the token tells the re-run
		sameAnswer("begin")
		if !res.Acquired || res.Lease.Attempt != 1 {
			t.Fatalf("begin: got %+v, want attempt 1 acquired", res)
		}
		before := s.status()
		if _, err := s.extend(time.Minute); err != nil {
			t.Fatal(err)
		}
		sameAnswer("extend")
		if _, err := s.complete("once"); err != nil {
			t.Fatal(err)
		}
		sameAnswer("complete")
		after := s.status()
		if after.Attempt != 1 || after.CreatedAt != before.CreatedAt || string(after.Response.Body) != "once" {
			t.Errorf("after: got %+v", after)
		}

		for _, retryable := range []bool{false, true} {
			f := newSubject(t, s.store)
			f.mustBegin(sm.BeginRequest{})
			if _, err := f.fail(retryable); err != nil {
				t.Fatal(err)
			}
			sameAnswer("fail")
		}
	})
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	forEachRedis(t, func(t *testing.T, client redis.UniversalClient) {
		s := newSubject(t, redisstore.New(client, redisstore.Options{}))
		flushScripts(t, client)
		s.mustBegin(sm.BeginRequest{})
		flushScripts(t, client)
		if _, err := s.complete("after flush"); err != nil {
			t.Fatalf("complete after SCRIPT FLUSH: %v", err)
		}
		flushScripts(t, client)
		if rec := s.status(); rec.State != sm.StateCompleted {
			t.Fatalf("status after SCRIPT FLUSH: got %+v", rec)
		}
	})
}

// flushScripts empties the script cache of every node, as a restart or a
// replica's promotion does.
func flushScripts(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	var err error
	if c, ok := client.(*redis.ClusterClient); ok {
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() })
	} else {
		err = client.ScriptFlush(ctx).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestScriptsSurviveRestart(t *testing.T) {
	srv := redistest.NewServer(t)
	s := newSubject(t, redisstore.New(srv.Client(t), redisstore.Options{}))
	s.mustBegin(sm.BeginRequest{})
	srv.Restart(t)
	// The restarted server kept nothing: the key is new, and the scripts load again.
	res := s.mustBegin(sm.BeginRequest{})
	if !res.Acquired || res.Lease.Attempt != 1 {
		t.Fatalf("begin after restart: got %+v", res)
	}
	if _, err := s.complete("ok"); err != nil {
		t.Fatal(err)
	}
}

// TestRedisDownFailsClosed: with Redis stopped or hung, every operation
// answers ErrStoreUnavailable within the timeout, never a lease; and the
// store works again once Redis is back.
func TestRedisDownFailsClosed(t *testing.T) {
	const timeout = 300 * time.Millisecond
	srv := redistest.NewServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redisstore.Options{Timeout: timeout})
	s := newSubject(t, store)
	s.mustBegin(sm.BeginRequest{})

	ops := map[string]func() error{
		"begin":    func() error { _, err := s.begin(sm.BeginRequest{Key: s.key}); return err },
		"complete": func() error { _, err := s.complete("x"); return err },
		"fail":     func() error { _, err := s.fail(true); return err },
		"extend":   func() error { _, err := s.extend(time.Second); return err },
		"status":   func() error { _, err := store.Status(ctx, s.tenant, s.key, false); return err },
		"delete":   func() error { return store.Delete(ctx, s.tenant, s.key) },
		"ping":     func() error { return store.Ping(ctx) },
	}
	check := func(how string) {
		t.Helper()
		for name, op := range ops {
			start := time.Now()
			err := op()
			if took := time.Since(start); took > 2*timeout {
				t.Errorf("%s, %s: took %v, want at most about %v", how, name, took, timeout)
			}
			if !errors.Is(err, sm.ErrStoreUnavailable) {
				t.Errorf("%s, %s: got %v, want store unavailable", how, name, err)
			}
		}
	}

	resume := srv.Pause(t)
	check("paused")
	resume()

	srv.Stop(t)
	check("stopped")
	srv.Start(t)
	if err := store.Ping(ctx); err != nil {
		t.Fatalf("ping after Redis came back: %v", err)
	}
	if res := s.mustBegin(sm.BeginRequest{}); !res.Acquired {
		t.Fatalf("begin after Redis came back: got %+v", res)
	}
}

func TestKeysOfOneTenantSpreadOverSlots(t *testing.T) {
	cluster := redistest.SharedCluster(t)
	client := cluster.Client(t)
	store := redisstore.New(client, redisstore.Options{})
	tenant := idemtest.Unique("t")
	slots := map[int64]bool{}
	masters := map[string]bool{}
	for i := range 100 {
		key := idemtest.Unique("k")
		if _, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key}); err != nil {
			t.Fatal(err)
		}
		rk := redisstore.Key(tenant, key)
		slot, err := client.ClusterKeySlot(ctx, rk).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
		if i < 30 {
			masters[cluster.MasterOf(t, rk).Addr()] = true
		}
	}
	if len(slots) < 90 || len(masters) != 3 {
		t.Errorf("100 keys of one tenant took %d slots on %d masters, want about 100 on all 3", len(slots), len(masters))
	}
}

func TestRedisKey(t *testing.T) {
	// Stored records are found by this name: it must never change.
	got := redisstore.Key("payments", "order-1")
	want := "idem:{payments:0bafe22156d2698c143b86040446d366ead863ba600d5c924f3d15c786ef4057}"
	if got != want {
		t.Errorf("RedisKey = %q, want %q", got, want)
	}
}

// TestWaitReplicas: with WaitReplicas, a transition is acknowledged only
// once the key's replica has it; with that replica hung it answers
// ErrStoreUnavailable, and the caller's retry is safe.
func TestWaitReplicas(t *testing.T) {
	cluster := redistest.NewCluster(t)
	client := cluster.Client(t)
	store := redisstore.New(client, redisstore.Options{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	s := newSubject(t, store)
	flushScripts(t, client) // the pipelined EVALSHA meets NOSCRIPT first
	res := s.mustBegin(sm.BeginRequest{})
	if !res.Acquired {
		t.Fatalf("begin with healthy replicas: got %+v", res)
	}

	master := cluster.MasterOf(t, redisstore.Key(s.tenant, s.key))
	replicas := cluster.ReplicasOf(t, master)
	if len(replicas) != 1 {
		t.Fatalf("master %s has %d replicas, want 1", master.Addr(), len(replicas))
	}
	resume := replicas[0].Pause(t)
	start := time.Now()
	_, err := s.complete("paid")
	if !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Fatalf("complete with the replica hung: got %v, want store unavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("complete with the replica hung took %v, want about the 300ms WAIT timeout", took)
	}
	resume()

	// The script ran; the retry with the same token answers as a completion.
	done, err := s.complete("paid")
	if err != nil {
		t.Fatalf("retried complete: %v", err)
	}
	if done.State != sm.StateCompleted || string(s.status().Response.Body) != "paid" {
		t.Errorf("after the retry: got %+v", done)
	}
	if err := store.Delete(ctx, s.tenant, s.key); err != nil {
		t.Errorf("delete with healthy replicas: %v", err)
	}

	// After a failover the key's slot has a new master: the store follows
	// the MOVED redirect and still waits for the new master's replica.
	if err := replicas[0].Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	for cluster.MasterOf(t, redisstore.Key(s.tenant, s.key)).Addr() != replicas[0].Addr() {
		time.Sleep(50 * time.Millisecond)
	}
	cluster.WaitHealthy(t)
	if res := s.mustBegin(sm.BeginRequest{}); !res.Acquired {
		t.Fatalf("begin after the failover: got %+v", res)
	}
	if _, err := s.complete("after failover"); err != nil {
		t.Fatalf("complete after the failover: %v", err)
	}
}

// TestMemoryUsageOfACompletedRecord holds the record layout to its budget:
// at most 600 bytes for a completed record with a 200-byte body.
func TestMemoryUsageOfACompletedRecord(t *testing.T) {
	client := redistest.SharedServer(t).Client(t)
	store := redisstore.New(client, redisstore.Options{})
	tenant, key := "payments", idemtest.Unique("order")
	res, err := store.Begin(ctx, tenant, sm.BeginRequest{
		Key: key, Owner: "7f9c2ba4-e88f-4a2c-9d4e-3b1f0c6a8d21",
		Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
	})
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("abcdefghijklmnopqrstuvwxyz", 8)[:200]
	_, err = store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: sm.Response{
		StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: body,
	}})
	if err != nil {
		t.Fatal(err)
	}
	usage, err := client.MemoryUsage(ctx, redisstore.Key(tenant, key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE of a completed record with a 200-byte body: %d bytes", usage)
	if usage > 600 {
		t.Errorf("MEMORY USAGE = %d bytes, want at most 600", usage)
	}
}
