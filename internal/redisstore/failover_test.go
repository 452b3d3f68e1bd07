// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// Failover availability (contract, "Failure behaviour"): after a master
// fails, calls for its keys succeed again within 3 s of Redis promoting a
// replica, with any WAIT the surviving replicas can satisfy, and no answer
// carries a redirect. Each topology has two replicas per master, so that
// after a failover the promoted replica still has one to confirm WAIT 1.
// A master is killed (connections refused), brought back, then paused
// (connections hang) and resumed. Probers call begin on fresh keys of the
// failing master through a store with WAIT 0, one with WAIT 1, and the
// HTTP service over a third; each logs one "failover:" line per fault,
// which benchmarks/failover.sh collects. One setup per topology serves
// both faults, so the test takes about 15 s.

const (
	// failoverBound is the contract's bound, from the promotion to the
	// first successful call.
	failoverBound = 3 * time.Second
	// probeInterval is the pause between one prober's calls.
	probeInterval = 10 * time.Millisecond
	// recoveryWait is how long after the promotion the test waits for
	// every prober to succeed before it gives up on them.
	recoveryWait = 20 * time.Second
	// promotionWait bounds the wait for a replica's promotion.
	promotionWait = 20 * time.Second
)

func TestFailoverAvailability(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cluster := redistest.NewClusterWith(t, redistest.ClusterOptions{ReplicasPerMaster: 2, Private: true})
		newClient := func() redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		probers := newProbers(t, newClient)
		ref := redisstore.Key(handlers.DefaultTenant, idemtest.Unique("ref"))
		for _, f := range []fault{faultKill, faultPause} {
			victim := cluster.MasterOf(t, ref)
			replicas := cluster.ReplicasOf(t, victim)
			if len(replicas) != 2 {
				t.Fatalf("master %s has %d replicas, want 2", victim.Addr(), len(replicas))
			}
			keys := keysOn(t, cluster, victim)
			measureFailover(t, "cluster", f, probers, keys, replicaAddrs(replicas...), func() (restore func()) {
				if f == faultPause {
					return victim.Pause(t)
				}
				victim.Kill(t)
				return func() { victim.Start(t) }
			}, cluster.WaitHealthy)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		st := redistest.NewSentinelWith(t, redistest.SentinelOptions{Replicas: 2})
		newClient := func() redis.UniversalClient {
			c := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: st.MasterName(), SentinelAddrs: st.Addrs(), ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		probers := newProbers(t, newClient)
		keys := func() string { return idemtest.Unique("k") }
		for _, f := range []fault{faultKill, faultPause} {
			victim := st.Master(t)
			replicas := st.Replicas(t)
			addrs := make([]string, len(replicas))
			for i, r := range replicas {
				addrs[i] = r.Addr()
			}
			measureFailover(t, "sentinel", f, probers, keys, addrs, func() (restore func()) {
				if f == faultPause {
					return victim.Pause(t)
				}
				victim.Kill(t)
				return func() { victim.Start(t) }
			}, st.WaitHealthy)
		}
	})
}

type fault string

const (
	faultKill  fault = "kill"
	faultPause fault = "pause"
)

// prober calls begin, once per call of its call function, on a new key.
type prober struct {
	name string
	call func(key string) error
}

