// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterMasters and replicasPerMaster give the shape of the clusters
	// the harness creates, unless ClusterOptions say otherwise.
	clusterMasters    = 3
	replicasPerMaster = 1
	// maxReplicasPerMaster bounds ClusterOptions.ReplicasPerMaster, so a
	// test cannot start dozens of servers by mistake.
	maxReplicasPerMaster = 3
	// clusterTimeout bounds the creation of a cluster and WaitHealthy.
	clusterTimeout = 30 * time.Second
	// nodeTimeout bounds single commands to one node during setup and
	// health checks, so a paused node cannot stall them.
	nodeTimeout = 500 * time.Millisecond
	// slotCount is the number of hash slots of a Redis Cluster.
	slotCount = 16384
)

// ClusterOptions shape a cluster dedicated to one test. The zero value
// gives the default shape: 3 masters with 1 replica each.
type ClusterOptions struct {
	// ReplicasPerMaster is the number of replicas of each master (1 when
	// 0, at most 3). Use 2 or more where a master's failover must leave
	// the promoted replica a replica of its own, for WAIT 1 say.
	ReplicasPerMaster int
	// Security, when set, secures the nodes: TLS only, on the Cluster bus
	// too, and an ACL user.
	Security *Security
	// Private starts the cluster even where IDEMSVC_TEST_REDIS_CLUSTER_ADDRS
	// names one: for tests that change its configuration, fill it or kill
	// its nodes, which would disturb every other test on a shared one.
	Private bool
}

// Cluster is a Redis Cluster of 3 masters with 1 replica each, or the
// shape its ClusterOptions gave.
type Cluster struct {
	sec    *Security
	addrs  []string
	nodes  []*Node
	shared bool
}

// Node is one node of a Cluster.
type Node struct {
	c      *Cluster
	id     string
	addr   string
	master bool
	p      *proc // nil for a node of an external cluster
}

// NewCluster returns a cluster dedicated to the test, stopped when the
// test ends. With IDEMSVC_TEST_REDIS_CLUSTER_ADDRS set it returns that
// external cluster instead.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	return NewClusterWith(tb, ClusterOptions{})
}

// NewClusterWith is NewCluster with the shape opts gives. An external
// cluster (IDEMSVC_TEST_REDIS_CLUSTER_ADDRS) is returned as it is; a test
// that needs its shape checks ReplicasOf.
func NewClusterWith(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.ReplicasPerMaster < 0 || opts.ReplicasPerMaster > maxReplicasPerMaster {
		tb.Fatalf("redistest: ClusterOptions.ReplicasPerMaster = %d, want 0 to %d", opts.ReplicasPerMaster, maxReplicasPerMaster)
	}
	c, err := newCluster(context.Background(), opts)
	if errors.Is(err, errNeedsBinary) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// SharedCluster returns the cluster shared by all tests of the test
// binary, starting it on first use. Tests using it must use unique keys;
// the package must call Main from TestMain.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	requireMain(tb, "SharedCluster")
	shared.clusterMu.Lock()
	defer shared.clusterMu.Unlock()
	if shared.cluster == nil && shared.clusterErr == nil {
		c, err := newCluster(context.Background(), ClusterOptions{})
		if err != nil {
			shared.clusterErr = fmt.Errorf("shared cluster: %w", err)
		} else {
			c.shared = true
			shared.cluster = c
		}
	}
	if shared.clusterErr != nil {
		tb.Fatal(shared.clusterErr)
	}
	return shared.cluster
}

// Addrs returns the addresses of the cluster's nodes, to be used as seeds.
func (c *Cluster) Addrs() []string { return slices.Clone(c.addrs) }

// Client returns a new cluster client, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	opts := &redis.ClusterOptions{Addrs: c.Addrs()}
	if c.sec != nil {
		opts.TLSConfig, opts.Username, opts.Password = c.sec.TLSConfig(), c.sec.Username, c.sec.Password
	}
	rdb := redis.NewClusterClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Nodes returns the cluster's nodes: for a cluster the harness created,
