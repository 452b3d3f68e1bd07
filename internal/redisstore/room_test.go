// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	answers "github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// Room for outcomes (contract, "Failure behaviour"): a Redis with
// maxmemory 32 MiB is filled until less than the 8 MiB reserve is free.
// Begins that would acquire are refused with ErrNoRoom, which is
// ErrStoreUnavailable and changes nothing; a finished record still
// replays and the owner of a live lease still gets it back; the attempts
// already running extend, fail and complete with 1 MiB answers. Once the
// filler is gone, begins acquire again.
func TestRoomForOutcomes(t *testing.T) {
	t.Parallel()
	srv := redistest.NewPrivateServer(t) // its configuration changes
	admin := srv.Client(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	const reserve = 8 << 20
	store := redisstore.New(client, redisstore.Options{ReserveBytes: reserve})
	mustConfigSet(t, admin, "maxmemory", "32mb")

	rooms := store.RefreshRoom(ctx)
	if len(rooms) != 1 || rooms[0].Node != srv.Addr() || rooms[0].Refusal != nil || rooms[0].Memory.Max != 32<<20 ||
		rooms[0].Memory.Headroom() < 24<<20 {
		t.Fatalf("rooms of an empty Redis = %+v, want %s with about 32 MiB free", rooms, srv.Addr())
	}
	done := newSubject(t, store)
	done.mustBegin(sm.BeginRequest{})
	if _, err := done.complete("paid"); err != nil {
		t.Fatal(err)
	}
	owned := newSubject(t, store)
	ownedLease := owned.mustBegin(sm.BeginRequest{Owner: "worker-1"}).Lease
	running := make([]*subject, 4)
	for i := range running {
		running[i] = newSubject(t, store)
		running[i].mustBegin(sm.BeginRequest{})
	}

	// Fill with 256 KiB values until the headroom is under the reserve,
	// but with 6 MiB left for the outcomes.
	filler := strings.Repeat("f", 256<<10)
	for i := 0; store.RefreshRoom(ctx)[0].Refusal == nil; i++ {
		if err := admin.Set(ctx, fmt.Sprintf("filler-%d", i), filler, 0).Err(); err != nil || i > 200 {
			t.Fatalf("filling: %v after %d values", err, i)
		}
	}
	room := store.Rooms()[0]
	t.Logf("filled: %d bytes free under maxmemory; refusal: %v", room.Memory.Headroom(), room.Refusal)
	if h := room.Memory.Headroom(); h < 6<<20 || h >= reserve {
		t.Fatalf("headroom %d, want 6 MiB to the 8 MiB reserve", h)
	}
	if !errors.Is(room.Refusal, sm.ErrNoRoom) || !strings.Contains(room.Refusal.Error(), srv.Addr()) {
		t.Errorf("refusal = %v, want ErrNoRoom naming %s", room.Refusal, srv.Addr())
	}
	wantFailures(t, store, "reserve "+srv.Addr())

	fresh := newSubject(t, store)
	if _, err := fresh.begin(sm.BeginRequest{}); !errors.Is(err, sm.ErrNoRoom) || !errors.Is(err, sm.ErrStoreUnavailable) {
		t.Errorf("begin of a new key: %v, want ErrNoRoom (store unavailable)", err)
	}
	if got := fresh.shape(); got != absent {
		t.Errorf("after the refused begin: %+v, want no record", got)
	}
	if res := done.mustBegin(sm.BeginRequest{}); res.Acquired || res.Record.Response.Body != "paid" {
		t.Errorf("begin of a completed key: %+v, want its replay", res)
	}
	if res := owned.mustBegin(sm.BeginRequest{Owner: "worker-1"}); !res.Acquired || res.Lease != ownedLease {
		t.Errorf("begin by the lease's owner: %+v, want its lease %+v", res, ownedLease)
	}

	answer := answers.Incompressible(1<<20-100, 1) // stored as sent: compression cannot help
	if _, err := running[0].extend(shortLease); err != nil {
		t.Errorf("extend: %v", err)
	}
	if _, err := running[1].fail(false); err != nil {
		t.Errorf("fail: %v", err)
	}
	for _, s := range append(running[2:], owned) {
		if _, err := s.complete(answer); err != nil {
			t.Errorf("complete of 1 MiB within the reserve: %v", err)
		}
	}

	if err := admin.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r := store.RefreshRoom(ctx)[0]; r.Refusal != nil {
		t.Fatalf("after the filler went: %+v, want no refusal", r)
	}
	wantFailures(t, store)
	if res := fresh.mustBegin(sm.BeginRequest{}); !res.Acquired {
		t.Errorf("begin after the filler went: %+v, want acquired", res)
	}

	// Without maxmemory there is no reserve to keep.
	mustConfigSet(t, admin, "maxmemory", "0")
	if r := store.RefreshRoom(ctx)[0]; r.Refusal != nil || r.Memory.Headroom() != math.MaxInt64 {
		t.Errorf("without maxmemory: %+v, want no refusal and unbounded headroom", r)
	}
}

// An evicting policy set at run time refuses begins that would acquire on
// that master with ErrEvicting, and only there; replays go on, and begins
// acquire again once the policy is noeviction, or at once with
// AllowEviction.
func TestEvictingPolicyRefusesBegins(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.NewPrivateServer(t) // its configuration changes
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		store := redisstore.New(client, redisstore.Options{})
		allowing := redisstore.New(client, redisstore.Options{AllowEviction: true})
		done := newSubject(t, store)
		done.mustBegin(sm.BeginRequest{})
		if _, err := done.complete("paid"); err != nil {
			t.Fatal(err)
		}

		mustConfigSet(t, srv.Client(t), "maxmemory-policy", "volatile-lru")
		for _, s := range []*redisstore.Store{store, allowing} {
			s.RefreshRoom(ctx)
		}
		if _, err := newSubject(t, store).begin(sm.BeginRequest{}); !errors.Is(err, sm.ErrEvicting) || !errors.Is(err, sm.ErrStoreUnavailable) {
			t.Errorf("begin of a new key: %v, want ErrEvicting (store unavailable)", err)
		}
		if res := done.mustBegin(sm.BeginRequest{}); res.Acquired || res.Record.Response.Body != "paid" {
			t.Errorf("begin of a completed key: %+v, want its replay", res)
		}
		if res := newSubject(t, allowing).mustBegin(sm.BeginRequest{}); !res.Acquired {
			t.Errorf("begin with AllowEviction: %+v, want acquired", res)
		}

		mustConfigSet(t, srv.Client(t), "maxmemory-policy", "noeviction")
		store.RefreshRoom(ctx)
		if res := newSubject(t, store).mustBegin(sm.BeginRequest{}); !res.Acquired {
			t.Errorf("begin after noeviction came back: %+v, want acquired", res)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.NewClusterWith(t, redistest.ClusterOptions{Private: true}) // its configuration changes
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		store := redisstore.New(client, redisstore.Options{})
		tenant := idemtest.Unique("t")
		// keysOf returns a key of tenant whose record master serves, and
		// one whose record another master serves.
		victim := c.Nodes()[0]
		var onVictim, elsewhere string
		for i := 0; onVictim == "" || elsewhere == ""; i++ {
			key := "order-" + strconv.Itoa(i)
			if c.MasterOf(t, redisstore.Key(tenant, key)).Addr() == victim.Addr() {
				onVictim = key
			} else {
				elsewhere = key
			}
		}
		done, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: onVictim + "-done"})
		if err != nil {
			t.Fatal(err)
		}
		doneKey := onVictim + "-done"
		if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: doneKey, Token: done.Lease.Token, Response: sm.Response{Body: "paid"}}); err != nil {
			t.Fatal(err)
		}

		mustConfigSet(t, victim.Client(t), "maxmemory-policy", "allkeys-lru")
		refusing := 0
		for _, r := range store.RefreshRoom(ctx) {
			if r.Refusal != nil {
				refusing++
				if r.Node != victim.Addr() || !errors.Is(r.Refusal, sm.ErrEvicting) {
					t.Errorf("refusal %v of %s, want ErrEvicting of %s alone", r.Refusal, r.Node, victim.Addr())
				}
			}
		}
		if refusing != 1 {
			t.Errorf("%d masters refuse begins, want 1", refusing)
		}
		if _, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: onVictim}); !errors.Is(err, sm.ErrEvicting) {
			t.Errorf("begin on the evicting master: %v, want ErrEvicting", err)
		}
		if res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: elsewhere}); err != nil || !res.Acquired {
			t.Errorf("begin on another master: %+v, %v; want acquired", res, err)
		}
		if res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: doneKey}); err != nil || res.Acquired || res.Record.Response.Body != "paid" {
			t.Errorf("begin of a completed key on the evicting master: %+v, %v; want its replay", res, err)
		}
		mustConfigSet(t, victim.Client(t), "maxmemory-policy", "noeviction")
		store.RefreshRoom(ctx)
		if res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: onVictim}); err != nil || !res.Acquired {
			t.Errorf("begin after noeviction came back: %+v, %v; want acquired", res, err)
		}
	})
}

