// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// pathsUpstream is an upstream that answers 201 and notes every request
// target it is asked for.
type pathsUpstream struct {
	URL   string
	mu    sync.Mutex
	paths []string
}

func startPathsUpstream(t *testing.T) *pathsUpstream {
	t.Helper()
	u := &pathsUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.paths = append(u.paths, r.Method+" "+r.RequestURI)
		u.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "upstream")
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

func (u *pathsUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.paths...)
}

type problem struct {
	Type   string
	Code   string
	Title  string
	Status int
	Detail string
}

// A request with both Content-Length and Transfer-Encoding is answered
// and its connection closed, so that a request smuggled in its body never
// reaches the upstream, keyed or not; framing errors are problems; a
// handled method spelt in other case is refused, not passed through
// unkeyed; /%6detrics is the upstream's, not idemproxy's /metrics.
func TestStrictEdges(t *testing.T) {
	up := startPathsUpstream(t)
	svc := idemtest.Serve(t, handlers.Config{})
	addr := strings.TrimPrefix(serveProxy(t, svc.URL, up.URL), "http://")

	for _, key := range []string{"Idempotency-Key: \"smuggle-1\"\r\n", ""} {
		smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
		raw := "POST /pay HTTP/1.1\r\nHost: x\r\n" + key + "Content-Length: " + strconv.Itoa(5+len(smuggled)) +
			"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled
		resp, body, closed := idemtest.Exchange(t, idemtest.Dial(addr), raw)
		if !closed || !resp.Close {
			t.Errorf("Content-Length with Transfer-Encoding (%q): %d %s, Connection: close %v, closed %v; want the connection closed",
				key, resp.StatusCode, body, resp.Close, closed)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, p := range up.seen() {
		if strings.Contains(p, "smuggled") {
			t.Errorf("the upstream was asked for %q", p)
		}
	}

	resp, body, closed := idemtest.Exchange(t, idemtest.Dial(addr), "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
	var p problem
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(body, &p) != nil ||
		p.Type != "https://idemsvc.dev/problems/invalid-request" || p.Code != "invalid-request" || p.Title == "" || !closed {
		t.Errorf("unknown transfer coding: %d %s %s, closed %v; want a 400 problem and the connection closed", resp.StatusCode, resp.Header.Get("Content-Type"), body, closed)
	}

	before := len(up.seen())
	resp, body, _ = idemtest.Exchange(t, idemtest.Dial(addr), "post /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"lower\"\r\nContent-Length: 1\r\n\r\nx")
	if resp.StatusCode != 400 || json.Unmarshal(body, &p) != nil || p.Type != "https://idemsvc.dev/problems/invalid-request" {
		t.Errorf("post (lower case) with a key: %d %s, want a 400 problem", resp.StatusCode, body)
	}
	if n := len(up.seen()) - before; n != 0 {
		t.Errorf("post (lower case) reached the upstream %d times, want 0", n)
	}

	resp, body, _ = idemtest.Exchange(t, idemtest.Dial(addr), "GET /%6detrics HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != http.StatusCreated || string(body) != "upstream" {
		t.Errorf("GET /%%6detrics: %d %.60s, want the upstream's answer", resp.StatusCode, body)
	}
	if seen := up.seen(); seen[len(seen)-1] != "GET /%6detrics" {
		t.Errorf("the upstream was asked for %q, want GET /%%6detrics", seen[len(seen)-1])
	}
	resp, body, _ = idemtest.Exchange(t, idemtest.Dial(addr), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "idemproxy_requests_total") {
		t.Errorf("GET /metrics: %d, want idemproxy's metrics", resp.StatusCode)
	}
}

// An idemsvc that refuses idemproxy's credentials makes a keyed request
// 500 internal, a problem with its title.
func TestInternalProblemHasTitle(t *testing.T) {
	up := startPathsUpstream(t)
	svc := idemtest.Serve(t, handlers.Config{Keyring: idemtest.Keyring(t, idemtest.Tenant{Name: "t", Key: "right"})})
	url := serveProxy(t, svc.URL, up.URL, "--idemsvc-api-key", "wrong")
	req, _ := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"k"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != 500 || p.Title != "Internal error" ||
		p.Type != "https://idemsvc.dev/problems/internal" || p.Code != "internal" {
		t.Errorf("%d %+v %v, want 500 internal titled \"Internal error\"", resp.StatusCode, p, err)
	}
}

// stalledBodies connections each send a keyed POST of stalledBodyBytes
// less 64 B, and stall.
const (
	stalledBodies    = 1000
	stalledBodyBytes = 1 << 20
	stalledRSSBound  = 300e6
	testReadTimeout  = 3 * time.Second
)

// TestStalledBodiesBounded runs the idemproxy binary, so that its memory
// is its own, and holds its peak resident set under 300 MB while 1,000
// connections each send a keyed POST of about 1 MiB and stall; each is
// cut off within the read timeout. With IDEMPROXY_TEST_BINARY set it runs
// that binary instead of building one, to measure another build the same
// way.
func TestStalledBodiesBounded(t *testing.T) {
	p := startProxyForBodies(t)
	body := bytes.Repeat([]byte("x"), stalledBodyBytes-64)
	conns, wg := sendBodies(t, p.addr, body)
	defer closeAll(conns)
	sent := time.Now()
	time.Sleep(2 * time.Second)
	rss, peak := idemtest.Memory(t, p.pid)
	t.Logf("%d connections each sending %d of a keyed body of %d bytes, then stalling: VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB)",
		stalledBodies, len(body), stalledBodyBytes, rss/1e6, peak/1e6, p.startRSS/1e6)
	if peak > stalledRSSBound {
		t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, stalledRSSBound/1e6)
	}

	// Every connection is closed within the read timeout (and a margin
	// for the machine), having been answered or not.
	time.Sleep(time.Until(sent.Add(testReadTimeout + 4*time.Second)))
	open := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := io.Copy(io.Discard, c)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	wg.Wait()
	if open > 0 {
		t.Errorf("%d of %d connections still open %v after they stalled, want none past the read timeout of %v", open, stalledBodies, time.Since(sent).Round(time.Second), testReadTimeout)
	}
	for _, path := range p.up.seen() {
		t.Errorf("the upstream was asked for %q by a request whose body never came whole", path)
		break
	}
}

// TestWholeBodiesWithinBudget: 1,000 connections each send a whole keyed
// body of about 1 MiB at once, and read no answer; idemproxy holds the
// bodies it reads within its budget (IDEMPROXY_MAX_BODY_BYTES_IN_FLIGHT,
// 64 MiB by default), so its peak resident set stays under that budget
// plus 100 MB while they are served.
func TestWholeBodiesWithinBudget(t *testing.T) {
	p := startProxyForBodies(t)
	body := bytes.Repeat([]byte("x"), stalledBodyBytes)
	conns, wg := sendBodies(t, p.addr, body)
	defer closeAll(conns)
	const bound = 64<<20 + 100e6
	deadline := time.Now().Add(testReadTimeout + 4*time.Second)
	for time.Now().Before(deadline) {
		if _, peak := idemtest.Memory(t, p.pid); peak > bound {
			t.Fatalf("VmHWM = %.0f MB with %d whole bodies of %d bytes, want under the budget plus 100 MB (%.0f MB)", peak/1e6, stalledBodies, len(body), bound/1e6)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	rss, peak := idemtest.Memory(t, p.pid)
	t.Logf("%d connections each sending a whole keyed body of %d bytes: VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB); the upstream served %d",
		stalledBodies, len(body), rss/1e6, peak/1e6, p.startRSS/1e6, len(p.up.seen()))
	if len(p.up.seen()) == 0 {
		t.Error("no whole body reached the upstream: the bodies were never read")
	}
}

// bodiesProxy is an idemproxy binary in front of a recording upstream and
// an in-process idemsvc, with the test's read timeout.
type bodiesProxy struct {
	addr     string
	pid      int
	startRSS float64
	up       *pathsUpstream
}

// startProxyForBodies runs the idemproxy binary, so that its memory is its
// own; with IDEMPROXY_TEST_BINARY set it runs that binary instead of
// building one, to measure another build the same way.
func startProxyForBodies(t *testing.T) bodiesProxy {
	bin := idemtest.Binary(t, "IDEMPROXY_TEST_BINARY", "idemproxy")
	up := startPathsUpstream(t)
	svc := idemtest.Serve(t, handlers.Config{})
	cmd := exec.Command(bin)
	cmd.Env = []string{"IDEMPROXY_LISTEN=127.0.0.1:0", "IDEMPROXY_UPSTREAM=" + up.URL, "IDEMSVC_URL=" + svc.URL,
		"IDEMPROXY_READ_TIMEOUT_MS=" + strconv.Itoa(int(testReadTimeout.Milliseconds()))}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// The first line logs the version; the address follows.
	var line struct{ Addr string }
	logs := json.NewDecoder(stderr)
	for line.Addr == "" { // the line "idemproxy serving" has it
		if err := logs.Decode(&line); err != nil {
			t.Fatalf("no address logged: %v", err)
		}
	}
	go func() { _, _ = io.Copy(io.Discard, logs.Buffered()); _, _ = io.Copy(io.Discard, stderr) }()
	startRSS, _ := idemtest.Memory(t, cmd.Process.Pid)
	return bodiesProxy{addr: line.Addr, pid: cmd.Process.Pid, startRSS: startRSS, up: up}
}

// sendBodies opens stalledBodies connections to addr, each sending a keyed
// POST that declares stalledBodyBytes and sends body, and reads nothing.
func sendBodies(t *testing.T, addr string, body []byte) ([]net.Conn, *sync.WaitGroup) {
	conns := make([]net.Conn, stalledBodies)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			closeAll(conns)
			t.Fatal(err)
		}
		conns[i] = c
		wg.Go(func() {
			_ = c.SetWriteDeadline(time.Now().Add(testReadTimeout + 5*time.Second))
			head := fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"stall-%d\"\r\nContent-Length: %d\r\n\r\n", i, stalledBodyBytes)
			_, _ = io.WriteString(c, head)
			_, _ = c.Write(body) // cut short when idemproxy refuses or closes
		})
	}
	return conns, &wg
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c != nil {
			_ = c.Close()
		}
	}
}

