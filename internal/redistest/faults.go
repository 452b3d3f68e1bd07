package redistest

import (
	"context"
	"testing"
)

// NewPersistentServer returns a standalone server dedicated to the test
// that writes every change to its append-only file before answering
// (appendonly yes, appendfsync always), so that Restart, or Kill then
// Start, bring it back with its data. It needs the redis-server binary.
func NewPersistentServer(tb testing.TB) *Server {
	tb.Helper()
	ctx := context.Background()
	b, err := localBackend()
	if err != nil {
		tb.Fatal(err)
	}
	pb, ok := b.(processBackend)
	if !ok {
		tb.Fatal("redistest: NewPersistentServer needs the redis-server binary on PATH " +
			"(install it, e.g. `apt-get install redis-server`)")
	}
	p, err := spawnWith(ctx, false, func(port int) (instance, identity, error) {
		l, err := pb.newLocal(port)
		if err != nil {
			return nil, identity{}, err
		}
		// Later arguments override earlier ones.
		l.args = append(serverArgs(port, l.dir, l.log, l.pidPath, ""),
			"--appendonly", "yes", "--appendfsync", "always")
		return l, pidfileIdentity(l.pidPath), nil
	})
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	s := &Server{addr: p.addr, p: p}
	tb.Cleanup(func() {
		if err := s.close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// Kill ends the node's process at once (SIGKILL), as a crash would. A
// killed master is failed over to its replica after the cluster node
// timeout (1 s).
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

// Start starts a killed node again on the same port with its cluster
// configuration file but without data: it rejoins the cluster and, once
// its slots were failed over, comes back as a replica of the new master
// and syncs from it. Starting a master before its replica took over would
// bring its slots back empty; callers wait for the failover first.
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

// Running reports whether the node's process runs (it may be paused).
func (n *Node) Running() bool { return n.p != nil && n.p.isRunning() }

// Running reports whether the server's process runs (it may be paused).
func (s *Server) Running() bool { return s.p != nil && s.p.isRunning() }

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