// TestOutcomeHeadroom measures the free memory under maxmemory that a
// complete of a response of n bytes needs on a noeviction Redis (its
// arguments count against maxmemory while they arrive, then the record
// stays): the least, to 2%, as a multiple of n, found by setting maxmemory
// just above what the node counts. The reserve's default rests on it
// staying under 1.5 (docs/redis.md, "Room for outcomes"); and a complete with
// less free than its own size is refused, which is why the reserve exists.
func TestOutcomeHeadroom(t *testing.T) {
	t.Parallel()
	srv := redistest.NewPrivateServer(t) // its configuration changes
	admin := srv.Client(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.Options{ReserveBytes: -1})
	counted := func() int64 {
		m, err := admin.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		used, _ := strconv.ParseInt(infoField(m, "used_memory"), 10, 64)
		notCounted, _ := strconv.ParseInt(infoField(m, "mem_not_counted_for_evict"), 10, 64)
		return used - notCounted
	}
	for _, n := range []int{16 << 10, 256 << 10, 1<<20 - 100} {
		s := newSubject(t, store)
		body := answers.Incompressible(n, uint64(n)) // stored as sent: compression cannot help
		// fits begins the key (with no maxmemory) and completes it with
		// factor × n bytes free; it reports whether the complete was stored.
		fits := func(factor float64) bool {
			mustConfigSet(t, admin, "maxmemory", "0")
			if st := s.status(); st == nil || st.State != sm.StateInProgress {
				if err := s.store.Delete(ctx, s.tenant, s.key); err != nil {
					t.Fatal(err)
				}
				s.mustBegin(sm.BeginRequest{})
			}
			mustConfigSet(t, admin, "maxmemory", strconv.FormatInt(counted()+int64(factor*float64(n)), 10))
			_, err := s.complete(body)
			mustConfigSet(t, admin, "maxmemory", "0")
			if err != nil && !errors.Is(err, sm.ErrStoreUnavailable) {
				t.Fatalf("complete: %v", err)
			}
			return err == nil
		}
		low, high := 0.5, 2.0
		if fits(low) || !fits(high) {
			t.Fatalf("%d bytes: a complete fits with %.1f× free, or not with %.1f×", n, low, high)
		}
		for high-low > 0.02 {
			if mid := (low + high) / 2; fits(mid) {
				high = mid
			} else {
				low = mid
			}
		}
		t.Logf("headroom: a complete of %d bytes needs %.2f× its size free under maxmemory", n, high)
		if high > 1.5 || high < 0.9 {
			t.Errorf("a complete of %d bytes needs %.2f× its size free, want 0.9× to 1.5×", n, high)
		}
	}
}
