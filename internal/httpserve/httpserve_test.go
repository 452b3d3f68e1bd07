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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/testpki"
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
	s, reg := serve(t, Config{MaxConnections: max}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
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
		time.Sleep(10 * time.Millisecond)
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
	time.Sleep(200 * time.Millisecond) // for the requests to be read
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
	var logs syncBuffer
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
	var out syncBuffer
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

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A body is admitted while the budget has room, waits for room briefly,
// and is refused past it; bytes given back let a waiting body in.
func TestBudget(t *testing.T) {
	b := NewBudget(100, 2, nil, "test")
	ctx := context.Background()
	if err := b.Take(ctx, 30); err != nil || b.Held() != 60 {
		t.Fatalf("take 30 (twice): %v, held %d", err, b.Held())
	}
	start := time.Now()
	if err := b.Take(ctx, 30); !errors.Is(err, ErrOverBudget) || time.Since(start) < BudgetWait {
		t.Fatalf("take 30 more: %v after %v, want ErrOverBudget after %v", err, time.Since(start), BudgetWait)
	}
	done := make(chan error)
	go func() { done <- b.Take(ctx, 30) }()
	time.Sleep(50 * time.Millisecond)
	b.Give(30)
	if err := <-done; err != nil || b.Held() != 60 {
		t.Fatalf("a waiting take after a give: %v, held %d", err, b.Held())
	}

	big := NewBudget(1<<20, 1, nil, "test")
	body := bytes.Repeat([]byte("x"), 100<<10)
	got, taken, err := big.ReadBody(ctx, bytes.NewReader(body), -1)
	if err != nil || !bytes.Equal(got, body) || taken != big.Held() || taken < int64(len(body)) {
		t.Fatalf("ReadBody: %v, %d bytes, taken %d, held %d", err, len(got), taken, big.Held())
	}
	big.Give(taken)
	small := NewBudget(64<<10, 1, nil, "test")
	if _, taken, err := small.ReadBody(ctx, bytes.NewReader(body), int64(len(body))); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("ReadBody over the budget: %v", err)
	} else {
		small.Give(taken)
	}
	if small.Held() != 0 {
		t.Errorf("held %d after all was given back", small.Held())
	}
}
