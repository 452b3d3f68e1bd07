// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Server is one standalone Redis, or one Redis of a Sentinel setup.
type Server struct {
	addr   string
	shared bool
	p      *proc // nil for an external server
	// prepare, when set, runs before the server starts again: in a
	// Sentinel setup it makes the server follow the current master.
	prepare func(ctx context.Context) error
}

// NewServer returns a standalone server dedicated to the test, stopped
// when the test ends. With IDEMSVC_TEST_REDIS_ADDR set it returns that
// external server instead.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	s, err := newServer(context.Background())
	return dedicated(tb, s, err)
}

// dedicated fails tb with err, or has s stopped when tb ends.
func dedicated(tb testing.TB, s *Server, err error) *Server {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// SharedServer returns the standalone server shared by all tests of the
// test binary, starting it on first use. Tests using it must use unique
// keys; the package must call Main from TestMain.
func SharedServer(tb testing.TB) *Server {
	tb.Helper()
	requireMain(tb, "SharedServer")
	shared.serverMu.Lock()
	defer shared.serverMu.Unlock()
	if shared.server == nil && shared.serverErr == nil {
		s, err := newServer(context.Background())
		if err != nil {
			shared.serverErr = fmt.Errorf("shared server: %w", err)
		} else {
			s.shared = true
			shared.server = s
		}
	}
	if shared.serverErr != nil {
		tb.Fatal(shared.serverErr)
	}
	return shared.server
}

// NewSecureServer returns a standalone server dedicated to the test that
// sec secures, stopped when the test ends. It is always a local process.
func NewSecureServer(tb testing.TB, sec *Security) *Server {
	tb.Helper()
	return newLocalServer(tb, sec)
}

// NewPrivateServer returns a standalone server dedicated to the test,
// started by the harness even where IDEMSVC_TEST_REDIS_ADDR names an
// external one: for tests that count what the server runs, which other
// tests' traffic on a shared server would blur.
func NewPrivateServer(tb testing.TB) *Server {
	tb.Helper()
	return newLocalServer(tb, nil)
}

// newLocalServer starts a server of the local backend, secured by sec
// unless it is nil.
func newLocalServer(tb testing.TB, sec *Security) *Server {
	tb.Helper()
	b, err := backendFor(sec)
	if errors.Is(err, errNeedsBinary) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	p, err := spawnProc(context.Background(), b, false)
	if err != nil {
		return dedicated(tb, nil, fmt.Errorf("redistest: %w", err))
	}
	return dedicated(tb, &Server{addr: p.addr, p: p}, nil)
}

func newServer(ctx context.Context) (*Server, error) {
	if addr := os.Getenv(EnvAddr); addr != "" {
		if err := pingExternal(ctx, addr); err != nil {
			return nil, fmt.Errorf("redistest: %s=%s: %w", EnvAddr, addr, err)
		}
		return &Server{addr: addr}, nil
	}
	b, err := localBackend()
	if err != nil {
		return nil, err
	}
	p, err := spawnProc(ctx, b, false)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	return &Server{addr: p.addr, p: p}, nil
}

func pingExternal(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, externalTimeout)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

func (s *Server) close(ctx context.Context) error {
	if s.p == nil {
		return nil
	}
	return s.p.destroy(ctx)
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Pid returns the server's process ID, or 0 when it is not a local process.
func (s *Server) Pid() int {
	if s.p == nil {
		return 0
	}
	return s.p.inst.pid()
}

// Client returns a new client of the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(secure(&redis.Options{Addr: s.addr}))
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Restart stops the server and starts it again on the same port. Its data
// and script cache are lost: the server keeps nothing on disk. A server of
// a Sentinel setup that is not the master comes back as a replica of the
// master.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Restart")
	if err := s.p.halt(context.Background()); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
	if err := s.relaunch(context.Background()); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// Stop stops the server, so that connections to it fail.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Stop")
	if !s.p.isRunning() {
		tb.Fatalf("redistest: Stop: redis-server on %s is not running", s.addr)
	}
	if err := s.p.halt(context.Background()); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

// Kill ends the server's process at once (SIGKILL), as a crash would.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Kill")
	if !s.p.isRunning() {
		tb.Fatalf("redistest: Kill: redis-server on %s is not running", s.addr)
	}
	if err := s.p.kill(context.Background()); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

// Start starts a stopped (or killed) server again on the same port, empty.
// A server of a Sentinel setup comes back as a replica of the master the
// Sentinels report, unless that is the server itself, and syncs from it.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Start")
	if s.p.isRunning() {
		tb.Fatalf("redistest: Start: redis-server on %s is already running", s.addr)
	}
	if err := s.relaunch(context.Background()); err != nil {
		tb.Fatalf("redistest: start: %v", err)
	}
}

func (s *Server) relaunch(ctx context.Context) error {
	if s.prepare != nil {
		if err := s.prepare(ctx); err != nil {
			return fmt.Errorf("redis-server on %s: %w", s.addr, err)
		}
	}
	return s.p.restart(ctx)
}

// Pause suspends the server's process (SIGSTOP, or a container pause), so
// that it accepts connections but answers nothing, until resume is called
// or the test ends.
func (s *Server) Pause(tb testing.TB) (resume func()) {
	tb.Helper()
	s.control(tb, "Pause")
	return s.p.pause(tb)
}

// control fails or skips tb unless the server's process may be controlled.
func (s *Server) control(tb testing.TB, op string) {
	tb.Helper()
	if s.shared {
		tb.Fatalf("redistest: %s on the shared server would disturb other tests; use NewServer", op)
	}
	if s.p == nil {
		tb.Skipf("redistest: %s %s", op, skipExternal)
	}
}