// idemproxy's own problems carry their kind as code: a body over the limit
// is too-large, and an upstream that does not answer is 502 about:blank
// with code bad-gateway.
func TestOwnProblemsHaveCode(t *testing.T) {
	up := startPathsUpstream(t)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, up.URL, "--max-body-bytes", "4")
	req, _ := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader("too long"))
	req.Header.Set("Idempotency-Key", `"k"`)
	if status, p := doProblem(t, req); status != 413 || p.Code != "too-large" || p.Type != "https://idemsvc.dev/problems/too-large" || p.Title != "Too large" {
		t.Errorf("a body over the limit: %d %+v, want 413 too-large", status, p)
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	url = serveProxy(t, svc.URL, gone.URL)
	req, _ = http.NewRequest(http.MethodGet, url+"/pay", nil)
	if status, p := doProblem(t, req); status != 502 || p.Code != "bad-gateway" || p.Type != "about:blank" || p.Title != "Bad Gateway" {
		t.Errorf("no upstream: %d %+v, want 502 about:blank, code bad-gateway", status, p)
	}
}

// A keyed request with the scope header twice (a gateway that appended its
// header to the caller's) gets 400 and never reaches the upstream; once is
// fine, and so is twice on a request passed through (another method).
func TestScopeHeaderTwiceIsRefused(t *testing.T) {
	up := startPathsUpstream(t)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, up.URL, "--scope-header", "X-User")
	send := func(method, key string, users ...string) (int, problem) {
		req, _ := http.NewRequest(method, url+"/pay", strings.NewReader("x"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		for _, u := range users {
			req.Header.Add("X-User", u)
		}
		return doProblem(t, req)
	}
	before := len(up.seen())
	if status, p := send(http.MethodPost, `"twice"`, "alice", "bob"); status != 400 || p.Code != "invalid-request" || !strings.Contains(p.Detail, "X-User") {
		t.Errorf("X-User twice: %d %+v, want 400 invalid-request", status, p)
	}
	if n := len(up.seen()) - before; n != 0 {
		t.Errorf("X-User twice reached the upstream %d times, want 0", n)
	}
	if status, _ := send(http.MethodPost, `"once"`, "alice"); status != http.StatusCreated {
		t.Errorf("X-User once: %d, want the upstream's 201", status)
	}
	if status, _ := send(http.MethodPut, `"put"`, "alice", "bob"); status != http.StatusCreated {
		t.Errorf("PUT with X-User twice: %d, want the upstream's 201 (passed through)", status)
	}
}

// doProblem sends req and reads its answer as a problem (zero when it is none).
func doProblem(t *testing.T, req *http.Request) (int, problem) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	return resp.StatusCode, p
}