// newProbers returns the probers of one topology: stores with WAIT 0 and
// WAIT 1, each with a client of its own, and the HTTP service over a third
// store with WAIT 0.
func newProbers(t *testing.T, newClient func() redis.UniversalClient) []prober {
	t.Helper()
	var probers []prober
	for _, wait := range []int{0, 1} {
		store := redisstore.New(newClient(), redisstore.Options{WaitReplicas: wait})
		probers = append(probers, prober{fmt.Sprintf("store wait=%d", wait), func(key string) error {
			_, err := store.Begin(ctx, handlers.DefaultTenant, sm.BeginRequest{Key: key})
			if err != nil && !errors.Is(err, sm.ErrStoreUnavailable) {
				return fmt.Errorf("not store unavailable: %w", err)
			}
			return err
		}})
	}
	srv := idemtest.Serve(t, handlers.Config{Store: redisstore.New(newClient(), redisstore.Options{})})
	client, err := idem.NewClientWithResponses(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	probers = append(probers, prober{"http wait=0", func(key string) error {
		res, err := client.BeginWithResponse(ctx, idem.BeginRequest{Key: key})
		switch {
		case err != nil:
			return err
		case res.StatusCode() == http.StatusCreated:
			return nil
		case res.StatusCode() == http.StatusServiceUnavailable && strings.Contains(string(res.Body), "store-unavailable") &&
			res.HTTPResponse.Header.Get("Retry-After") != "":
			return fmt.Errorf("503 %s", res.Body)
		}
		return fmt.Errorf("not store unavailable: %d %s", res.StatusCode(), res.Body)
	}})
	return probers
}

// probeCall is the outcome of one call.
type probeCall struct {
	end time.Time
	err error
}

// measureFailover runs the probers, lets them succeed, fails the master
// (inject), waits for a replica at one of candidates to report itself
// master, and waits until every prober succeeded again; then it restores
// the failed master and waits until heal says the setup is healthy, the
// probers still calling. It asserts the contract's bound and that no
// failure, until then, carries a redirect or is anything but store
// unavailable, and logs the figures.
func measureFailover(t *testing.T, topology string, f fault, probers []prober, keys func() string, candidates []string,
	inject func() (restore func()), heal func(testing.TB)) {
	t.Helper()
	calls := make([][]probeCall, len(probers))
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, p := range probers {
		wg.Go(func() {
			for {
				err := p.call(keys())
				mu.Lock()
				calls[i] = append(calls[i], probeCall{time.Now(), err})
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-time.After(probeInterval):
				}
			}
		})
	}
	stopProbers := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopProbers()
	succeededSince := func(i int, since time.Time) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range calls[i] {
			if c.err == nil && c.end.After(since) {
				return c.end, true
			}
		}
		return time.Time{}, false
	}
	allSucceededSince := func(since time.Time) bool {
		for i := range probers {
			if _, ok := succeededSince(i, since); !ok {
				return false
			}
		}
		return true
	}

	warm := time.Now()
	idemtest.Eventually(t, 10*time.Second, "every prober succeeds before the fault", func() bool { return allSucceededSince(warm) })
	faultAt := time.Now()
	restore := inject()
	promotedAt, promoted := waitPromotion(t, candidates)
	deadline := promotedAt.Add(recoveryWait)
	for !allSucceededSince(promotedAt) && time.Now().Before(deadline) {
		time.Sleep(probeInterval)
	}
	restore()
	heal(t)
	stopProbers()

	for i, p := range probers {
		var lastBefore time.Time
		for _, c := range calls[i] {
			if c.err == nil && c.end.Before(faultAt) {
				lastBefore = c.end
			}
			if c.err == nil {
				continue
			}
			if msg := c.err.Error(); strings.Contains(msg, "MOVED") || strings.Contains(msg, "ASK ") {
				t.Errorf("%s, %s: an answer carries a redirect: %v", p.name, f, c.err)
			}
			if strings.HasPrefix(c.err.Error(), "not store unavailable") {
				t.Errorf("%s, %s: %v", p.name, f, c.err)
			}
		}
		errs := 0
		for _, c := range calls[i] {
			if c.err != nil {
				errs++
			}
		}
		first, ok := succeededSince(i, promotedAt)
		recovery, outage := "none", "none"
		if ok {
			recovery = fmt.Sprintf("%.2fs", first.Sub(promotedAt).Seconds())
			outage = fmt.Sprintf("%.2fs", first.Sub(lastBefore).Seconds())
		}
		t.Logf("failover: topology=%s fault=%s via=%s promotion=%.2fs recovery=%s outage=%s calls=%d failed=%d",
			topology, f, p.name, promotedAt.Sub(faultAt).Seconds(), recovery, outage, len(calls[i]), errs)
		switch {
		case !ok:
			t.Errorf("%s, %s: no successful call within %v of the promotion of %s", p.name, f, recoveryWait, promoted)
		case first.Sub(promotedAt) > failoverBound:
			t.Errorf("%s, %s: first successful call %v after the promotion of %s, want at most %v",
				p.name, f, first.Sub(promotedAt), promoted, failoverBound)
		}
	}
}

// waitPromotion polls the servers at addrs until one reports role:master,
// and returns when it first did and its address.
func waitPromotion(t *testing.T, addrs []string) (time.Time, string) {
	t.Helper()
	clients := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
		defer clients[i].Close()
	}
	deadline := time.Now().Add(promotionWait)
	for time.Now().Before(deadline) {
		for i, c := range clients {
			role, err := c.Do(ctx, "ROLE").Slice()
			if err == nil && len(role) > 0 && role[0] == "master" {
				return time.Now(), addrs[i]
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no replica among %v was promoted within %v", addrs, promotionWait)
	return time.Time{}, ""
}

// keysOn returns a source of new keys of tenant DefaultTenant whose hash
// slots master serves.
func keysOn(t *testing.T, cluster *redistest.Cluster, master *redistest.Node) func() string {
	t.Helper()
	rdb := master.Client(t)
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ranges = slices.DeleteFunc(ranges, func(r redis.ClusterSlot) bool { return r.Nodes[0].Addr != master.Addr() })
	const candidates = 15000
	names := make([]string, candidates)
	cmds := make([]*redis.IntCmd, candidates)
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range names {
			names[i] = idemtest.Unique("k")
			cmds[i] = p.ClusterKeySlot(ctx, redisstore.Key(handlers.DefaultTenant, names[i]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i, cmd := range cmds {
		slot := int(cmd.Val())
		if slices.ContainsFunc(ranges, func(r redis.ClusterSlot) bool { return r.Start <= slot && slot <= r.End }) {
			keys = append(keys, names[i])
		}
	}
	if len(keys) < candidates/4 {
		t.Fatalf("%d of %d keys fall on master %s, want about a third", len(keys), candidates, master.Addr())
	}
	var mu sync.Mutex
	next := 0
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		if next == len(keys) {
			t.Error("keysOn: out of keys")
			next = 0
		}
		next++
		return keys[next-1]
	}
}

func replicaAddrs(nodes ...*redistest.Node) []string {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}
