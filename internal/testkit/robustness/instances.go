// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// APIKey is the key of the tenant the traffic acts as.
const APIKey = "robustness-key"

var build struct {
	once sync.Once
	bin  string
	err  error
}

// binary builds ./cmd/idemsvc once per test binary into a temporary
// directory and returns its path.
func binary(tb testing.TB) string {
	tb.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "idemsvc-robustness-")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "idemsvc")
		cmd := exec.Command("go", "build", "-o", build.bin, "github.com/idemsvc/idemsvc/cmd/idemsvc")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/idemsvc: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		tb.Fatal(build.err)
	}
	return build.bin
}

// tenantsFile writes a tenants file with the traffic's tenant.
func tenantsFile(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "tenants.yaml")
	body := fmt.Sprintf("tenants:\n  - name: robustness\n    api_key_sha256: [%q]\n", auth.Digest(APIKey))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Instance is one idemsvc process, on a port of its own that it keeps
// across restarts.
type Instance struct {
	bin  string
	env  []string
	addr string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartInstances starts n idemsvc processes with the given environment
// (Redis settings) and waits until each answers /healthz. They are killed
// when the test ends.
func StartInstances(tb testing.TB, n int, env []string) []*Instance {
	tb.Helper()
	bin := binary(tb)
	tenants := tenantsFile(tb)
	dir := tb.TempDir()
	out := make([]*Instance, n)
	for i := range n {
		in := &Instance{
			bin:  bin,
			addr: freeAddr(tb),
			log:  filepath.Join(dir, "idemsvc-"+strconv.Itoa(i)+".log"),
		}
		in.env = append(append(os.Environ(), env...),
			"IDEMSVC_LISTEN="+in.addr, "IDEMSVC_TENANTS_FILE="+tenants, "IDEMSVC_LOG_LEVEL=warn")
		if err := in.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { in.Kill() })
		out[i] = in
	}
	return out
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// URL returns the instance's base URL.
func (in *Instance) URL() string { return "http://" + in.addr }

// Start starts the process (again) and waits until it answers /healthz.
func (in *Instance) Start() error {
	var last error
	for range 3 {
		if last = in.launch(); last == nil {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return last
}

func (in *Instance) launch() error {
	logf, err := os.OpenFile(in.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("idemsvc log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(in.bin)
	cmd.Env = in.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := redistest.StartChild(cmd); err != nil {
		return fmt.Errorf("start idemsvc: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	in.mu.Lock()
	in.cmd, in.done = cmd, done
	in.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.URL()+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("idemsvc on %s exited during start; see %s", in.addr, in.log)
		case <-ctx.Done():
			in.Kill()
			return fmt.Errorf("idemsvc on %s did not answer /healthz: %w", in.addr, errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pid returns the process ID, or 0.
func (in *Instance) Pid() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd == nil || in.cmd.Process == nil {
		return 0
	}
	return in.cmd.Process.Pid
}

// Kill ends the process at once (kill -9) and waits for it.
func (in *Instance) Kill() {
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Signal sends sig to the process (SIGSTOP, SIGCONT).
func (in *Instance) Signal(sig syscall.Signal) {
	if pid := in.Pid(); pid > 0 {
		_ = syscall.Kill(pid, sig)
	}
}
