// SPDX-License-Identifier: Apache-2.0

package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var ctx = context.Background()

func tenantName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

// backends are the places counts live: this process, one Redis node, and
// a Cluster.
func backends() map[string]func(t *testing.T) backend {
	return map[string]func(t *testing.T) backend{
		"memory": func(*testing.T) backend {
			return NewMemory(Options{}).(*limiter).backend
		},
		"redis": func(t *testing.T) backend {
			return &redisBackend{client: redistest.SharedServer(t).Client(t)}
		},
		"cluster": func(t *testing.T) backend {
			return &redisBackend{client: redistest.SharedCluster(t).Client(t)}
		},
	}
}

// Stored bytes count until the end of the minute they expire in; the
// minutes that are over are dropped.
func TestStoredBytesByExpiry(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			b, tenant := open(t), tenantName()
			now := time.Now().UnixMilli() / bucketMs
			total, first, err := b.addBytes(ctx, tenant, map[int64]int64{now - 2: 1000, now + 1: 10, now + 5: 5})
			if err != nil {
				t.Fatal(err)
			}
			if total != 15 || first.UnixMilli() != (now+1)*bucketMs {
				t.Errorf("total, first = %d, %v; want 15, the end of the next minute", total, first)
			}
			total, _, err = b.addBytes(ctx, tenant, nil)
			if err != nil || total != 15 {
				t.Errorf("read again: %d, %v; want 15", total, err)
			}
			if rb, ok := b.(*redisBackend); ok {
				key := limitKey(tenant, "bytes")
				fields, err := rb.client.HKeys(ctx, key).Result()
				if err != nil || len(fields) != 2 {
					t.Errorf("hash fields %v, %v: want the two minutes to come", fields, err)
				}
				if ttl := rb.client.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 6*time.Minute {
					t.Errorf("the hash expires in %v, want with its last minute", ttl)
				}
			}
		})
	}
}

// addSlot counts one member, as a waiter is counted.
func addSlot(b backend, tenant, set, id string, limit int64, ttl time.Duration) (bool, error) {
	got, err := b.addSlots(ctx, tenant, set, []string{id}, limit, ttl)
	return got == 1, err
}

// A waiter is counted until it is removed, or until its time is over when
// nobody removes it (its instance died).
func TestWaitersLapse(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			b, tenant := open(t), tenantName()
			ok, err := addSlot(b, tenant, setWaiters, "a", 2, 200*time.Millisecond)
			if err != nil || !ok {
				t.Fatalf("first: %v, %v", ok, err)
			}
			if ok, _ := addSlot(b, tenant, setWaiters, "b", 2, time.Minute); !ok {
				t.Fatal("second refused under a limit of 2")
			}
			if ok, _ := addSlot(b, tenant, setWaiters, "c", 2, time.Minute); ok {
				t.Fatal("third counted over a limit of 2")
			}
			if err := b.removeSlot(ctx, tenant, setWaiters, "b"); err != nil {
				t.Fatal(err)
			}
			if ok, _ := addSlot(b, tenant, setWaiters, "c", 2, time.Minute); !ok {
				t.Fatal("refused after a removal")
			}
			time.Sleep(300 * time.Millisecond)
			if ok, _ := addSlot(b, tenant, setWaiters, "d", 2, time.Minute); !ok {
				t.Fatal("a lapsed waiter still counted")
			}
		})
	}
}

// A lease is counted from before its begin until it ends: settled as over
// (complete, fail, not acquired), or at the end settled for it (acquired,
// extended) when nothing ends it first; an end settled by one instance is
// not undone by another's later move of the same lease.
func TestLeasesSettle(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			b, tenant := open(t), tenantName()
			hold := func(token string) bool {
				t.Helper()
				ok, err := addSlot(b, tenant, setLeases, token, 2, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			settle := func(ends map[string]int64) {
				t.Helper()
				if err := b.settleLeases(ctx, tenant, ends); err != nil {
					t.Fatal(err)
				}
			}
			if !hold("a") || !hold("b") {
				t.Fatal("refused under a limit of 2")
			}
			if hold("c") {
				t.Fatal("a third lease counted over a limit of 2")
			}
			settle(map[string]int64{"a": 0}) // completed
			if !hold("c") {
				t.Fatal("refused after a lease ended")
			}
			// b acquired with a lease that ends in 300 ms, and nobody completes it.
			settle(map[string]int64{"b": time.Now().Add(300 * time.Millisecond).UnixMilli(), "a": time.Now().Add(time.Hour).UnixMilli()})
			if hold("d") {
				t.Fatal("counted over the limit while b's lease runs")
			}
			time.Sleep(400 * time.Millisecond)
			if !hold("d") {
				t.Fatal("an expired lease still counted")
			}
			// a ended before: moving it again does not count it again.
			if hold("e") {
				t.Fatal("a lease that ended was counted again by a later move")
			}
		})
	}
}

