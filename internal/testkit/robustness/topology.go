// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	// Toxiproxy is the fault proxy Shopify keeps for exactly this: latency,
	// resets and black holes on TCP links, embedded here as a library.
	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
)

// Failpoint injects one fault, records it and heals it before returning,
// leaving the topology healthy again.
type Failpoint struct {
	Name   string
	Inject func(tb testing.TB, rec *Recorder)
}

// Topology is a running Redis setup with idemsvc in front of it.
type Topology struct {
	// Env are idemsvc's Redis settings.
	Env        []string
	Failpoints []Failpoint
}

// Scenario is one topology, one WAIT setting and its failpoints.
type Scenario struct {
	Name         string
	WaitReplicas int
	// ExpectLoss says Redis by design loses acknowledged writes under one
	// of the failpoints (asynchronous replication without WAIT, a
	// restart without persistence): violations are then a measured
	// figure, not a failure.
	ExpectLoss bool
	// Blob keeps every stored body in a blob store (versitygw), which a
	// failpoint stops and starts again: replays then come from it,
	// checked against their SHA-256.
	Blob  bool
	Start func(tb testing.TB) Topology
}

// Scenarios lists every topology with its failpoints.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "cluster-wait1", WaitReplicas: 1, Start: startCluster},
		{Name: "cluster-wait0", WaitReplicas: 0, ExpectLoss: true, Start: startCluster},
		{Name: "sentinel-wait1", WaitReplicas: 1, Start: startSentinel},
		{Name: "sentinel-wait0", WaitReplicas: 0, ExpectLoss: true, Start: startSentinel},
		{Name: "standalone-aof", Start: startStandalone(true)},
		{Name: "standalone-volatile", ExpectLoss: true, Start: startStandalone(false)},
		{Name: "standalone-blob", Blob: true, Start: withBlobStore(startStandalone(true))},
	}
}

// withBlobStore adds a blob store to a topology: every stored body goes
// to it (IDEMSVC_BLOB_THRESHOLD_BYTES=0), and a failpoint stops it for a
// while and starts it again.
func withBlobStore(start func(tb testing.TB) Topology) func(tb testing.TB) Topology {
	return func(tb testing.TB) Topology {
		top := start(tb)
		srv := s3test.New(tb)
		top.Env = append(top.Env, "IDEMSVC_BLOB_URL="+srv.URL("robustness"), "IDEMSVC_BLOB_THRESHOLD_BYTES=0",
			"IDEMSVC_BLOB_SPOOL_DIR="+tb.TempDir())
		top.Env = append(top.Env, srv.Env()...)
		top.Failpoints = append(top.Failpoints, Failpoint{Name: "restart-blob-store", Inject: func(tb testing.TB, rec *Recorder) {
			rec.AddFault("restart-blob-store")
			srv.Stop(tb)
			sleep(2 * time.Second)
			srv.Start(tb)
		}})
		return top
	}
}

func sleep(d time.Duration) { time.Sleep(d) }

// instanceFailpoints kill and pause idemsvc processes; insts is filled in
// once they run.
func instanceFailpoints(insts *[]*Instance) []Failpoint {
	pick := func() *Instance { return (*insts)[rand.IntN(len(*insts))] }
	return []Failpoint{
		{Name: "kill-idemsvc", Inject: func(tb testing.TB, rec *Recorder) {
			in := pick()
			rec.AddFault("kill-idemsvc")
			in.Kill()
			sleep(time.Second)
			if err := in.Start(); err != nil {
				tb.Fatal(err)
			}
		}},
		{Name: "pause-idemsvc", Inject: func(tb testing.TB, rec *Recorder) {
			in := pick()
			rec.AddFault("pause-idemsvc")
			in.Signal(syscall.SIGSTOP)
			sleep(2 * time.Second)
			in.Signal(syscall.SIGCONT)
		}},
	}
}

