// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/testkit/logbuf"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// serve serves handler with cfg on a loopback port until the test ends.
func serve(t *testing.T, cfg Config, handler http.Handler) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Addr, cfg.Registry, cfg.MetricPrefix = "127.0.0.1:0", reg, "test"
	s, err := Listen(cfg, handler)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, reg
}

// get sends a GET of path on c and reads its answer.
func get(t *testing.T, c net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// closedSoon reports whether the server closes c within a second.
func closedSoon(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// At the connection cap, the connection idle longest is closed to make
// room for a new one; when every connection is busy, a new one gets 503
// at once and is closed, instead of waiting unanswered.
func TestConnectionCap(t *testing.T) {
	const max = 3
	release := make(chan struct{})
	blocked := make(chan struct{}, max)
	s, reg := serve(t, Config{MaxConnections: max}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			blocked <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	addr := s.Addr().String()
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}

	// Idle keep-alive connections hold the cap; a new caller is served,
	// and the first of them, idle longest, is closed.
	var idle []net.Conn
	for range max {
		c, br := dial()
		if resp := get(t, c, br, "/"); resp.StatusCode != 200 {
			t.Fatalf("GET /: %d", resp.StatusCode)
		}
		idle = append(idle, c)
		// The server makes it idle after the answer is sent: wait for
		// that, so that the order of idleness is the order here.
		for s.idleConns() != len(idle) {
			time.Sleep(time.Millisecond)
		}
	}
	c, br := dial()
	if resp := get(t, c, br, "/"); resp.StatusCode != 200 {
		t.Fatalf("a new caller at the cap: %d, want 200", resp.StatusCode)
	}
	if !closedSoon(idle[0]) {
		t.Error("the connection idle longest is still open")
	}
	for _, c := range idle[1:] {
		if closedSoon(c) {
			t.Error("a connection idle for less time was closed")
		}
	}
	for _, c := range append(idle, c) {
		_ = c.Close()
	}

	// Every connection busy: a new one is refused at once.
	var wg sync.WaitGroup
	for range max {
		c, br := dial()
		wg.Go(func() { get(t, c, br, "/block") })
	}
	for range max { // every request is in its handler
		<-blocked
	}
	c, br = dial()
	start := time.Now()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("past the cap: %v, want a 503", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !bytes.Contains(body, []byte("store-unavailable")) ||
		time.Since(start) > time.Second || !resp.Close {
		t.Errorf("past the cap: %d %s after %v, want a 503 problem at once, closing", resp.StatusCode, body, time.Since(start))
	}
	close(release)
	wg.Wait()
	if got := counter(t, reg, "test_connections_refused_total"); got != 1 {
		t.Errorf("test_connections_refused_total = %v, want 1", got)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// Failed TLS handshakes are all counted, and logged at most once per
// handshakeLogEvery with the number left unlogged.
func TestHandshakeFailuresRateLimited(t *testing.T) {
	ca := testpki.NewCA(t, "test CA")
	cert := ca.Issue(t, "server", "127.0.0.1").TLS(t)
	var logs logbuf.Buffer
	s, reg := serve(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}},
		Log: slog.New(slog.NewJSONHandler(&logs, nil))}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	const failures = 20
	for range failures {
		// Without the CA the client refuses the certificate.
		c, err := tls.Dial("tcp", s.Addr().String(), &tls.Config{ServerName: "server"})
		if err == nil {
			c.Close()
			t.Fatal("the handshake succeeded")
		}
	}
	for deadline := time.Now().Add(5 * time.Second); counter(t, reg, "test_tls_handshake_failures_total") < failures && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := counter(t, reg, "test_tls_handshake_failures_total"); got != failures {
		t.Errorf("test_tls_handshake_failures_total = %v, want %d", got, failures)
	}
	if n := strings.Count(logs.String(), "TLS handshake failed"); n != 1 {
		t.Errorf("%d lines logged for %d failures, want 1:\n%s", n, failures, logs.String())
	}

	// The next line after the interval says how many were not logged.
	var out logbuf.Buffer
	h := newHandshakeLog(slog.New(slog.NewJSONHandler(&out, nil)), prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}))
	h.every = 50 * time.Millisecond
	for range 5 {
		h.failed("client", errors.New("bad"))
	}
	time.Sleep(60 * time.Millisecond)
	h.failed("client", errors.New("bad"))
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], `"suppressed":4`) {
		t.Errorf("lines:\n%s\nwant 2, the second with suppressed 4", out.String())
	}
}

