// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// mustConfigSet sets a server's configuration, failing the test otherwise.
func mustConfigSet(t *testing.T, rdb *redis.Client, name, value string) {
	t.Helper()
	if err := rdb.ConfigSet(context.Background(), name, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", name, value, err)
	}
}

// wantFailures checks that the store's readiness reports exactly want, as
// "check node" pairs.
func wantFailures(t *testing.T, store sm.Store, want ...string) []sm.Failure {
	t.Helper()
	failures := store.Readiness(context.Background())
	var got []string
	for _, f := range failures {
		if f.Detail == "" {
			t.Errorf("failure %+v has no detail", f)
		}
		got = append(got, f.Check+" "+f.Node)
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("readiness = %q, want %q", got, want)
	}
	return failures
}

// fillToOOM sets a small maxmemory on a node and writes small values
// through writer until the node refuses writes for want of memory. It then
// lowers maxmemory to three quarters of what the node counts, so that the
// node stays out of memory while buffers that were counted at the refusal
// (a replica's output buffer, a client's query buffer) drain.
func fillToOOM(t *testing.T, node *redis.Client, writer redis.Cmdable) {
	t.Helper()
	ctx := context.Background()
	mustConfigSet(t, node, "maxmemory", "4mb")
	value := strings.Repeat("x", 512)
	for i := 0; ; i++ {
		err := writer.Set(ctx, fmt.Sprintf("fill-%d", i), value, 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
		if err != nil || i > 100_000 {
			t.Fatalf("filling to OOM: %v after %d writes", err, i)
		}
	}
	info, err := node.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used, _ := strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
	notCounted, _ := strconv.ParseInt(infoField(info, "mem_not_counted_for_evict"), 10, 64)
	mustConfigSet(t, node, "maxmemory", strconv.FormatInt((used-notCounted)*3/4, 10))
}

// infoField is the value of name in INFO's "name:value" lines.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestReadinessStandalone drives a real node into each state /readyz
// reports: an evicting policy, out of memory, too few replicas for WAIT,
// paused and stopped.
func TestReadinessStandalone(t *testing.T) {
	t.Parallel()
	srv := redistest.NewPrivateServer(t) // its configuration changes
	admin := srv.Client(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.Options{})
	node := srv.Addr()

	wantFailures(t, store)
	if nodes := store.Inspect(context.Background()); len(nodes) != 1 || nodes[0].Addr != node ||
		!nodes[0].PersistenceKnown || nodes[0].Persistent || nodes[0].Policy != "noeviction" {
		t.Errorf("inspect = %+v, want %s with noeviction and no persistence", nodes, node)
	}

	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		mustConfigSet(t, admin, "maxmemory-policy", policy)
		f := wantFailures(t, store, "eviction_policy "+node)
		if len(f) == 1 && !strings.Contains(f[0].Detail, policy) {
			t.Errorf("detail %q does not name the policy %s", f[0].Detail, policy)
		}
	}
	allowing := redisstore.New(client, redisstore.Options{AllowEviction: true})
	wantFailures(t, allowing)
	mustConfigSet(t, admin, "maxmemory-policy", "noeviction")

	fillToOOM(t, admin, admin)
	if _, err := store.Begin(context.Background(), "t", sm.BeginRequest{Key: "oom"}); err == nil {
		t.Error("begin on a Redis out of memory succeeded")
	}
	wantFailures(t, store, "writable "+node)
	mustConfigSet(t, admin, "maxmemory", "0")
	wantFailures(t, store)

	waiting := redisstore.New(client, redisstore.Options{WaitReplicas: 1})
	wantFailures(t, waiting, "replicas "+node)

	resume := srv.Pause(t)
	start := time.Now()
	wantFailures(t, store, "reachable "+node)
	paused := time.Since(start)
	resume()
	srv.Stop(t)
	start = time.Now()
	wantFailures(t, store, "reachable "+node)
	stopped := time.Since(start)
	t.Logf("readiness answered in %v with the node paused, %v with it stopped", paused, stopped)
	// The contract's bound is 500 ms; the margin is for a busy machine.
	if paused > time.Second || stopped > time.Second {
		t.Errorf("readiness took %v paused, %v stopped; want well under 1 s", paused, stopped)
	}
}

// TestReadinessCluster: an evicting policy on one master of a Cluster is
// reported for that master alone.
func TestReadinessCluster(t *testing.T) {
	t.Parallel()
	c := redistest.NewClusterWith(t, redistest.ClusterOptions{Private: true}) // its configuration changes
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.Options{})
	wantFailures(t, store)
	if nodes := store.Inspect(context.Background()); len(nodes) != 3 {
		t.Errorf("inspected %d masters, want 3: %+v", len(nodes), nodes)
	}
	master := c.Nodes()[0]
	mustConfigSet(t, master.Client(t), "maxmemory-policy", "allkeys-lfu")
	wantFailures(t, store, "eviction_policy "+master.Addr())
	mustConfigSet(t, master.Client(t), "maxmemory-policy", "noeviction")
	fillToOOM(t, master.Client(t), client) // the Cluster spreads the keys; the small master fills
	wantFailures(t, store, "writable "+master.Addr())
	mustConfigSet(t, master.Client(t), "maxmemory", "0")
	addrs := []string{c.Nodes()[0].Addr(), c.Nodes()[1].Addr(), c.Nodes()[2].Addr()}
	slices.Sort(addrs)
	wantFailures(t, redisstore.New(client, redisstore.Options{WaitReplicas: 2}),
		"replicas "+addrs[0], "replicas "+addrs[1], "replicas "+addrs[2])

	// Refusals: every master is probed on its own; a refused login fails
	// before the slot map can be read, and is named for the seeds.
	for _, n := range c.Nodes() {
		if err := n.Client(t).Do(ctx, "ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
			t.Fatal(err)
		}
	}
	as := func(user, password string) *redisstore.Store {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Username: user, Password: password, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		return redisstore.New(client, redisstore.Options{})
	}
	wantFailures(t, as("noscript", "pw"), "permissions "+addrs[0], "permissions "+addrs[1], "permissions "+addrs[2])
	wantFailures(t, as("noscript", "wrong"), "auth "+strings.Join(c.Addrs(), ","))
}