func startCluster(tb testing.TB) Topology {
	c := redistest.NewCluster(tb)
	// someMaster returns a current master and one of its replicas.
	someMaster := func() (*redistest.Node, *redistest.Node) {
		m := c.MasterOf(tb, strconv.Itoa(rand.IntN(1_000_000)))
		rs := c.ReplicasOf(tb, m)
		if len(rs) == 0 {
			tb.Fatalf("master %s has no replica", m.Addr())
		}
		return m, rs[0]
	}
	// waitPromoted waits until the other nodes serve every slot without m.
	waitPromoted := func(m *redistest.Node) {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			for _, n := range c.Nodes() {
				if n != m && n.Running() && servedWithout(n.Addr(), m.Addr()) {
					return
				}
			}
			sleep(100 * time.Millisecond)
		}
		tb.Fatalf("no replica took over from %s within 30s", m.Addr())
	}
	fps := []Failpoint{
		{Name: "kill-master", Inject: func(tb testing.TB, rec *Recorder) {
			m, _ := someMaster()
			rec.AddFault("kill-master")
			m.Kill(tb)
			waitPromoted(m)
			m.Start(tb)
			c.WaitHealthy(tb)
		}},
		{Name: "pause-master", Inject: func(tb testing.TB, rec *Recorder) {
			m, _ := someMaster()
			rec.AddFault("pause-master")
			resume := m.Pause(tb)
			sleep(3 * time.Second)
			resume()
			c.WaitHealthy(tb)
		}},
		{Name: "kill-replica", Inject: func(tb testing.TB, rec *Recorder) {
			_, r := someMaster()
			rec.AddFault("kill-replica")
			r.Kill(tb)
			sleep(2 * time.Second)
			r.Start(tb)
			c.WaitHealthy(tb)
		}},
		{Name: "pause-replica", Inject: func(tb testing.TB, rec *Recorder) {
			_, r := someMaster()
			rec.AddFault("pause-replica")
			resume := r.Pause(tb)
			sleep(2 * time.Second)
			resume()
			c.WaitHealthy(tb)
		}},
		{Name: "cluster-failover", Inject: func(tb testing.TB, rec *Recorder) {
			_, r := someMaster()
			rec.AddFault("cluster-failover")
			if err := command(r.Addr(), "CLUSTER", "FAILOVER"); err != nil {
				tb.Fatalf("cluster failover on %s: %v", r.Addr(), err)
			}
			c.WaitHealthy(tb)
		}},
		{Name: "replica-lag-kill", Inject: func(tb testing.TB, rec *Recorder) {
			// The replica is cut off: paused, and its replication link
			// closed so the stream does not wait in its socket buffer. The
			// master acknowledges writes it alone holds (unless WAIT
			// refuses them), then dies, and the stale replica takes over.
			m, r := someMaster()
			rec.AddFault("replica-lag-kill")
			resume := r.Pause(tb)
			cutReplicas(tb, m.Addr())
			sleep(1500 * time.Millisecond)
			m.Kill(tb)
			resume()
			waitPromoted(m)
			m.Start(tb)
			c.WaitHealthy(tb)
		}},
	}
	return Topology{
		Env:        []string{"IDEMSVC_REDIS_CLUSTER_ADDRS=" + strings.Join(c.Addrs(), ",")},
		Failpoints: fps,
	}
}

func startSentinel(tb testing.TB) Topology {
	st := redistest.NewSentinel(tb)
	fps := []Failpoint{
		{Name: "kill-master", Inject: func(tb testing.TB, rec *Recorder) {
			m := st.Master(tb)
			rec.AddFault("kill-master")
			m.Kill(tb)
			st.WaitFailover(tb)
			m.Start(tb)
			st.WaitHealthy(tb)
		}},
		{Name: "pause-master", Inject: func(tb testing.TB, rec *Recorder) {
			m := st.Master(tb)
			rec.AddFault("pause-master")
			resume := m.Pause(tb)
			st.WaitFailover(tb)
			sleep(time.Second)
			resume()
			st.WaitHealthy(tb)
		}},
		{Name: "kill-replica", Inject: func(tb testing.TB, rec *Recorder) {
			r := st.Replica(tb)
			rec.AddFault("kill-replica")
			r.Kill(tb)
			sleep(2 * time.Second)
			r.Start(tb)
			st.WaitHealthy(tb)
		}},
		{Name: "pause-replica", Inject: func(tb testing.TB, rec *Recorder) {
			r := st.Replica(tb)
			rec.AddFault("pause-replica")
			resume := r.Pause(tb)
			sleep(2 * time.Second)
			resume()
			st.WaitHealthy(tb)
		}},
		{Name: "sentinel-failover", Inject: func(tb testing.TB, rec *Recorder) {
			sc := redis.NewSentinelClient(&redis.Options{Addr: st.Addrs()[0]})
			defer sc.Close()
			rec.AddFault("sentinel-failover")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := sc.Failover(ctx, st.MasterName()).Err(); err != nil {
				tb.Fatalf("sentinel failover: %v", err)
			}
			st.WaitFailover(tb)
			st.WaitHealthy(tb)
		}},
		{Name: "replica-lag-kill", Inject: func(tb testing.TB, rec *Recorder) {
			m, r := st.Master(tb), st.Replica(tb)
			rec.AddFault("replica-lag-kill")
			resume := r.Pause(tb)
			cutReplicas(tb, m.Addr())
			sleep(1500 * time.Millisecond)
			m.Kill(tb)
			resume()
			st.WaitFailover(tb)
			m.Start(tb)
			st.WaitHealthy(tb)
		}},
	}
	return Topology{
		Env: []string{
			"IDEMSVC_REDIS_SENTINEL_ADDRS=" + strings.Join(st.Addrs(), ","),
			"IDEMSVC_REDIS_SENTINEL_MASTER=" + st.MasterName(),
		},
		Failpoints: fps,
	}
}