// the three masters first, then their replicas in the same order (the
// first replica of each master, then the second...).
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// MasterOf returns the node that currently serves key's hash slot as
// master, as seen by the first node that answers.
func (c *Cluster) MasterOf(tb testing.TB, key string) *Node {
	tb.Helper()
	var owner *Node
	err := c.query(func(ctx context.Context, rdb *redis.Client) error {
		slot, err := rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			return fmt.Errorf("cluster keyslot: %w", err)
		}
		view, err := clusterNodes(ctx, rdb)
		if err != nil {
			return err
		}
		for _, e := range view {
			if e.has("master") && e.owns(int(slot)) {
				if owner = c.node(e.id); owner == nil {
					return fmt.Errorf("slot %d is served by unknown node %s (%s)", slot, e.id, e.addr)
				}
				return nil
			}
		}
		return fmt.Errorf("no master serves slot %d", slot)
	})
	if err != nil {
		tb.Fatalf("redistest: master of %q: %v", key, err)
	}
	return owner
}

// ReplicasOf returns the nodes that currently replicate master, as seen
// by the first node that answers.
func (c *Cluster) ReplicasOf(tb testing.TB, master *Node) []*Node {
	tb.Helper()
	var replicas []*Node
	err := c.query(func(ctx context.Context, rdb *redis.Client) error {
		view, err := clusterNodes(ctx, rdb)
		if err != nil {
			return err
		}
		replicas = replicas[:0]
		for _, e := range view {
			if e.masterID == master.id && e.has("slave") {
				n := c.node(e.id)
				if n == nil {
					return fmt.Errorf("unknown replica %s (%s)", e.id, e.addr)
				}
				replicas = append(replicas, n)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("redistest: replicas of %s: %v", master.addr, err)
	}
	return replicas
}

// WaitHealthy waits until every node reports cluster_state:ok, every
// replica's link to its master is up, and all nodes agree on which master
// and replicas serve each slot range, with a replica for every range. Use
// it after a failover, for example, before the next step of a test.
func (c *Cluster) WaitHealthy(tb testing.TB) {
	tb.Helper()
	if err := waitHealthy(context.Background(), c.nodeAddrs(), c.masterCount()); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

// Addr returns the node's host:port.
func (n *Node) Addr() string { return n.addr }

// ID returns the node's cluster node ID.
func (n *Node) ID() string { return n.id }

// IsMaster reports whether the node was a master when the cluster was
// created; MasterOf and ReplicasOf tell the current roles.
func (n *Node) IsMaster() bool { return n.master }

// Pid returns the node's process ID, or 0 when it is not a local process.
func (n *Node) Pid() int {
	if n.p == nil {
		return 0
	}
	return n.p.inst.pid()
}

// Client returns a new client connected to this node alone, closed when
// the test ends.
func (n *Node) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(secure(&redis.Options{Addr: n.addr}))
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Pause suspends the node's process (SIGSTOP, or a container pause), so
// that it answers neither clients nor the cluster bus, until resume is
// called or the test ends. A master paused longer than the cluster node
// timeout (1 s) is failed over to its replica.
func (n *Node) Pause(tb testing.TB) (resume func()) {
	tb.Helper()
	if n.c.shared {
		tb.Fatal("redistest: Pause on a node of the shared cluster would disturb other tests; use NewCluster")
	}
	if n.p == nil {
		tb.Skipf("redistest: Pause %s", skipExternal)
	}
	return n.p.pause(tb)
}

// Kill ends the node's process at once (SIGKILL), as a crash would. A
// master killed is failed over to one of its replicas after the cluster
// node timeout (1 s).
func (n *Node) Kill(tb testing.TB) {
	tb.Helper()
	n.control(tb, "Kill")
	if !n.p.isRunning() {
		tb.Fatalf("redistest: Kill: node %s is not running", n.addr)
	}
	if err := n.p.kill(context.Background()); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

// Start starts a killed node again on its port, with its cluster
// configuration but no data: a master that was failed over meanwhile
// comes back as a replica of the node that took its slots and syncs from
// it. Use WaitHealthy before relying on it.
func (n *Node) Start(tb testing.TB) {
	tb.Helper()
	n.control(tb, "Start")
	if n.p.isRunning() {
		tb.Fatalf("redistest: Start: node %s is already running", n.addr)
	}
	if err := n.p.restart(context.Background()); err != nil {
		tb.Fatalf("redistest: start node: %v", err)
	}
}

// control fails or skips tb unless the node's process may be controlled.
func (n *Node) control(tb testing.TB, op string) {
	tb.Helper()
	if n.c.shared {
		tb.Fatalf("redistest: %s on a node of the shared cluster would disturb other tests; use NewCluster", op)
	}
	if n.p == nil {
		tb.Skipf("redistest: %s %s", op, skipExternal)
	}
}

func (c *Cluster) node(id string) *Node {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

func (c *Cluster) nodeAddrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

func (c *Cluster) masterCount() int {
	count := 0
	for _, n := range c.nodes {
		if n.master {
			count++
		}
	}
	return count
}

// query runs f against the first node that answers.
func (c *Cluster) query(f func(ctx context.Context, rdb *redis.Client) error) error {
	var errs []error
	for _, addr := range c.nodeAddrs() {
		rdb := nodeClient(addr)
		ctx, cancel := context.WithTimeout(context.Background(), 2*nodeTimeout)
		err := f(ctx, rdb)
		cancel()
		_ = rdb.Close()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return errors.Join(errs...)
}

func (c *Cluster) close(ctx context.Context) error { return c.closeStarted(ctx) }

func newCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if seeds := splitAddrs(os.Getenv(EnvClusterAddrs)); len(seeds) > 0 && opts.Security == nil && !opts.Private {
		c, err := discoverCluster(ctx, seeds)
		if err != nil {
			return nil, fmt.Errorf("redistest: %s=%s: %w", EnvClusterAddrs, strings.Join(seeds, ","), err)
		}
		return c, nil
	}
	b, err := backendFor(opts.Security)
	if err != nil {
		return nil, err
	}
	replicas := opts.ReplicasPerMaster
	if replicas == 0 {
		replicas = replicasPerMaster
	}
	c, err := createCluster(ctx, b, replicas)
	if err != nil {
		return nil, fmt.Errorf("redistest: create cluster: %w", err)
	}
	return c, nil
}

// createCluster starts the nodes, joins them and waits until the cluster
// is healthy.
func createCluster(ctx context.Context, b backend, replicas int) (*Cluster, error) {
	size := clusterMasters * (1 + replicas)
	c := &Cluster{nodes: make([]*Node, size)}
	if pb, ok := b.(processBackend); ok {
		c.sec = pb.sec
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i := range size {
		wg.Go(func() {
			p, err := spawnProc(ctx, b, true)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			c.nodes[i] = &Node{c: c, addr: p.addr, master: i < clusterMasters, p: p}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, c.closeStarted(ctx))
	}
	c.addrs = c.nodeAddrs()

	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	if err := c.join(ctx); err != nil {
		err = fmt.Errorf("%w\n%s", err, diagnose(c.addrs))
		return nil, errors.Join(err, c.closeStarted(context.Background()))
	}
	if err := waitHealthy(ctx, c.addrs, clusterMasters); err != nil {
		return nil, errors.Join(err, c.closeStarted(context.Background()))
	}
	return c, nil
}

// closeStarted destroys, in parallel, the nodes that were started.
func (c *Cluster) closeStarted(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		if n != nil && n.p != nil {
			wg.Go(func() { errs[i] = n.p.destroy(ctx) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// join assigns the slots to the masters, introduces the nodes to each
// other and makes each replica follow its master.
func (c *Cluster) join(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = nodeClient(n.addr)
		defer clients[i].Close()
	}
	for i, n := range c.nodes {
		id, err := clients[i].ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("cluster myid on %s: %w", n.addr, err)
		}
		n.id = id
		// Distinct epochs spare the nodes resolving epoch collisions.
		if err := clients[i].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("cluster set-config-epoch on %s: %w", n.addr, err)
		}
	}
	for i := range clusterMasters {
		lo := i * slotCount / clusterMasters
		hi := (i+1)*slotCount/clusterMasters - 1
		if err := clients[i].ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("cluster addslotsrange %d %d on %s: %w", lo, hi, c.nodes[i].addr, err)
		}
	}
	for _, n := range c.nodes[1:] {
		port := n.addr[strings.LastIndexByte(n.addr, ':')+1:]
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", port).Err(); err != nil {
			return fmt.Errorf("cluster meet %s: %w", n.addr, err)
		}
	}
	if err := poll(ctx, func() error { return c.allKnown(ctx, clients) }); err != nil {
		return fmt.Errorf("nodes did not learn of each other: %w", err)
	}
	for i, n := range c.nodes[clusterMasters:] {
		master := c.nodes[i%clusterMasters]
		if err := clients[clusterMasters+i].ClusterReplicate(ctx, master.id).Err(); err != nil {
			return fmt.Errorf("cluster replicate %s on %s: %w", master.addr, n.addr, err)
		}
	}
	return nil
}

// allKnown checks that every node knows every other node, past the
// handshake, and knows the masters as masters.
func (c *Cluster) allKnown(ctx context.Context, clients []*redis.Client) error {
	for i, rdb := range clients {
		view, err := clusterNodes(ctx, rdb)
		if err != nil {
			return fmt.Errorf("%s: %w", c.nodes[i].addr, err)
		}
		for _, n := range c.nodes {
			idx := slices.IndexFunc(view, func(e nodeEntry) bool { return e.id == n.id })
			switch {
			case idx < 0:
				return fmt.Errorf("%s does not know %s", c.nodes[i].addr, n.addr)
			case view[idx].has("handshake") || view[idx].has("noaddr"):
				return fmt.Errorf("%s is still in handshake with %s", c.nodes[i].addr, n.addr)
			case n.master && !view[idx].has("master"):
				return fmt.Errorf("%s does not know %s as a master", c.nodes[i].addr, n.addr)
			}
		}
	}
	return nil
}

// discoverCluster describes an external cluster from its seeds.
func discoverCluster(ctx context.Context, seeds []string) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, externalTimeout)
	defer cancel()
	var errs []error
	for _, seed := range seeds {
		rdb := redis.NewClient(&redis.Options{Addr: seed})
		view, err := clusterNodes(ctx, rdb)
		_ = rdb.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", seed, err))
			continue
		}
		// Every node, masters first and then their replicas in the same
		// order, as for a cluster the harness creates: the seeds are only
		// where to ask.
		c := &Cluster{}
		var replicas []nodeEntry
		for _, e := range view {
			if e.has("master") {
				c.nodes = append(c.nodes, &Node{c: c, id: e.id, addr: e.addr, master: true})
			} else {
				replicas = append(replicas, e)
			}
		}
		for _, m := range slices.Clone(c.nodes) {
			for _, e := range replicas {
				if e.masterID == m.id {
					c.nodes = append(c.nodes, &Node{c: c, id: e.id, addr: e.addr})
				}
			}
		}
		c.addrs = c.nodeAddrs()
		return c, nil
	}
	return nil, errors.Join(errs...)
}

// waitHealthy waits until the cluster formed by addrs, with the given
// number of masters, is healthy (see Cluster.WaitHealthy).
func waitHealthy(ctx context.Context, addrs []string, masters int) error {
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	clients := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		clients[i] = nodeClient(addr)
		defer clients[i].Close()
	}
	err := poll(ctx, func() error { return checkHealth(ctx, addrs, clients, masters) })
	if err != nil {
		return fmt.Errorf("cluster not healthy: %w\n%s", err, diagnose(addrs))
	}
	return nil
}

// checkHealth returns the first reason why the cluster is not healthy.
func checkHealth(ctx context.Context, addrs []string, clients []*redis.Client, masters int) error {
	var first string
	for i, rdb := range clients {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("cluster info on %s: %w", addrs[i], err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", addrs[i])
		}
		repl, err := rdb.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("info replication on %s: %w", addrs[i], err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("%s: replica link to its master is not up", addrs[i])
		}
		slots, err := rdb.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("cluster slots on %s: %w", addrs[i], err)
		}
		view, err := slotView(slots, masters)
		if err != nil {
			return fmt.Errorf("cluster slots on %s: %w", addrs[i], err)
		}
		if i == 0 {
			first = view
		} else if view != first {
			return fmt.Errorf("%s and %s disagree on the slots:\n%s\n%s", addrs[0], addrs[i], first, view)
		}
	}
	return nil
}

// slotView checks a CLUSTER SLOTS reply and returns it in a canonical
// form, for comparison between nodes.
func slotView(slots []redis.ClusterSlot, masters int) (string, error) {
	slots = slices.Clone(slots)
	slices.SortFunc(slots, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
	var b strings.Builder
	next := 0
	seen := map[string]bool{}
	for _, s := range slots {
		if s.Start != next {
			return "", fmt.Errorf("slots %d-%d are not served", next, s.Start-1)
		}
		next = s.End + 1
		if len(s.Nodes) < 2 {
			return "", fmt.Errorf("slots %d-%d have no replica", s.Start, s.End)
		}
		seen[s.Nodes[0].Addr] = true
		replicas := make([]string, 0, len(s.Nodes)-1)
		for _, n := range s.Nodes[1:] {
			replicas = append(replicas, n.Addr)
		}
		slices.Sort(replicas)
		fmt.Fprintf(&b, "%d-%d %s %s; ", s.Start, s.End, s.Nodes[0].Addr, strings.Join(replicas, ","))
	}
	if next != slotCount {
		return "", fmt.Errorf("slots %d-%d are not served", next, slotCount-1)
	}
	if len(seen) != masters {
		return "", fmt.Errorf("%d masters serve slots, want %d", len(seen), masters)
	}
	return b.String(), nil
}

// diagnose describes the state of each node for failure messages.
func diagnose(addrs []string) string {
	var b strings.Builder
	var nodes string
	for _, addr := range addrs {
		rdb := nodeClient(addr)
		ctx, cancel := context.WithTimeout(context.Background(), 2*nodeTimeout)
		info, err := rdb.ClusterInfo(ctx).Result()
		state := "unknown"
		if err != nil {
			state = err.Error()
		} else if _, rest, ok := strings.Cut(info, "cluster_state:"); ok {
			state, _, _ = strings.Cut(rest, "\r\n")
		}
		repl, _ := rdb.Info(ctx, "replication").Result()
		fmt.Fprintf(&b, "%s: cluster_state=%s %s %s\n", addr, state, infoField(repl, "role"), infoField(repl, "master_link_status"))
		if nodes == "" {
			nodes, _ = rdb.ClusterNodes(ctx).Result()
		}
		cancel()
		_ = rdb.Close()
	}
	if nodes != "" {
		fmt.Fprintf(&b, "CLUSTER NODES as seen by the first node that answered:\n%s", nodes)
	}
	return b.String()
}

func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return name + "=" + v
		}
	}
	return ""
}