// TestReadinessSentinel: the master Sentinel names is the one read, by its
// own address.
func TestReadinessSentinel(t *testing.T) {
	t.Parallel()
	st := redistest.NewSentinel(t)
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: st.MasterName(), SentinelAddrs: st.Addrs(), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.Options{WaitReplicas: 1})
	wantFailures(t, store)
	master := st.Master(t)
	admin := master.Client(t)
	mustConfigSet(t, admin, "maxmemory-policy", "volatile-ttl")
	wantFailures(t, store, "eviction_policy "+master.Addr())
	mustConfigSet(t, admin, "maxmemory-policy", "noeviction")
	fillToOOM(t, admin, admin)
	wantFailures(t, store, "writable "+master.Addr())
}

// TestReadinessRefusals: a node that refuses idemsvc's credentials fails
// auth, and one whose ACL lacks what idemsvc sends fails permissions,
// where they used to pass as a Redis that hides CONFIG and INFO. A user
// denied INFO and CONFIG alone, as a managed Redis does, stays ready.
func TestReadinessRefusals(t *testing.T) {
	t.Parallel()
	srv := redistest.NewPrivateServer(t) // its users change
	admin := srv.Client(t)
	users := map[string][]any{
		"right":    {"~*", "&*", "+@all"},
		"noscript": {"~*", "&*", "+@all", "-@scripting"},
		"readonly": {"~*", "&*", "+@all", "-@write"},
		"read":     {"~*", "&*", "+@read", "+@connection"}, // no EVALSHA either
		"nochan":   {"~*", "resetchannels", "+@all"},
		"otherkey": {"~other:*", "&*", "+@all"},
		"managed":  {"~*", "&*", "+@all", "-info", "-config"},
		"noeval":   {"~*", "&*", "+@all", "-eval"},
		"nolimits": {"~idem:*", "&*", "+@all"},
	}
	for name, rules := range users {
		if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", name, "reset", "on", ">pw"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	node := srv.Addr()
	storeAs := func(user, password string) *redisstore.Store {
		client := redis.NewClient(&redis.Options{Addr: node, Username: user, Password: password, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		return redisstore.New(client, redisstore.Options{ProbeKeys: []string{"idemq:{idemsvc-probe}:readiness-probe"}})
	}
	for _, c := range []struct {
		user, password, check, denied string
		// works: a begin and its complete succeed all the same, for now
		// (the scripts are cached; the limits' keys are not used here).
		works bool
	}{
		{"right", "pw", "", "", false},
		{"right", "wrong", "auth", "", false},
		{"nobody", "pw", "auth", "", false},
		{"noscript", "pw", "permissions", "EVALSHA", false},
		{"readonly", "pw", "permissions", "SET", false},
		{"read", "pw", "permissions", "EVALSHA", false},
		{"nochan", "pw", "permissions", "PUBLISH", false},
		{"otherkey", "pw", "permissions", "EVALSHA", false},
		{"managed", "pw", "", "", false},
		// Without EVAL, calls work until a restart empties the script
		// cache; readiness tells before that.
		{"noeval", "pw", "permissions", "EVAL (scripts", true},
		{"nolimits", "pw", "permissions", "idemq:{idemsvc-probe}", true},
	} {
		t.Run(c.user+"/"+c.password, func(t *testing.T) {
			store := storeAs(c.user, c.password)
			var f []sm.Failure
			if c.check == "" {
				f = wantFailures(t, store)
			} else {
				f = wantFailures(t, store, c.check+" "+node)
			}
			if c.denied != "" && len(f) == 1 && !strings.Contains(f[0].Detail, c.denied) {
				t.Errorf("detail %q does not name %s", f[0].Detail, c.denied)
			}
			if strings.Contains(fmt.Sprint(f), c.password) && c.password != "pw" {
				t.Errorf("failures %+v show the password", f)
			}
			// A begin and its complete fail as readiness says, or succeed.
			key := idemtest.Unique("k")
			res, err := store.Begin(ctx, "t", sm.BeginRequest{Key: key})
			if err == nil {
				_, err = store.Complete(ctx, "t", sm.CompleteRequest{Key: key, Token: res.Lease.Token})
			}
			if (err == nil) != (c.check == "" || c.works) {
				t.Errorf("begin and complete: %v, with readiness failing %q", err, c.check)
			}
		})
	}

	// NOAUTH: the default user needs a password, and the store gives none.
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", ">secret").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(ctx, "ACL", "SETUSER", "default", "nopass").Err() })
	wantFailures(t, storeAs("", ""), "auth "+node)
}