// startStandalone starts one Redis (with an append-only file fsynced on
// every write when persistent) behind a toxiproxy proxy, and points
// idemsvc at the proxy so that the link can be slowed, reset or cut.
// Only standalone servers get a proxy: Sentinel and Cluster hand clients
// the nodes' own addresses, which would bypass it.
func startStandalone(persistent bool) func(tb testing.TB) Topology {
	return func(tb testing.TB) Topology {
		var s *redistest.Server
		if persistent {
			s = redistest.NewPersistentServer(tb)
		} else {
			s = redistest.NewServer(tb)
		}
		srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		proxy := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", s.Addr())
		if err := proxy.Start(); err != nil {
			tb.Fatalf("toxiproxy: %v", err)
		}
		tb.Cleanup(proxy.Stop)
		toxic := func(name, typ, attrs string, d time.Duration) Failpoint {
			return Failpoint{Name: name, Inject: func(tb testing.TB, rec *Recorder) {
				rec.AddFault(name)
				for _, stream := range []string{"upstream", "downstream"} {
					js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name+stream, typ, stream, attrs)
					if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
						tb.Fatalf("toxiproxy %s: %v", name, err)
					}
				}
				sleep(d)
				proxy.Toxics.ResetToxics(context.Background())
			}}
		}
		fps := []Failpoint{
			toxic("latency", "latency", `{"latency":400,"jitter":300}`, 3*time.Second),
			toxic("reset-peer", "reset_peer", `{"timeout":0}`, time.Second),
			toxic("black-hole", "timeout", `{"timeout":0}`, 3*time.Second),
			{Name: "restart-redis", Inject: func(tb testing.TB, rec *Recorder) {
				rec.AddFault("restart-redis")
				s.Restart(tb)
			}},
		}
		if persistent {
			fps = append(fps, Failpoint{Name: "kill-redis", Inject: func(tb testing.TB, rec *Recorder) {
				rec.AddFault("kill-redis")
				s.Kill(tb)
				sleep(500 * time.Millisecond)
				s.Start(tb)
			}})
		}
		return Topology{Env: []string{"IDEMSVC_REDIS_URL=redis://" + proxy.Listen}, Failpoints: fps}
	}
}

// nodeTimeout bounds one command to one node.
const nodeTimeout = 500 * time.Millisecond

func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: nodeTimeout, ReadTimeout: nodeTimeout,
		WriteTimeout: nodeTimeout, MaxRetries: -1, PoolSize: 1})
}

// command sends one command to the node at addr.
func command(addr string, args ...any) error {
	rdb := nodeClient(addr)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*nodeTimeout)
	defer cancel()
	return rdb.Do(ctx, args...).Err()
}

// servedWithout reports whether the node at addr sees every slot served
// by a master other than gone.
func servedWithout(addr, gone string) bool {
	rdb := nodeClient(addr)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*nodeTimeout)
	defer cancel()
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		return false
	}
	covered := 0
	for _, s := range slots {
		if len(s.Nodes) == 0 || s.Nodes[0].Addr == gone {
			return false
		}
		covered += s.End - s.Start + 1
	}
	return covered == 16384
}

// cutReplicas closes the replication links of the master at addr.
func cutReplicas(tb testing.TB, addr string) {
	tb.Helper()
	if err := command(addr, "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		tb.Fatalf("client kill type replica on %s: %v", addr, err)
	}
}
