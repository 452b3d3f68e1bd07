// SPDX-License-Identifier: Apache-2.0

package redistest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestSharedServerSetGet(t *testing.T) {
	t.Parallel()
	rdb := redistest.SharedServer(t).Client(t)
	ctx := t.Context()
	key := "redistest:" + t.Name()
	if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	got, err := rdb.Get(ctx, key).Result()
	if err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	if redistest.SharedServer(t) != redistest.SharedServer(t) {
		t.Fatal("SharedServer returned different servers")
	}
}

func TestServerRestartEmptiesIt(t *testing.T) {
	t.Parallel()
	s := redistest.NewServer(t)
	rdb := s.Client(t)
	ctx := t.Context()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	sha, err := rdb.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}

	s.Restart(t)

	if err := rdb.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after restart: err = %v, want redis.Nil", err)
	}
	exists, err := rdb.ScriptExists(ctx, sha).Result()
	if err != nil || exists[0] {
		t.Fatalf("SCRIPT EXISTS after restart = %v, %v; want [false]", exists, err)
	}
}

func TestServerStopStart(t *testing.T) {
	t.Parallel()
	s := redistest.NewServer(t)
	rdb := s.Client(t)
	ctx := t.Context()

	s.Stop(t)
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}

	s.Start(t)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
}

func TestServerPause(t *testing.T) {
	t.Parallel()
	s := redistest.NewServer(t)
	resume := s.Pause(t)
	assertNoAnswer(t, s.Addr())
	resume()
	if err := s.Client(t).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}
}

func TestSharedClusterKeys(t *testing.T) {
	t.Parallel()
	c := redistest.SharedCluster(t)
	rdb := c.Client(t)
	ctx := t.Context()
	slots := map[int64]bool{}
	for i := range 100 {
		key := fmt.Sprintf("redistest:%s:%d", t.Name(), i)
		if err := rdb.Set(ctx, key, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		slot, err := rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		slots[slot*3/16384] = true
	}
	if len(slots) != 3 {
		t.Errorf("keys fall into %d of the 3 masters' slot ranges", len(slots))
	}
	for i := range 100 {
		key := fmt.Sprintf("redistest:%s:%d", t.Name(), i)
		got, err := rdb.Get(ctx, key).Int()
		if err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
		}
	}
}

func TestSharedClusterTopology(t *testing.T) {
	t.Parallel()
	c := redistest.SharedCluster(t)
	nodes := c.Nodes()
	if len(nodes) != 6 || len(c.Addrs()) != 6 {
		t.Fatalf("%d nodes, %d addrs; want 6", len(nodes), len(c.Addrs()))
	}
	masters := 0
	for _, n := range nodes {
		if !n.IsMaster() {
			continue
		}
		masters++
		replicas := c.ReplicasOf(t, n)
		if len(replicas) != 1 {
			t.Fatalf("master %s has %d replicas, want 1", n.Addr(), len(replicas))
		}
		info, err := replicas[0].Client(t).Info(t.Context(), "replication").Result()
		if err != nil {
			t.Fatalf("INFO replication on %s: %v", replicas[0].Addr(), err)
		}
		if !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_port:"+port(n.Addr())) {
			t.Errorf("replica %s of %s:\n%s", replicas[0].Addr(), n.Addr(), info)
		}
	}
	if masters != 3 {
		t.Errorf("%d masters, want 3", masters)
	}
	if m := c.MasterOf(t, "redistest:"+t.Name()); !m.IsMaster() {
		t.Errorf("MasterOf returned %s, which is not a master", m.Addr())
	}
}

func TestClusterNodePause(t *testing.T) {
	t.Parallel()
	c := redistest.NewCluster(t)
	key := "redistest:" + t.Name()
	master := c.MasterOf(t, key)
	rdb := master.Client(t)

	resume := master.Pause(t)
	assertNoAnswer(t, master.Addr())
	resume()
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}
	c.WaitHealthy(t)
	if err := c.Client(t).Set(t.Context(), key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET after resume: %v", err)
	}
}

// assertNoAnswer checks that the server at addr does not answer PING
// within 200ms.
func assertNoAnswer(t *testing.T, addr string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := rdb.Ping(ctx).Err()
	if err == nil {
		t.Fatal("a paused server answered PING")
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("PING of a paused server took %v to fail", elapsed)
	}
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// Secured servers speak TLS only and admit only the ACL user, in every
// topology.
func TestSecured(t *testing.T) {
	t.Parallel()
	sec := redistest.NewSecurity(t)
	ctx := t.Context()
	check := func(t *testing.T, rdb redis.UniversalClient) {
		t.Helper()
		if err := rdb.Set(ctx, "secured", "1", 0).Err(); err != nil {
			t.Fatalf("set over TLS as %s: %v", sec.Username, err)
		}
		user, err := rdb.Do(ctx, "ACL", "WHOAMI").Text()
		if err != nil || user != sec.Username {
			t.Errorf("ACL WHOAMI = %q, %v", user, err)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.NewSecureServer(t, sec)
		check(t, s.Client(t))
		plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Error("a plain-text client was served")
		}
		anon := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: sec.TLSConfig(), MaxRetries: -1})
		defer anon.Close()
		if err := anon.Ping(ctx).Err(); err == nil {
			t.Error("the default user was served")
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		check(t, redistest.NewClusterWith(t, redistest.ClusterOptions{Security: sec}).Client(t))
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		check(t, redistest.NewSentinelWith(t, redistest.SentinelOptions{Security: sec}).Client(t))
	})
}