// fakeErrorBody is a body of 72 KiB holding, at offset 32768 (where the
// reverse proxy's second write of 32 KiB may begin) and at every 4 KiB
// before and after it (where other writes may begin), what looks like
// net/http's own error answer.
func fakeErrorBody() []byte {
	body := bytes.Repeat([]byte("a"), 72<<10)
	for at := 0; at < len(body); at += 4 << 10 {
		copy(body[at:], "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request")
	}
	return body
}

// An upstream's answer, passed through, executed under a key, and
// replayed from its record, reaches the caller byte for byte, whatever it
// holds: also bytes that look like net/http's own error answer where a
// write to the connection begins.
func TestAnswersPassedByteForByte(t *testing.T) {
	body := fakeErrorBody()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		for rest := body; len(rest) > 0; { // in writes of 32 KiB, each flushed
			n := min(len(rest), 32<<10)
			_, _ = w.Write(rest[:n])
			http.NewResponseController(w).Flush()
			rest = rest[n:]
		}
	}))
	t.Cleanup(up.Close)
	svc := idemtest.Serve(t, handlers.Config{})
	proxy := serveProxy(t, svc.URL, up.URL)
	for i, want := range []string{"", "", "true"} { // passed through, executed, replayed
		req, _ := http.NewRequest(http.MethodPost, proxy+"/pay", strings.NewReader(`{"amount":1}`))
		if i == 0 {
			req.Method = http.MethodPut // not a handled method
		} else {
			req.Header["idempotency-key"] = []string{`"byte-for-byte"`}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if replayed := resp.Header.Get("Idempotent-Replayed"); err != nil || !bytes.Equal(got, body) || (want == "true") != (replayed == "true") {
			t.Errorf("answer %d: %d bytes (%v), replayed %q; want the upstream's %d bytes as they are, replayed %q", i, len(got), err, replayed, len(body), want)
		}
	}
}

