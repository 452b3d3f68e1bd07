// SPDX-License-Identifier: Apache-2.0

package redistest_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestSentinelFailover: the master is reached through a FailoverClient;
// once it is killed the Sentinels promote the replica, which has the
// master's data, and the same client follows; the old master comes back as
// a replica of the new one.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	st := redistest.NewSentinel(t)
	ctx := t.Context()
	if got := len(st.Addrs()); got != 3 {
		t.Fatalf("%d Sentinels, want 3", got)
	}
	for _, addr := range st.Addrs() {
		if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" || strings.HasSuffix(addr, ":6379") {
			t.Errorf("Sentinel address %s, want a free loopback port", addr)
		}
	}
	servers := st.Servers()
	master, replica := st.Master(t), st.Replica(t)
	if len(servers) != 2 || master != servers[0] || replica != servers[1] {
		t.Fatalf("master %s, replica %s; want the two servers %v in order", master.Addr(), replica.Addr(), addrs(servers))
	}
	for _, addr := range st.Addrs() {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		hostPort, err := sc.GetMasterAddrByName(ctx, st.MasterName()).Result()
		_ = sc.Close()
		if err != nil || net.JoinHostPort(hostPort[0], hostPort[1]) != master.Addr() {
			t.Errorf("Sentinel %s: master = %v, %v; want %s", addr, hostPort, err, master.Addr())
		}
	}

	rdb := st.Client(t)
	assertServedBy(t, rdb, master.Addr())
	// WAIT on the connection of the write: the replica has it.
	var wait *redis.Cmd
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "k", "before", 0)
		wait = p.Do(ctx, "WAIT", 1, 5000)
		return nil
	}); err != nil || wait.Val() != int64(1) {
		t.Fatalf("SET + WAIT = %v, %v; want 1 replica", wait.Val(), err)
	}

	master.Kill(t)
	promoted := st.WaitFailover(t)
	if promoted != replica {
		t.Fatalf("WaitFailover returned %s, want the replica %s", promoted.Addr(), replica.Addr())
	}
	if got := st.Master(t); got != replica {
		t.Errorf("Master after the failover = %s, want %s", got.Addr(), replica.Addr())
	}
	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "before" {
		t.Fatalf("GET through the FailoverClient after the failover = %q, %v; want \"before\"", got, err)
	}
	if err := rdb.Set(ctx, "k", "after", 0).Err(); err != nil {
		t.Fatalf("SET through the FailoverClient after the failover: %v", err)
	}
	assertServedBy(t, rdb, replica.Addr())

	// The old master starts again as a replica of the new one.
	master.Start(t)
	st.WaitHealthy(t)
	if got := st.Replica(t); got != master {
		t.Errorf("Replica after the restart = %s, want %s", got.Addr(), master.Addr())
	}
	old := master.Client(t)
	if got, err := old.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Errorf("GET on the old master, now a replica = %q, %v; want \"after\"", got, err)
	}
	if err := old.Set(ctx, "k", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Errorf("SET on the old master, now a replica: %v, want READONLY", err)
	}
}

// assertServedBy checks that rdb's commands reach the master at addr.
func assertServedBy(t *testing.T, rdb *redis.Client, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "server", "replication").Result()
	if err != nil {
		t.Fatalf("INFO through the FailoverClient: %v", err)
	}
	if !strings.Contains(info, "tcp_port:"+port(addr)+"\r\n") || !strings.Contains(info, "role:master\r\n") {
		t.Fatalf("the FailoverClient does not reach the master %s:\n%s", addr, info)
	}
}

func addrs(servers []*redistest.Server) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Addr())
	}
	return out
}