// An instance takes begins in batches, and never more than the limit
// allows; a tenant at its limit is refused with the time to the next.
func TestRateBatches(t *testing.T) {
	rdb := redistest.SharedServer(t).Client(t)
	for name, l := range map[string]*limiter{
		"memory":                    NewMemory(Options{}).(*limiter),
		"redis":                     NewRedis(rdb, Options{}).(*limiter),
		"redis, one call per begin": NewRedis(rdb, Options{RateBatch: 1}).(*limiter),
	} {
		t.Run(name, func(t *testing.T) {
			defer l.Close()
			tenant := tenantName()
			lim := auth.Limits{BeginsPerS: 200, Burst: 50}
			admitted := 0
			var refused error
			start := time.Now()
			for range 100 {
				if _, err := l.Begin(ctx, tenant, lim); err != nil {
					refused = err
					break
				}
				admitted++
			}
			// 50 at once, and what the rate adds while the loop runs (a
			// loaded machine makes the loop slower, never the bound looser
			// than the rate allows), and one batch taken ahead.
			added := int(time.Since(start).Seconds()*float64(lim.BeginsPerS)) + 1
			if admitted < 50 || admitted > 50+added+l.batchFor(lim) {
				t.Errorf("admitted %d at once, want the burst of 50 and the %d the rate added", admitted, added)
			}
			var e *Error
			if !errors.As(refused, &e) || !errors.Is(refused, ErrRateLimited) || e.Limit != LimitRate || e.RetryAfter != time.Second {
				t.Errorf("refusal %v, want rate-limited retrying after a second", refused)
			}
			if rb, ok := l.backend.(*redisBackend); ok {
				if n := rb.client.Exists(ctx, "rate:"+limitKey(tenant, "begins")).Val(); n != 1 {
					t.Errorf("the rate's key is not where it is named")
				}
			}
		})
	}
}

// Over its stored-bytes budget a tenant's begins are marked, once the
// instance learns the total at a flush; its bytes are still counted.
func TestOverBudget(t *testing.T) {
	for name, newLimiter := range map[string]func(t *testing.T) Limiter{
		"memory": func(*testing.T) Limiter { return NewMemory(Options{FlushInterval: 50 * time.Millisecond}) },
		"redis": func(t *testing.T) Limiter {
			return NewRedis(redistest.SharedServer(t).Client(t), Options{FlushInterval: 50 * time.Millisecond})
		},
	} {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t)
			defer l.Close()
			tenant, lim := tenantName(), auth.Limits{StoredBytes: 100}
			if over, err := l.Begin(ctx, tenant, lim); over || err != nil {
				t.Fatalf("empty: %v, %v", over, err)
			}
			l.Stored(tenant, 60, time.Now().Add(time.Hour))
			l.Stored(tenant, 60, time.Now().Add(time.Hour))
			// This instance knows its own bytes at once.
			if over, _ := l.Begin(ctx, tenant, lim); !over {
				t.Error("not over at 120 of 100")
			}
			err := l.Refused(tenant, lim)
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrQuotaExceeded) || e.Limit != LimitStoredBytes {
				t.Errorf("refusal %v, want quota-exceeded", err)
			}
			if e != nil && (e.RetryAfter < time.Second || e.RetryAfter > time.Hour) {
				t.Errorf("Retry-After %v, want 1 s to an hour", e.RetryAfter)
			}
			// Another tenant is not.
			if over, _ := l.Begin(ctx, tenantName(), lim); over {
				t.Error("another tenant over")
			}
		})
	}
}

