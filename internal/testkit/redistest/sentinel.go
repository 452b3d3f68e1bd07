// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinelCount and sentinelQuorum give the shape of the Sentinel
	// setups the harness creates: three Sentinels, two of which must agree
	// that the master is down.
	sentinelCount  = 3
	sentinelQuorum = 2
	// sentinelMasterName is the name the Sentinels monitor the master by.
	sentinelMasterName = "redistest"
	// sentinelDownAfter is how long the master may not answer before a
	// Sentinel deems it down; sentinelFailoverTimeout bounds one failover
	// attempt.
	sentinelDownAfter       = 500 * time.Millisecond
	sentinelFailoverTimeout = 2 * time.Second
	// sentinelTimeout bounds the creation of a Sentinel setup,
	// WaitHealthy and WaitFailover.
	sentinelTimeout = 30 * time.Second
)

// sentinelPeriods shorten Sentinel's periods (SENTINEL DEBUG, Redis 7.0+;
// not kept in the configuration file), so that Sentinels find each other
// and notice changes in a fraction of a second.
//
// The ping period matters most. A Sentinel connects to a promoted master
// up to one ping period after the switch (1 s by default). With the
// down-after period of 500 ms it deems the new master down meanwhile and,
// as the other Sentinels' recent replies about the old master still count
// towards the quorum, fails it over again: back to the old master if that
// is a replica again by then. But a replica is eligible for promotion only
// while its last INFO (sent every second during a failover) is at most
// five ping periods old. 250 ms leaves margin on both sides. Replies of
// other Sentinels about the master count for five ask periods.
var sentinelPeriods = []any{
	"ping-period", 250,
	"ask-period", 100,
	"publish-period", 200,
	"info-period", 1000,
}

// SentinelOptions shape a Sentinel setup. The zero value gives the
// default shape: a master and one replica.
type SentinelOptions struct {
	// Replicas is the number of replicas of the master (1 when 0, at most
	// 3). Use 2 or more where a failover must leave the promoted replica a
	// replica of its own, for WAIT 1 say.
	Replicas int
	// Security, when set, secures the servers and the Sentinels.
	Security *Security
}

// Sentinel is a Redis managed by Sentinel: a master, one replica (or as
// many as its SentinelOptions say), and
// three Sentinels that monitor them with a quorum of two, all local
// processes. Its servers are Servers: Stop, Kill and Pause act on them as
// on standalone ones, and Start and Restart bring a server that is not the
// master back as a replica of the current master.
type Sentinel struct {
	sec       *Security
	name      string
	servers   []*Server // the Redis servers, the one started as master first
	sentinels []*proc

	mu     sync.Mutex
	master string // the master's address, as last seen by the harness
}

// NewSentinel returns a Sentinel setup dedicated to the test, stopped when
// the test ends. It needs the redis-server binary: it fails when the
// environment names external servers or when only Docker is available.
func NewSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	return NewSentinelWith(tb, SentinelOptions{})
}

