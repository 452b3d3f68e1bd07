package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redistest"
)

// The contract's bound on idemsvc's memory under hostile or slow clients.
const (
	rssBound = 300e6 // bytes
	// slowBodies connections each declare a body of slowBodyBytes and
	// send one byte of it.
	slowBodies    = 1000
	slowBodyBytes = 2 << 20
	// unreadReplays clients each ask for a replay of a stored body of
	// replayBodyBytes '<' (escaped as \u003c, six bytes each) and read none
	// of it.
	unreadReplays   = 300
	replayBodyBytes = 1 << 20
)

// TestBoundedMemory runs the idemsvc binary, so that its memory is its own,
// and holds its resident set (VmHWM, the peak) under the contract's 300 MB
// while slow and non-reading clients of a valid tenant press on it. With
// IDEMSVC_TEST_BINARY set it runs that binary instead of building one, to
// measure another build the same way.
func TestBoundedMemory(t *testing.T) {
	bin := idemsvcBinary(t)
	tenants := filepath.Join(t.TempDir(), "tenants.yaml")
	const apiKey = "memory-test-key"
	if err := os.WriteFile(tenants, []byte(`{"tenants":[{"name":"t","api_key_sha256":["`+auth.Digest(apiKey)+`"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	memory := []string{"IDEMSVC_TENANTS_FILE=" + tenants}

	t.Run("slow bodies", func(t *testing.T) {
		p := startBinary(t, bin, memory)
		conns := make([]net.Conn, 0, slowBodies)
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		head := "POST /v1/begin HTTP/1.1\r\nHost: idemsvc\r\nAuthorization: Bearer " + apiKey +
			"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(slowBodyBytes) + "\r\n\r\n{"
		for range slowBodies {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			if _, err := io.WriteString(c, head); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second) // for every request to reach its handler
		for i, c := range conns {
			// Each connection is still held, its body being read.
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection %d: read %v, want it held open", i, err)
			}
		}
		rss, peak := p.memory(t)
		t.Logf("%d connections declaring %d bytes and sending one: VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB)",
			slowBodies, slowBodyBytes, rss/1e6, peak/1e6, p.startRSS/1e6)
		if peak > rssBound {
			t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, rssBound/1e6)
		}
	})

	t.Run("unread replays/memory", func(t *testing.T) {
		unreadReplayTest(t, startBinary(t, bin, memory), apiKey, true)
	})
	t.Run("unread replays/redis", func(t *testing.T) {
		// 300 replays of 1 MiB in a burst take Redis longer than the
		// default store timeout of 1 s to send.
		redisEnv := append([]string{"IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(t).Addr(), "IDEMSVC_REDIS_TIMEOUT_MS=30000"}, memory...)
		unreadReplayTest(t, startBinary(t, bin, redisEnv), apiKey, false)
	})
}

// unreadReplayTest stores a body of replayBodyBytes '<' and has
// unreadReplays clients ask for its replay and read nothing past the
// status line. They are cut off by the write deadline, and, when bounded,
// the peak resident set stays under rssBound meanwhile.
func unreadReplayTest(t *testing.T, p *process, apiKey string, bounded bool) {
	url := "http://" + p.addr
	key := fmt.Sprintf("replay-%d", time.Now().UnixNano())
	code, lease := post(t, url+"/v1/begin", apiKey, `{"key":"`+key+`"}`)
	if code != 201 {
		t.Fatalf("begin = %d %v", code, lease)
	}
	body := strings.Repeat("<", replayBodyBytes)
	if code, out := post(t, url+"/v1/complete", apiKey, `{"key":"`+key+`","lease_token":"`+lease["lease_token"].(string)+
		`","response":{"body":"`+body+`"}}`); code != 200 {
		t.Fatalf("complete = %d %v", code, out)
	}
	// The whole answer, read by a client that reads.
	whole := 6*replayBodyBytes + 200

	begin := `{"key":"` + key + `"}`
	request := "POST /v1/begin HTTP/1.1\r\nHost: idemsvc\r\nAuthorization: Bearer " + apiKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(begin)) + "\r\n\r\n" + begin
	conns := make([]net.Conn, unreadReplays)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	started := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, unreadReplays)
	for i := range conns {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		wg.Go(func() {
			if _, err := io.WriteString(c, request); err != nil {
				errs <- err
				return
			}
			status := make([]byte, len("HTTP/1.1 200"))
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadFull(c, status); err != nil || string(status) != "HTTP/1.1 200" {
				errs <- fmt.Errorf("status line %q: %v", status, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The answer's deadline: the base plus its size at the minimum rate.
	deadline := handlers.DefaultWriteDeadlineBase + time.Duration(float64(whole)/handlers.DefaultMinClientRate*float64(time.Second))
	var rss float64
	for time.Since(started) < deadline-time.Second {
		now, _ := p.memory(t)
		rss = max(rss, now)
		time.Sleep(200 * time.Millisecond)
	}
	_, peak := p.memory(t)
	t.Logf("%d clients not reading a replay of %d bytes of '<': VmRSS up to %.0f MB, VmHWM %.0f MB (at start %.0f MB)",
		unreadReplays, replayBodyBytes, rss/1e6, peak/1e6, p.startRSS/1e6)
	if bounded && peak > rssBound {
		t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, rssBound/1e6)
	}

	// Once the deadline has passed, each client finds its answer cut
	// short: what the socket buffers held, then the end of the connection.
	time.Sleep(time.Until(started.Add(deadline + 5*time.Second)))
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.Copy(io.Discard, c)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) || n >= int64(whole) {
			t.Fatalf("client %d read %d bytes and then %v: want the answer cut short by the write deadline (%v)", i, n, err, deadline)
		}
	}
	t.Logf("every client was cut off within %v", time.Since(started).Round(time.Second))
}

// idemsvcBinary is IDEMSVC_TEST_BINARY, or idemsvc built from this
// package without the race detector, which would inflate its memory.
func idemsvcBinary(t *testing.T) string {
	if bin := os.Getenv("IDEMSVC_TEST_BINARY"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "idemsvc")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is an idemsvc binary started by a test.
type process struct {
	cmd      *exec.Cmd
	addr     string
	startRSS float64
}

// startBinary starts bin with env and no other environment, listening on
// a free loopback port, and kills it (by its PID) when the test ends.
func startBinary(t *testing.T, bin string, env []string) *process {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"IDEMSVC_LISTEN=127.0.0.1:0"}, env...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	p := &process{cmd: cmd, addr: waitListening(t, logs.lines)}
	p.startRSS, _ = p.memory(t)
	return p
}

// memory is the process's resident set now and its peak, in bytes.
func (p *process) memory(t *testing.T) (rss, peak float64) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), ":")
		kB, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		switch {
		case err != nil:
		case name == "VmRSS":
			rss = kB * 1024
		case name == "VmHWM":
			peak = kB * 1024
		}
	}
	return rss, peak
}
