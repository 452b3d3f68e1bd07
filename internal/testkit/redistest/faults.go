// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"fmt"
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
		l.args = append(serverArgs(port, l.dir, l.log, l.pidPath, "", nil),
			"--appendonly", "yes", "--appendfsync", "always")
		return l, pidfileIdentity(l.pidPath), nil
	})
	if err != nil {
		return dedicated(tb, nil, fmt.Errorf("redistest: %w", err))
	}
	return dedicated(tb, &Server{addr: p.addr, p: p}, nil)
}

// Running reports whether the node's process runs (it may be paused).
func (n *Node) Running() bool { return n.p != nil && n.p.isRunning() }

// Running reports whether the server's process runs (it may be paused).
func (s *Server) Running() bool { return s.p != nil && s.p.isRunning() }