// Instances sharing a Redis learn each other's stored bytes at their next
// flush.
func TestOverBudgetAcrossInstances(t *testing.T) {
	rdb := redistest.SharedCluster(t).Client(t)
	a := NewRedis(rdb, Options{FlushInterval: 50 * time.Millisecond})
	b := NewRedis(rdb, Options{FlushInterval: 50 * time.Millisecond})
	defer a.Close()
	defer b.Close()
	tenant, lim := tenantName(), auth.Limits{StoredBytes: 100}
	a.Stored(tenant, 150, time.Now().Add(time.Hour))
	deadline := time.Now().Add(5 * time.Second)
	for {
		over, err := b.Begin(ctx, tenant, lim)
		if err != nil {
			t.Fatal(err)
		}
		if over {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("instance b never learnt that the tenant is over its budget")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Without Redis the limiter lets begins go on to the store (which answers
// 503 itself) rather than refusing them for a limit it cannot check.
func TestRedisDownAdmits(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	l := NewRedis(rdb, Options{Timeout: 100 * time.Millisecond})
	defer l.Close()
	lim := auth.Limits{BeginsPerS: 1, Burst: 1, StoredBytes: 1, Waiters: 1}
	for range 3 {
		if _, err := l.Begin(ctx, "t", lim); err != nil {
			t.Fatalf("begin: %v", err)
		}
	}
	done, err := l.Wait(ctx, "t", lim, time.Second)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	done()
}

// countingBackend counts the reservations made of a backend.
type countingBackend struct {
	backend
	reservations atomic.Int64
}

func (c *countingBackend) addSlots(ctx context.Context, tenant, set string, ids []string, limit int64, ttl time.Duration) (int, error) {
	if set == setLeases {
		c.reservations.Add(1)
	}
	return c.backend.addSlots(ctx, tenant, set, ids, limit, ttl)
}

// A reservation counts as many members as the set has room for, in
// order, and a member counted already (the same call run again) takes no
// room.
func TestSlotsReserveInOrder(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			b, tenant := open(t), tenantName()
			got, err := b.addSlots(ctx, tenant, setLeases, []string{"a", "b", "c"}, 5, time.Minute)
			if err != nil || got != 3 {
				t.Fatalf("first batch: %d, %v; want 3", got, err)
			}
			got, _ = b.addSlots(ctx, tenant, setLeases, []string{"a", "b", "c"}, 5, time.Minute)
			if got != 3 {
				t.Errorf("the same batch again counted %d, want all 3 without room taken", got)
			}
			got, _ = b.addSlots(ctx, tenant, setLeases, []string{"d", "e", "f", "g"}, 5, time.Minute)
			if got != 2 {
				t.Errorf("a batch of 4 with room for 2 counted %d", got)
			}
			if n, _ := b.countSlots(ctx, tenant, setLeases); n != 5 {
				t.Errorf("%d counted, want the limit of 5", n)
			}
			if got, _ := b.addSlots(ctx, tenant, setLeases, []string{"h"}, 5, time.Minute); got != 0 {
				t.Error("counted over the limit")
			}
		})
	}
}

// Each instance reserves a tenant's leases in batches and hands them to
// begins without a call each; the leases held and reserved by all
// instances together never pass in_progress, and begins refused at it
// leave the others at most a batch each; leases that ended, and
// reservations not used, are given back at the flush.
func TestLeaseBatches(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			shared, tenant := open(t), tenantName()
			count := &countingBackend{backend: shared}
			opts := Options{FlushInterval: 50 * time.Millisecond}
			a, b := newLimiter(count, opts), newLimiter(shared, opts)
			defer a.Close()
			defer b.Close()
			lim := auth.Limits{InProgress: 160}
			batch := a.leaseBatchFor(lim)
			if batch != 10 {
				t.Fatalf("batch %d, want in_progress/16", batch)
			}

			// One instance alone: a call per batch, tokens in the store's form.
			var held []string
			for range 4 * batch {
				token, ok := a.Hold(ctx, tenant, lim, time.Minute)
				if !ok || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(token) {
					t.Fatalf("hold under the limit: %q, %v", token, ok)
				}
				held = append(held, token)
			}
			if n := count.reservations.Load(); n != 4 {
				t.Errorf("%d begins made %d reservations, want 4 (batches of %d)", len(held), n, batch)
			}

			// Two instances, in turn, up to the limit.
			refused := 0
			for i := 0; refused < 2; i++ {
				l := a
				if i%2 == 1 {
					l = b
				}
				if token, ok := l.Hold(ctx, tenant, lim, time.Minute); ok {
					held = append(held, token)
				} else {
					refused++
				}
			}
			if n, _ := shared.countSlots(ctx, tenant, setLeases); n != lim.InProgress {
				t.Errorf("%d counted, want the limit of %d", n, lim.InProgress)
			}
			if got := int64(len(held)); got > lim.InProgress || got < lim.InProgress-int64(batch) {
				t.Errorf("%d leases handed out, want within a batch (%d) under the limit of %d", got, batch, lim.InProgress)
			}

			// Leases that ended are given back at the next flush, and the
			// reservations not used after a second.
			for _, token := range held[:20] {
				a.Held(tenant, lim, token, time.Time{})
				b.Held(tenant, lim, token, time.Time{})
			}
			want := int64(len(held) - 20)
			eventually(t, "ended leases and unused reservations given back", func() bool {
				n, _ := shared.countSlots(ctx, tenant, setLeases)
				return n == want
			})
			// A lease acquired is counted until its end, then lapses.
			for _, token := range held[20:] {
				a.Held(tenant, lim, token, time.Now().Add(-leaseMargin+300*time.Millisecond))
			}
			eventually(t, "expired leases lapse", func() bool {
				n, _ := shared.countSlots(ctx, tenant, setLeases)
				return n == 0
			})
		})
	}
}

// Closing an instance gives back the leases it reserved and did not use.
func TestCloseReleasesReservations(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			shared, tenant := open(t), tenantName()
			l := newLimiter(shared, Options{})
			lim := auth.Limits{InProgress: 1000}
			token, ok := l.Hold(ctx, tenant, lim, time.Minute)
			if !ok {
				t.Fatal("refused")
			}
			l.Held(tenant, lim, token, time.Now().Add(time.Minute))
			if n, _ := shared.countSlots(ctx, tenant, setLeases); n != int64(l.leaseBatchFor(lim)) {
				t.Fatalf("%d counted, want a batch of %d", n, l.leaseBatchFor(lim))
			}
			l.Close()
			if n, _ := shared.countSlots(ctx, tenant, setLeases); n != 1 {
				t.Errorf("%d counted after close, want the one lease held", n)
			}
		})
	}
}

// eventually waits up to 5 s for cond (idemtest imports this package).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
	}
}
