// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Environment variables naming external servers.
const (
	// EnvAddr names an external standalone server as host:port.
	EnvAddr = "IDEMSVC_TEST_REDIS_ADDR"
	// EnvClusterAddrs names the comma-separated seed nodes of an external
	// cluster.
	EnvClusterAddrs = "IDEMSVC_TEST_REDIS_CLUSTER_ADDRS"
)

// externalTimeout bounds the first contact with an external server.
const externalTimeout = 5 * time.Second

var local struct {
	once sync.Once
	b    backend
	err  error
}

// localBackend finds how to start servers: the redis-server binary, or
// else containers if a Docker engine answers.
func localBackend() (backend, error) {
	local.once.Do(func() {
		if bin, err := exec.LookPath("redis-server"); err == nil {
			local.b = processBackend{bin: bin}
			return
		}
		dockerErr := probeDocker()
		if dockerErr == nil {
			local.b = containerBackend{}
			return
		}
		local.err = fmt.Errorf("redistest: no Redis to test against: redis-server is not on PATH "+
			"(install it, e.g. `apt-get install redis-server`), no Docker engine answers (%v), "+
			"and %s / %s name no external servers", dockerErr, EnvAddr, EnvClusterAddrs)
	})
	return local.b, local.err
}

// errNeedsBinary is why a test that needs redis-server processes (Sentinel
// setups, secured servers) is skipped where only Docker is available.
var errNeedsBinary = errors.New("redistest: this test needs the redis-server binary on PATH " +
	"(install it, e.g. `apt-get install redis-server`)")

// backendFor is localBackend for servers that sec secures: redis-server
// processes, since only they take the test's certificates.
func backendFor(sec *Security) (backend, error) {
	b, err := localBackend()
	if err != nil || sec == nil {
		return b, err
	}
	pb, ok := b.(processBackend)
	if !ok {
		return nil, fmt.Errorf("%w: secured servers are not run in containers", errNeedsBinary)
	}
	pb.sec = sec
	return pb, nil
}

// skipExternal is the message of tests skipped because they need control
// over a server process that the harness did not start.
const skipExternal = "needs a Redis the tests started; IDEMSVC_TEST_REDIS_* names external servers"

var mainActive struct {
	mu     sync.Mutex
	active bool
}

// shared holds the shared instances; each kind has its own lock so that
// starting the cluster does not hold up tests of the server.
var shared struct {
	serverMu   sync.Mutex
	server     *Server
	serverErr  error
	clusterMu  sync.Mutex
	cluster    *Cluster
	clusterErr error
}

// Main runs the tests of a package, stops the shared servers and exits
// with the tests' exit code. Packages that use SharedServer or
// SharedCluster must call it from TestMain.
func Main(m *testing.M) {
	mainActive.mu.Lock()
	mainActive.active = true
	mainActive.mu.Unlock()

	code := m.Run()

	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func requireMain(tb testing.TB, name string) {
	tb.Helper()
	mainActive.mu.Lock()
	ok := mainActive.active
	mainActive.mu.Unlock()
	if !ok {
		tb.Fatalf("redistest: %s needs redistest.Main: add `func TestMain(m *testing.M) { redistest.Main(m) }` to the package's tests", name)
	}
}

func stopShared() error {
	ctx := context.Background()
	var errs []error
	shared.serverMu.Lock()
	if shared.server != nil {
		errs = append(errs, shared.server.close(ctx))
		shared.server = nil
	}
	shared.serverMu.Unlock()
	shared.clusterMu.Lock()
	if shared.cluster != nil {
		errs = append(errs, shared.cluster.close(ctx))
		shared.cluster = nil
	}
	shared.clusterMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redistest: stop shared servers: %w", err)
	}
	return nil
}
