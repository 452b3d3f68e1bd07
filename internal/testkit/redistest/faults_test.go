// SPDX-License-Identifier: Apache-2.0

package redistest_test

import (
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestPersistentServerKeepsDataAcrossKill(t *testing.T) {
	t.Parallel()
	s := redistest.NewPersistentServer(t)
	rdb := s.Client(t)
	ctx := t.Context()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Kill(t)
	if s.Running() {
		t.Fatal("Running after Kill")
	}
	s.Start(t)

	got, err := rdb.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET after kill -9 and start = %q, %v; want \"v\" from the append-only file", got, err)
	}
}

func TestClusterNodeKillStart(t *testing.T) {
	t.Parallel()
	c := redistest.NewCluster(t)
	ctx := t.Context()
	const key = "redistest:node-kill"
	master := c.MasterOf(t, key)
	replica := c.ReplicasOf(t, master)[0]
	// SET and WAIT in one pipeline share a connection, so WAIT counts the
	// replica's copy of this write.
	pipe := master.Client(t).Pipeline()
	pipe.Set(ctx, key, "v", 0)
	acks := pipe.Do(ctx, "WAIT", 1, 5000)
	if _, err := pipe.Exec(ctx); err != nil || acks.Val() != int64(1) {
		t.Fatalf("SET then WAIT 1: %v replicas, %v", acks.Val(), err)
	}

	master.Kill(t)
	if master.Running() {
		t.Fatal("Running after Kill")
	}
	// The replica takes over; the old master comes back as its replica.
	deadline := time.Now().Add(30 * time.Second)
	for c.MasterOf(t, key) != replica {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not take over from %s within 30s", replica.Addr(), master.Addr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	master.Start(t)
	c.WaitHealthy(t)

	if got := c.ReplicasOf(t, replica); len(got) != 1 || got[0] != master {
		t.Fatalf("replicas of the new master %s: %v, want the restarted node %s", replica.Addr(), got, master.Addr())
	}
	got, err := c.Client(t).Get(ctx, key).Result()
	if err != nil || got != "v" {
		t.Fatalf("GET after failover = %q, %v; want \"v\"", got, err)
	}
}