// A body is admitted while the budget has room, waits for room briefly,
// and is refused past it; bytes given back let a waiting body in.
func TestBudget(t *testing.T) {
	b := NewBudget(100, 2, false, nil, "test")
	ctx := context.Background()
	if err := b.Take(ctx, 30, Claim{}); err != nil || b.Held() != 60 {
		t.Fatalf("take 30 (twice): %v, held %d", err, b.Held())
	}
	start := time.Now()
	if err := b.Take(ctx, 30, Claim{}); !errors.Is(err, ErrOverBudget) || time.Since(start) < BudgetWait {
		t.Fatalf("take 30 more: %v after %v, want ErrOverBudget after %v", err, time.Since(start), BudgetWait)
	}
	// A take that waits gets in when bytes are given back. Its wait is
	// long enough for any scheduling: the give comes once it waits.
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error)
	go func() { done <- b.TakeBytes(waitCtx, 60, Claim{}) }()
	for b.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	b.Give(30, Claim{})
	if err := <-done; err != nil || b.Held() != 60 {
		t.Fatalf("a waiting take after a give: %v, held %d", err, b.Held())
	}

	big := NewBudget(1<<20, 1, false, nil, "test")
	body := bytes.Repeat([]byte("x"), 100<<10)
	got, taken, err := big.ReadBody(ctx, bytes.NewReader(body), -1, 1<<20, Claim{})
	if err != nil || !bytes.Equal(got, body) || taken != big.Held() || taken < int64(len(body)) {
		t.Fatalf("ReadBody: %v, %d bytes, taken %d, held %d", err, len(got), taken, big.Held())
	}
	big.Give(taken, Claim{})
	small := NewBudget(64<<10, 1, false, nil, "test")
	if _, taken, err := small.ReadBody(ctx, bytes.NewReader(body), int64(len(body)), 1<<20, Claim{}); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("ReadBody over the budget: %v", err)
	} else {
		small.Give(taken, Claim{})
	}
	if small.Held() != 0 {
		t.Errorf("held %d after all was given back", small.Held())
	}

	// A chunked body (length unknown) of exactly the maximum takes no
	// more than the maximum and a byte, once: 4 times its size fits.
	max := int64(2 << 20)
	exact := NewBudget(2*max+2, 1, false, nil, "test")
	body = bytes.Repeat([]byte("y"), int(max))
	got, taken, err = exact.ReadBody(ctx, bytes.NewReader(body), -1, max, Claim{})
	if err != nil || len(got) != len(body) || taken != max+1 {
		t.Fatalf("a chunked body of the maximum: %v, %d bytes, taken %d, want %d", err, len(got), taken, max+1)
	}
	exact.Give(taken, Claim{})
}