// poll calls check until it succeeds or ctx ends; it then returns the
// last error.
func poll(ctx context.Context, check func() error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// nodeClient returns a client of one node for setup and health checks.
func nodeClient(addr string) *redis.Client {
	return redis.NewClient(secure(&redis.Options{
		Addr:         addr,
		DialTimeout:  nodeTimeout,
		ReadTimeout:  nodeTimeout,
		WriteTimeout: nodeTimeout,
		MaxRetries:   -1,
		PoolSize:     1,
	}))
}

// nodeEntry is one line of CLUSTER NODES.
type nodeEntry struct {
	id       string
	addr     string
	flags    []string
	masterID string
	slots    []string
}

func (e nodeEntry) has(flag string) bool { return slices.Contains(e.flags, flag) }

// owns reports whether the entry lists slot among its slots.
func (e nodeEntry) owns(slot int) bool {
	for _, s := range e.slots {
		if strings.HasPrefix(s, "[") { // slot being imported or migrated
			continue
		}
		loS, hiS, isRange := strings.Cut(s, "-")
		if !isRange {
			hiS = loS
		}
		lo, err1 := strconv.Atoi(loS)
		hi, err2 := strconv.Atoi(hiS)
		if err1 == nil && err2 == nil && lo <= slot && slot <= hi {
			return true
		}
	}
	return false
}

// clusterNodes runs CLUSTER NODES and parses its reply.
func clusterNodes(ctx context.Context, rdb *redis.Client) ([]nodeEntry, error) {
	text, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster nodes: %w", err)
	}
	return parseClusterNodes(text)
}

func parseClusterNodes(text string) ([]nodeEntry, error) {
	var entries []nodeEntry
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 8 {
			return nil, fmt.Errorf("malformed CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(fields[1], "@")
		entries = append(entries, nodeEntry{
			id:       fields[0],
			addr:     addr,
			flags:    strings.Split(fields[2], ","),
			masterID: fields[3],
			slots:    fields[8:],
		})
	}
	return entries, nil
}