// The upstream's answer to a keyed request is counted in the budget of
// bodies in flight while the middleware holds it, and given back when the
// request ends.
func TestRecordedAnswerCountedInBudget(t *testing.T) {
	const size = 512 << 10
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("b"), size))
		http.NewResponseController(w).Flush()
		<-release
	}))
	t.Cleanup(up.Close)
	svc := idemtest.Serve(t, handlers.Config{})
	proxy := serveProxy(t, svc.URL, up.URL)
	done := make(chan int, 1)
	go func() {
		code, _, _ := post(t, proxy+"/pay", `"counted"`, `{}`)
		done <- code
	}()
	inFlight := func() float64 {
		line := strings.Fields(grep(metrics(t, proxy), "idemproxy_body_bytes_in_flight "))
		if len(line) != 2 {
			t.Fatalf("idemproxy_body_bytes_in_flight: %q", line)
		}
		v, _ := strconv.ParseFloat(line[1], 64)
		return v
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight() < size*answerCopies && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := inFlight(); got < size*answerCopies {
		t.Errorf("while the answer of %d bytes is recorded, %v bytes in flight, want at least %d", size, got, size*answerCopies)
	}
	close(release)
	if code := <-done; code != 200 {
		t.Fatalf("the keyed request: %d", code)
	}
	for inFlight() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := inFlight(); got != 0 {
		t.Errorf("%v bytes in flight after the request ended, want 0", got)
	}
}