// With shares, one tenant's bodies hold at most half the budget, other
// bodies leave a quarter of it to those that finish an operation, and a
// tenant's finishing body gets in while another tenant holds its half
// and others' bodies the rest they may.
func TestBudgetShares(t *testing.T) {
	b := NewBudget(100, 1, true, nil, "test")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no waiting: a take either fits at once or is refused
	hog, other, third := Claim{Tenant: "hog"}, Claim{Tenant: "other"}, Claim{Tenant: "third"}
	if err := b.Take(ctx, 50, hog); err != nil {
		t.Fatalf("a tenant's half: %v", err)
	}
	if err := b.Take(ctx, 1, Claim{Tenant: "hog", Finish: true}); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("a tenant past its half: %v, want ErrOverBudget", err)
	}
	if err := b.Take(ctx, 25, third); err != nil {
		t.Fatalf("another tenant up to the reserve: %v", err)
	}
	if err := b.Take(ctx, 1, other); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("a body that does not finish, into the reserve: %v, want ErrOverBudget", err)
	}
	if err := b.Take(ctx, 25, Claim{Tenant: "other", Finish: true}); err != nil {
		t.Fatalf("a complete, into the reserve: %v", err)
	}
	b.Give(50, hog)
	b.Give(25, third)
	b.Give(25, Claim{Tenant: "other", Finish: true})
	if b.Held() != 0 || len(b.tenants) != 0 {
		t.Errorf("held %d, tenants %v after all was given back", b.Held(), b.tenants)
	}
}

// openConns counts the connections the server serves.
func (s *Server) openConns() int {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	return len(s.conns.conns)
}

// idleConns counts the connections the server sees idle.
func (s *Server) idleConns() int {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	n := 0
	for c := range s.conns.conns {
		if c.idleSince.Load() > 0 {
			n++
		}
	}
	return n
}

// A connection is active from its request's first byte: one still
// sending its head is not closed to make room, even though net/http
// reports it active only once the head is read.
func TestConnectionActiveFromFirstByte(t *testing.T) {
	s, _ := serve(t, Config{MaxConnections: 1}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	for s.openConns() != 1 || s.idleConns() != 0 { // the server has the connection, and has read its first bytes
		time.Sleep(time.Millisecond)
	}
	other, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a second connection at the cap of 1: %v %v, want 503", resp, err)
	}
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the request whose head was coming: %v %v, want 200", resp, err)
	}
}

// What a handler writes is passed on byte for byte, also when it holds
// what looks like net/http's own error answer where a write of the
// handler's begins (ReverseProxy copies 32 KiB at a time); net/http's own
// errors before any handler still become problems, on the same
// connection after an answer too.
func TestHandlerBytesUntouched(t *testing.T) {
	body := fakeErrorBody()
	s, _ := serve(t, Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body))) // not chunked: each write reaches the connection as it is
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			_, _ = w.Write(rest[:n])
			rest = rest[n:]
		}
	}))
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for range 2 {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body of %d bytes (%v), want the %d written", len(got), err, len(body))
		}
	}
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("a malformed request after answers: %v %v, want a 400 problem", resp, err)
	}
}

// A body that stops arriving has its connection cut within seconds (its
// pace fell under MinBodyRate), not at the read timeout, and the room it
// held in the budget is given back.
func TestBodyPace(t *testing.T) {
	b := NewBudget(64<<20, 1, false, nil, "test")
	read := make(chan error, 1)
	s, _ := serve(t, Config{ReadTimeout: time.Minute}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, taken, err := b.ReadBody(r.Context(), r.Body, r.ContentLength, 2<<20, Claim{})
		b.Give(taken, Claim{})
		read <- err
	}))
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
	_, _ = c.Write(make([]byte, 100<<10))
	select {
	case err := <-read:
		if !isTimeout(err) {
			t.Errorf("the stalled body's read: %v, want a timeout", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("cut after %v", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled body was not cut within 20 s")
	}
	if b.Held() != 0 {
		t.Errorf("held %d after the body was cut", b.Held())
	}
	// The connection is closed after the handler's answer.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("the connection of the stalled body: %v, want closed", err)
	}
}

// fakeErrorBody is a body of 72 KiB holding, at offset 32768 (where the
// second 32 KiB write of a copy begins), what looks like net/http's own
// error answer.
func fakeErrorBody() []byte {
	body := bytes.Repeat([]byte("a"), 72<<10)
	copy(body[32768:], "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request")
	return body
}