// NewSentinelWith is NewSentinel with the shape opts gives.
func NewSentinelWith(tb testing.TB, opts SentinelOptions) *Sentinel {
	tb.Helper()
	if opts.Replicas < 0 || opts.Replicas > maxReplicasPerMaster {
		tb.Fatalf("redistest: SentinelOptions.Replicas = %d, want 0 to %d", opts.Replicas, maxReplicasPerMaster)
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	st, err := newSentinel(context.Background(), opts.Replicas, opts.Security)
	if errors.Is(err, errNeedsBinary) {
		tb.Skip(err) // said, not silent: the run stays green where only Docker is
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := st.close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return st
}

// Addrs returns the addresses of the Sentinels.
func (st *Sentinel) Addrs() []string {
	addrs := make([]string, len(st.sentinels))
	for i, p := range st.sentinels {
		addrs[i] = p.addr
	}
	return addrs
}

// MasterName returns the name the Sentinels know the master by.
func (st *Sentinel) MasterName() string { return st.name }

// Servers returns the Redis servers, the one started as master first.
func (st *Sentinel) Servers() []*Server { return slices.Clone(st.servers) }

// Client returns a new client that finds the master through the
// Sentinels, closed when the test ends.
func (st *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	opts := &redis.FailoverOptions{MasterName: st.name, SentinelAddrs: st.Addrs()}
	if st.sec != nil {
		opts.TLSConfig, opts.Username, opts.Password = st.sec.TLSConfig(), st.sec.Username, st.sec.Password
		opts.SentinelUsername, opts.SentinelPassword = st.sec.Username, st.sec.Password
	}
	rdb := redis.NewFailoverClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Master returns the server the Sentinels currently report as the master,
// as seen by the first Sentinel that answers.
func (st *Sentinel) Master(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	addr, err := st.reportedMaster(ctx)
	if err != nil {
		tb.Fatalf("redistest: master %s: %v", st.name, err)
	}
	s := st.server(addr)
	if s == nil {
		tb.Fatalf("redistest: the Sentinels report an unknown master %s", addr)
	}
	return s
}

// Replica returns the server that is not the master the Sentinels
// currently report.
func (st *Sentinel) Replica(tb testing.TB) *Server {
	tb.Helper()
	master := st.Master(tb)
	for _, s := range st.servers {
		if s != master {
			return s
		}
	}
	tb.Fatal("redistest: the Sentinel setup has no replica")
	return nil
}

// Replicas returns the servers that are not the master the Sentinels
// currently report.
func (st *Sentinel) Replicas(tb testing.TB) []*Server {
	tb.Helper()
	master := st.Master(tb)
	var replicas []*Server
	for _, s := range st.servers {
		if s != master {
			replicas = append(replicas, s)
		}
	}
	return replicas
}

// WaitFailover waits until every Sentinel reports the same new master,
// other than the one the harness saw last (at the start, or at the last
// WaitFailover or WaitHealthy), and that server acts as a master. It
// returns the new master.
func (st *Sentinel) WaitFailover(tb testing.TB) *Server {
	tb.Helper()
	old := st.lastMaster()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	var master *Server
	err := poll(ctx, func() error {
		addr, err := st.agreedMaster(ctx)
		if err != nil {
			return err
		}
		if addr == old {
			return fmt.Errorf("the Sentinels still report the master %s", old)
		}
		if master = st.server(addr); master == nil {
			return fmt.Errorf("the Sentinels report an unknown master %s", addr)
		}
		return checkRole(ctx, addr, "")
	})
	if err != nil {
		tb.Fatalf("redistest: no failover from %s within %v: %v\n%s", old, sentinelTimeout, err, st.diagnose())
	}
	st.setMaster(master.addr)
	return master
}

// WaitHealthy waits until every Sentinel reports the same master, which
// acts as a master; every other running server replicates it with its
// link up; and every Sentinel knows those replicas as such and knows the
// other Sentinels. Use it after a server came back, before a test relies
// on the next failover.
func (st *Sentinel) WaitHealthy(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	if err := st.waitHealthy(ctx); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

func newSentinel(ctx context.Context, replicas int, sec *Security) (*Sentinel, error) {
	b, err := backendFor(sec)
	if err != nil {
		return nil, err
	}
	pb, ok := b.(processBackend)
	if !ok {
		return nil, fmt.Errorf("%w: Sentinel setups are not run in containers", errNeedsBinary)
	}
	st, err := createSentinel(ctx, pb, replicas)
	if err != nil {
		return nil, fmt.Errorf("redistest: create Sentinel setup: %w", err)
	}
	return st, nil
}

// createSentinel starts the master and the replicas, waits until the
// replicas are in sync, then starts the Sentinels (so that their first look
// at the master shows the replica) and waits until the setup is healthy.
func createSentinel(ctx context.Context, b processBackend, replicas int) (*Sentinel, error) {
	st := &Sentinel{name: sentinelMasterName, sec: b.sec}
	master, err := st.spawnServer(ctx, b, "")
	if err != nil {
		return nil, err
	}
	st.master = master.addr
	for range replicas {
		if _, err := st.spawnServer(ctx, b, master.addr); err != nil {
			return nil, errors.Join(err, st.close(ctx))
		}
	}
	wctx, cancel := context.WithTimeout(ctx, sentinelTimeout)
	defer cancel()
	if err := poll(wctx, func() error { return st.checkReplication(wctx, master.addr) }); err != nil {
		err = fmt.Errorf("replica not in sync: %w\n%s", err, st.diagnose())
		return nil, errors.Join(err, st.close(ctx))
	}

	st.sentinels = make([]*proc, sentinelCount)
	errs := make([]error, sentinelCount)
	var wg sync.WaitGroup
	for i := range sentinelCount {
		wg.Go(func() {
			p, err := spawnSentinel(ctx, b, st.name, master.addr)
			if err == nil {
				st.sentinels[i] = p
				err = setPeriods(ctx, p.addr)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, st.close(ctx))
	}
	if err := st.waitHealthy(wctx); err != nil {
		return nil, errors.Join(err, st.close(ctx))
	}
	return st, nil
}

// spawnServer starts a Redis server of the setup, as a replica of
// replicaOf unless that is empty.
func (st *Sentinel) spawnServer(ctx context.Context, b processBackend, replicaOf string) (*Server, error) {
	var (
		l    *localInstance
		port int
	)
	p, err := spawnWith(ctx, false, func(pt int) (instance, identity, error) {
		var err error
		if l, err = b.newLocal(pt); err != nil {
			return nil, identity{}, err
		}
		port = pt
		l.args = sentinelServerArgs(l, port, replicaOf)
		return l, pidfileIdentity(l.pidPath), nil
	})
	if err != nil {
		return nil, err
	}
	s := &Server{addr: p.addr, p: p}
	// A server that starts again follows the current master, as Sentinel
	// would make it do, at once rather than after Sentinel's delays.
	s.prepare = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, sentinelTimeout)
		defer cancel()
		master, err := st.reportedMaster(ctx)
		if err != nil {
			return fmt.Errorf("find the master to follow: %w", err)
		}
		if master == s.addr {
			master = ""
		}
		l.args = sentinelServerArgs(l, port, master)
		return nil
	}
	st.servers = append(st.servers, s)
	return s, nil
}

// sentinelServerArgs returns the arguments of a Redis server of a
// Sentinel setup, as a replica of master unless that is empty.
func sentinelServerArgs(l *localInstance, port int, master string) []string {
	args := append(serverArgs(port, l.dir, l.log, l.pidPath, "", l.sec), replicationArgs()...)
	if master != "" {
		host, mport, _ := net.SplitHostPort(master)
		args = append(args, "--replicaof", host, mport)
	}
	return args
}

// spawnSentinel starts a Sentinel that monitors master under name. Each
// Sentinel has its own configuration file, which it rewrites.
func spawnSentinel(ctx context.Context, b processBackend, name, master string) (*proc, error) {
	return spawnWith(ctx, false, func(port int) (instance, identity, error) {
		l, err := b.newLocal(port)
		if err != nil {
			return nil, identity{}, err
		}
		var id [20]byte
		rand.Read(id[:])
		myid := hex.EncodeToString(id[:])
		host, mport, _ := net.SplitHostPort(master)
		conf := filepath.Join(l.dir, "sentinel.conf")
		listen, auth := fmt.Sprintf("port %d\n", port), ""
		if b.sec != nil {
			listen, auth = b.sec.sentinelListen(port), b.sec.sentinelAuth(name)
		}
		text := listen + fmt.Sprintf("bind 127.0.0.1\ndaemonize no\ndir %q\nlogfile %q\npidfile %q\nloglevel notice\n"+
			"sentinel myid %s\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\n",
			l.dir, l.log, l.pidPath,
			myid,
			name, host, mport, sentinelQuorum,
			name, sentinelDownAfter.Milliseconds(),
			name, sentinelFailoverTimeout.Milliseconds()) + auth
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			_ = os.RemoveAll(l.dir)
			return nil, identity{}, fmt.Errorf("write Sentinel configuration: %w", err)
		}
		l.args = []string{conf, "--sentinel"}
		return l, identity{what: "sentinel myid", want: myid, query: sentinelMyID}, nil
	})
}

// setPeriods shortens the periods of the Sentinel at addr.
func setPeriods(ctx context.Context, addr string) error {
	sc := sentinelClient(addr)
	defer sc.Close()
	args := append([]any{"SENTINEL", "DEBUG"}, sentinelPeriods...)
	if err := sc.Process(ctx, redis.NewStatusCmd(ctx, args...)); err != nil {
		return fmt.Errorf("sentinel debug on %s: %w", addr, err)
	}
	return nil
}

func sentinelMyID(ctx context.Context, rdb *redis.Client) (string, error) {
	id, err := rdb.Do(ctx, "SENTINEL", "MYID").Text()
	if err != nil {
		return "", fmt.Errorf("sentinel myid: %w", err)
	}
	return id, nil
}

// close destroys, in parallel, the Sentinels and then the servers that
// were started.
func (st *Sentinel) close(ctx context.Context) error {
	var errs []error
	for _, group := range [][]*proc{st.sentinels, st.serverProcs()} {
		groupErrs := make([]error, len(group))
		var wg sync.WaitGroup
		for i, p := range group {
			if p != nil {
				wg.Go(func() { groupErrs[i] = p.destroy(ctx) })
			}
		}
		wg.Wait()
		errs = append(errs, groupErrs...)
	}
	return errors.Join(errs...)
}

func (st *Sentinel) serverProcs() []*proc {
	ps := make([]*proc, len(st.servers))
	for i, s := range st.servers {
		ps[i] = s.p
	}
	return ps
}

func (st *Sentinel) server(addr string) *Server {
	for _, s := range st.servers {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

func (st *Sentinel) lastMaster() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.master
}

func (st *Sentinel) setMaster(addr string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.master = addr
}

// reportedMaster asks the Sentinels in turn for the master's address and
// returns the first answer.
func (st *Sentinel) reportedMaster(ctx context.Context) (string, error) {
	var errs []error
	for _, p := range st.sentinels {
		addr, err := masterAddrOf(ctx, p.addr, st.name)
		if err == nil {
			return addr, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", p.addr, err))
	}
	return "", errors.Join(errs...)
}

// agreedMaster returns the master's address that every Sentinel reports.
func (st *Sentinel) agreedMaster(ctx context.Context) (string, error) {
	var first string
	for i, p := range st.sentinels {
		addr, err := masterAddrOf(ctx, p.addr, st.name)
		if err != nil {
			return "", fmt.Errorf("Sentinel %s: %w", p.addr, err)
		}
		if i == 0 {
			first = addr
		} else if addr != first {
			return "", fmt.Errorf("Sentinels %s and %s report the masters %s and %s", st.sentinels[0].addr, p.addr, first, addr)
		}
	}
	return first, nil
}

// waitHealthy waits until the setup is healthy (see WaitHealthy) and
// remembers its master.
func (st *Sentinel) waitHealthy(ctx context.Context) error {
	var master string
	err := poll(ctx, func() error {
		var err error
		if master, err = st.agreedMaster(ctx); err != nil {
			return err
		}
		if err := st.checkReplication(ctx, master); err != nil {
			return err
		}
		for _, p := range st.sentinels {
			if err := st.checkSentinel(ctx, p.addr, master); err != nil {
				return fmt.Errorf("Sentinel %s: %w", p.addr, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("Sentinel setup not healthy: %w\n%s", err, st.diagnose())
	}
	st.setMaster(master)
	return nil
}

// checkReplication checks that master acts as a master and that every
// other running server replicates it with its link up.
func (st *Sentinel) checkReplication(ctx context.Context, master string) error {
	if st.server(master) == nil {
		return fmt.Errorf("unknown master %s", master)
	}
	for _, s := range st.servers {
		if !s.p.isRunning() {
			continue
		}
		follow := master
		if s.addr == master {
			follow = ""
		}
		if err := checkRole(ctx, s.addr, follow); err != nil {
			return err
		}
	}
	return nil
}

// checkRole checks that the server at addr is a master (master == "") or
// a replica of master whose link is up.
func checkRole(ctx context.Context, addr, master string) error {
	rdb := nodeClient(addr)
	defer rdb.Close()
	info, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("info replication on %s: %w", addr, err)
	}
	if master == "" {
		if role := infoValue(info, "role"); role != "master" {
			return fmt.Errorf("%s is a %s, not a master", addr, role)
		}
		return nil
	}
	_, port, _ := net.SplitHostPort(master)
	if infoValue(info, "role") != "slave" || infoValue(info, "master_port") != port {
		return fmt.Errorf("%s does not replicate %s", addr, master)
	}
	if infoValue(info, "master_link_status") != "up" {
		return fmt.Errorf("%s: the link to its master %s is not up", addr, master)
	}
	return nil
}

// checkSentinel checks that the Sentinel at addr knows every running
// server other than master as a replica of master in sync, and knows the
// other Sentinels.
func (st *Sentinel) checkSentinel(ctx context.Context, addr, master string) error {
	sc := sentinelClient(addr)
	defer sc.Close()
	replicas, err := sc.Replicas(ctx, st.name).Result()
	if err != nil {
		return fmt.Errorf("sentinel replicas: %w", err)
	}
	_, masterPort, _ := net.SplitHostPort(master)
	for _, s := range st.servers {
		if s.addr == master || !s.p.isRunning() {
			continue
		}
		i := slices.IndexFunc(replicas, func(r map[string]string) bool { return r["name"] == s.addr })
		switch {
		case i < 0:
			return fmt.Errorf("does not know the replica %s", s.addr)
		case replicas[i]["flags"] != "slave":
			return fmt.Errorf("flags the replica %s %s", s.addr, replicas[i]["flags"])
		case replicas[i]["role-reported"] != "slave" || replicas[i]["master-port"] != masterPort ||
			replicas[i]["master-link-status"] != "ok":
			return fmt.Errorf("has not seen %s replicate %s yet", s.addr, master)
		}
	}
	sentinels, err := sc.Sentinels(ctx, st.name).Result()
	if err != nil {
		return fmt.Errorf("sentinel sentinels: %w", err)
	}
	known := 0
	for _, other := range sentinels {
		if other["flags"] == "sentinel" {
			known++
		}
	}
	if known != len(st.sentinels)-1 {
		return fmt.Errorf("knows %d of the %d other Sentinels", known, len(st.sentinels)-1)
	}
	return nil
}

// diagnose describes the servers and each Sentinel's view for failure
// messages.
func (st *Sentinel) diagnose() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*nodeTimeout)
	defer cancel()
	var b strings.Builder
	for _, s := range st.servers {
		rdb := nodeClient(s.addr)
		info, err := rdb.Info(ctx, "replication").Result()
		_ = rdb.Close()
		if err != nil {
			fmt.Fprintf(&b, "server %s: %v\n", s.addr, err)
			continue
		}
		fmt.Fprintf(&b, "server %s: role=%s master_port=%s master_link_status=%s\n", s.addr,
			infoValue(info, "role"), infoValue(info, "master_port"), infoValue(info, "master_link_status"))
	}
	for _, p := range st.sentinels {
		if p == nil {
			continue
		}
		sc := sentinelClient(p.addr)
		master, err := masterAddrOf(ctx, p.addr, st.name)
		if err != nil {
			master = err.Error()
		}
		fmt.Fprintf(&b, "Sentinel %s: master %s\n", p.addr, master)
		if replicas, err := sc.Replicas(ctx, st.name).Result(); err == nil {
			for _, r := range replicas {
				fmt.Fprintf(&b, "  replica %s flags=%s role-reported=%s master-port=%s master-link-status=%s\n",
					r["name"], r["flags"], r["role-reported"], r["master-port"], r["master-link-status"])
			}
		}
		if sentinels, err := sc.Sentinels(ctx, st.name).Result(); err == nil {
			for _, o := range sentinels {
				fmt.Fprintf(&b, "  sentinel %s flags=%s\n", o["name"], o["flags"])
			}
		}
		_ = sc.Close()
		fmt.Fprintf(&b, "  last lines of its log:\n%s\n", p.inst.logTail(ctx))
	}
	return b.String()
}

// masterAddrOf asks the Sentinel at addr for the address of the master
// named name.
func masterAddrOf(ctx context.Context, addr, name string) (string, error) {
	sc := sentinelClient(addr)
	defer sc.Close()
	hostPort, err := sc.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return "", fmt.Errorf("sentinel get-master-addr-by-name: %w", err)
	}
	if len(hostPort) != 2 {
		return "", fmt.Errorf("sentinel get-master-addr-by-name: unexpected reply %q", hostPort)
	}
	return net.JoinHostPort(hostPort[0], hostPort[1]), nil
}

// sentinelClient returns a client of one Sentinel for setup and health
// checks.
func sentinelClient(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(secure(&redis.Options{
		Addr:         addr,
		DialTimeout:  nodeTimeout,
		ReadTimeout:  nodeTimeout,
		WriteTimeout: nodeTimeout,
		MaxRetries:   -1,
		PoolSize:     1,
	}))
}

// infoValue returns the value of field name in an INFO reply.
func infoValue(info, name string) string {
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
