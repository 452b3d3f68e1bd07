// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

// callers is the HTTP client the tests send their requests with. It has a
// transport of its own: httptest.Server.Close closes http.DefaultTransport's
// idle connections, and a parallel test's request that has just taken one
// of them then fails ("http: CloseIdleConnections called").
var callers = &http.Client{Transport: &http.Transport{}}

// serveIdempotent serves h behind idem.Middleware(c, opts) until the test
// ends.
func serveIdempotent(t *testing.T, c *idem.Client, opts idem.MiddlewareOptions, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(idem.Middleware(c, opts)(h))
	t.Cleanup(srv.Close)
	return srv.URL
}

// answer is a response as a test sees it.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// send makes one request with the idempotency key (none when empty).
func send(t *testing.T, method, url, key string, body []byte) answer {
	t.Helper()
	a, err := request(method, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sendAsync sends the request on another goroutine; the answer comes on
// the channel, a zero one when the request failed.
func sendAsync(t *testing.T, method, url, key string, body []byte) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		a, err := request(method, url, key, body)
		if err != nil {
			t.Error(err)
		}
		out <- a
	}()
	return out
}

func request(method, url, key string, body []byte) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := callers.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	}
	return answer{resp.StatusCode, resp.Header, b}, nil
}

// problemKind is the kind of a problem+json answer, "" for another answer.
func problemKind(a answer) string {
	if a.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p idem.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		return ""
	}
	return (&idem.Error{Problem: p}).Kind()
}

// A duplicate gets the first response byte for byte, binary body and
// allowed headers included, marked Idempotent-Replayed; headers off the
// allow-list reach the first caller only.
func TestMiddlewareReplaysByteForByte(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		in, _ := io.ReadAll(r.Body) // the middleware read it first: it must still be there
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Location", "/blobs/1")
		w.Header().Set("X-Request-Id", "req-"+strconv.Itoa(int(n)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(append([]byte{0xff, 0x00, 0xc3, 0x28, 0x80, '\n'}, in...))
	})
	reqBody := []byte{0xde, 0xad, 0xbe, 0xef, 0x00}
	want := append([]byte{0xff, 0x00, 0xc3, 0x28, 0x80, '\n'}, reqBody...)

	first := send(t, http.MethodPost, url+"/blobs", "upload-1", reqBody)
	if first.status != http.StatusCreated || !bytes.Equal(first.body, want) ||
		first.header.Get("X-Request-Id") != "req-1" || first.header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("first = %d %v %x; want the handler's 201, not replayed", first.status, first.header, first.body)
	}
	for range 2 {
		dup := send(t, http.MethodPost, url+"/blobs", "upload-1", reqBody)
		if dup.status != http.StatusCreated || !bytes.Equal(dup.body, want) {
			t.Errorf("duplicate = %d %x, want %d %x", dup.status, dup.body, first.status, first.body)
		}
		if dup.header.Get(idem.ReplayedHeader) != "true" {
			t.Errorf("duplicate's %s = %q, want true", idem.ReplayedHeader, dup.header.Get(idem.ReplayedHeader))
		}
		if dup.header.Get("Content-Type") != "application/octet-stream" || dup.header.Get("Location") != "/blobs/1" {
			t.Errorf("duplicate's headers %v lack the allowed Content-Type and Location", dup.header)
		}
		if v := dup.header.Get("X-Request-Id"); v != "" {
			t.Errorf("duplicate has X-Request-Id %q, which is not on the allow-list", v)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// Headers replaces the default allow-list.
func TestMiddlewareHeaderAllowList(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	url := serveIdempotent(t, c, idem.MiddlewareOptions{Headers: []string{"x-charge-id"}}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Charge-Id", "ch_1")
		w.Header().Set("Location", "/charges/ch_1")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	})
	first := send(t, http.MethodPost, url+"/charges", "charge-1", []byte(`{"amount":100}`))
	if first.header.Get("Location") != "/charges/ch_1" || first.header.Get("X-Charge-Id") != "ch_1" {
		t.Fatalf("first's headers %v: want every header the handler set", first.header)
	}
	dup := send(t, http.MethodPost, url+"/charges", "charge-1", []byte(`{"amount":100}`))
	if dup.header.Get(idem.ReplayedHeader) != "true" || dup.header.Get("X-Charge-Id") != "ch_1" || string(dup.body) != `{"id":"ch_1"}` {
		t.Errorf("duplicate = %d %v %q, want the replay with X-Charge-Id", dup.status, dup.header, dup.body)
	}
	if v := dup.header.Get("Location"); v != "" {
		t.Errorf("duplicate has Location %q, which is not on this allow-list", v)
	}
}

// A duplicate of a request still running gets 409 with Retry-After, or,
// when it may wait, the first request's response.
func TestMiddlewareDuplicateWhileRunning(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	var runs atomic.Int32
	handler := func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte("queued"))
	}
	noWait := serveIdempotent(t, c, idem.MiddlewareOptions{}, handler)
	waiting := serveIdempotent(t, c, idem.MiddlewareOptions{Wait: 5 * time.Second}, handler)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // runs before the servers close, should the test stop early

	firstc := sendAsync(t, http.MethodPost, noWait+"/jobs", "job-1", []byte("a"))
	recv(t, entered, "the handler to run")

	dup := send(t, http.MethodPost, noWait+"/jobs", "job-1", []byte("a"))
	retryAfter, err := strconv.Atoi(dup.header.Get("Retry-After"))
	if dup.status != http.StatusConflict || problemKind(dup) != "in-progress" || err != nil || retryAfter < 1 {
		t.Errorf("duplicate while running = %d %v %s; want 409 in-progress with Retry-After", dup.status, dup.header, dup.body)
	}

	// Through a middleware that waits: the duplicate is held until the
	// first request is done, then replayed.
	begins := svc.calls.get("/v1/begin")
	waitedc := sendAsync(t, http.MethodPost, waiting+"/jobs", "job-1", []byte("a"))
	waitFor(t, "the waiting duplicate's begin", func() bool { return svc.calls.get("/v1/begin") > begins })

	releaseOnce()
	first := recv(t, firstc, "the first answer")
	if first.status != http.StatusAccepted || string(first.body) != "queued" || first.header.Get(idem.ReplayedHeader) != "" {
		t.Errorf("first = %d %v %q, want the handler's 202", first.status, first.header, first.body)
	}
	waited := recv(t, waitedc, "the waiting duplicate's answer")
	if waited.status != http.StatusAccepted || string(waited.body) != "queued" || waited.header.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("waiting duplicate = %d %v %q, want the replayed 202", waited.status, waited.header, waited.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// A key reused for another request (another body, path or method) gets
// 422 without running the handler.
func TestMiddlewareFingerprintMismatch(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		_, _ = w.Write([]byte("ok"))
	})
	if a := send(t, http.MethodPost, url+"/orders", "order-1", []byte(`{"qty":1}`)); a.status != http.StatusOK {
		t.Fatalf("first = %d %s", a.status, a.body)
	}
	for _, r := range []struct{ method, path, body string }{
		{http.MethodPost, "/orders", `{"qty":2}`},
		{http.MethodPost, "/refunds", `{"qty":1}`},
		{http.MethodPatch, "/orders", `{"qty":1}`},
		{http.MethodPost, "/orders?express=1", `{"qty":1}`},
	} {
		a := send(t, r.method, url+r.path, "order-1", []byte(r.body))
		if a.status != http.StatusUnprocessableEntity || problemKind(a) != "fingerprint-mismatch" {
			t.Errorf("%s %s %s with the same key = %d %s, want 422 fingerprint-mismatch", r.method, r.path, r.body, a.status, a.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// POST and PATCH need a key unless Optional; other methods pass without.
func TestMiddlewareMissingKey(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	handler := func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		_, _ = w.Write([]byte("ran"))
	}
	strict := serveIdempotent(t, c, idem.MiddlewareOptions{}, handler)
	optional := serveIdempotent(t, c, idem.MiddlewareOptions{Optional: true}, handler)

	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		a := send(t, method, strict+"/orders", "", []byte("{}"))
		if a.status != http.StatusBadRequest || problemKind(a) != "invalid-request" {
			t.Errorf("%s without a key = %d %s, want 400 invalid-request", method, a.status, a.body)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for requests without a key", n)
	}
	if a := send(t, http.MethodGet, strict+"/orders", "", nil); a.status != http.StatusOK || string(a.body) != "ran" {
		t.Errorf("GET without a key = %d %s, want the handler's answer", a.status, a.body)
	}
	for range 2 {
		a := send(t, http.MethodPost, optional+"/orders", "", []byte("{}"))
		if a.status != http.StatusOK || string(a.body) != "ran" || a.header.Get(idem.ReplayedHeader) != "" {
			t.Errorf("POST without a key, Optional = %d %v %s; want the handler's answer", a.status, a.header, a.body)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("the handler ran %d times, want 3 (GET and both optional POSTs)", n)
	}
}

// A 5xx from the handler releases the key: the next request runs it again.
func TestMiddlewareServerErrorIsRetryable(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			http.Error(w, "database down", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("created"))
	})
	if a := send(t, http.MethodPost, url+"/orders", "order-5", []byte("{}")); a.status != http.StatusInternalServerError {
		t.Errorf("first = %d %s, want the handler's 500", a.status, a.body)
	}
	st, err := c.Status(testContext(t), "order-5", false)
	if err != nil || st.State != idem.StateFailed || st.Retryable == nil || !*st.Retryable {
		t.Errorf("status after the 500 = %+v, %v; want a retryable failure", st, err)
	}
	if a := send(t, http.MethodPost, url+"/orders", "order-5", []byte("{}")); a.status != http.StatusCreated || a.header.Get(idem.ReplayedHeader) != "" {
		t.Errorf("retry = %d %s, want the handler run again", a.status, a.body)
	}
	if a := send(t, http.MethodPost, url+"/orders", "order-5", []byte("{}")); a.status != http.StatusCreated ||
		string(a.body) != "created" || a.header.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("third = %d %v %s, want the 201 replayed", a.status, a.header, a.body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
}

// Without idemsvc nothing runs: the middleware answers 503.
func TestMiddlewareFailsClosed(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	c := newClient(t, down.URL, idem.WithRetryBudget(100*time.Millisecond))
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
	})
	a := send(t, http.MethodPost, url+"/orders", "order-1", []byte("{}"))
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || problemKind(a) != "store-unavailable" {
		t.Errorf("with idemsvc down = %d %v %s; want 503 with Retry-After", a.status, a.header, a.body)
	}
	if runs.Load() != 0 {
		t.Error("the handler ran without idemsvc")
	}
}

// A key idemsvc refuses, or a body over MaxBodyBytes, is the caller's
// mistake: 400 and 413, and the handler does not run.
func TestMiddlewareRefusesBadRequests(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{MaxBodyBytes: 16}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
	})
	if a := send(t, http.MethodPost, url+"/orders", "key with spaces", []byte("{}")); a.status != http.StatusBadRequest || problemKind(a) != "invalid-request" {
		t.Errorf("a key with spaces = %d %s, want 400 invalid-request", a.status, a.body)
	}
	if a := send(t, http.MethodPost, url+"/orders", "big", bytes.Repeat([]byte("x"), 17)); a.status != http.StatusRequestEntityTooLarge || problemKind(a) != "too-large" {
		t.Errorf("a 17-byte body over a 16-byte limit = %d %s, want 413 too-large", a.status, a.body)
	}
	if runs.Load() != 0 {
		t.Error("the handler ran for a refused request")
	}
}

// A response too large for idemsvc to store is stored without its body: the
// handler ran, a duplicate must not run it again, and learns the first
// answer's status and headers, marked Idempotent-Body-Omitted.
func TestMiddlewareUnstorableResponseIsNotRunAgain(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{Lease: 200 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/exports/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 2<<20))
	})
	first := send(t, http.MethodPost, url+"/exports", "export-1", nil)
	if first.status != http.StatusCreated || len(first.body) != 2<<20 || first.header.Get(idem.BodyOmittedHeader) != "" {
		t.Fatalf("first = %d with %d bytes; want the handler's whole 201", first.status, len(first.body))
	}
	time.Sleep(300 * time.Millisecond) // past the lease: a key left in progress would be taken over
	again := send(t, http.MethodPost, url+"/exports", "export-1", nil)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times for one key", runs.Load())
	}
	if again.status != http.StatusCreated || again.header.Get(idem.ReplayedHeader) != "true" ||
		again.header.Get(idem.BodyOmittedHeader) != "true" || again.header.Get("Location") != "/exports/1" || len(again.body) != 0 {
		t.Errorf("duplicate = %d %v with %d bytes; want a replayed 201 with its Location, no body, marked", again.status, again.header, len(again.body))
	}
}

// A key idemsvc does not accept is a misconfiguration, not an outage: 500,
// without Retry-After.
func TestMiddlewareWrongAPIKey(t *testing.T) {
	t.Parallel()
	keyring := idemtest.Keyring(t, idemtest.Tenant{Name: "shop", Key: "right"})
	svc := startIdemsvc(t, keyring)
	c := newClient(t, svc.URL, idem.WithAPIKey("wrong"))
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })
	a := send(t, http.MethodPost, url+"/orders", "order-1", []byte("{}"))
	if a.status != http.StatusInternalServerError || a.header.Get("Retry-After") != "" || runs.Load() != 0 {
		t.Errorf("with a wrong API key = %d %v %s, %d runs; want 500 without Retry-After, no run", a.status, a.header, a.body, runs.Load())
	}
}

// The Idempotency-Key header draft, as the contract's "one middleware
// behaviour" states it: only the configured methods; the key a Structured
// Field String (a bare token the same key), an empty or malformed one 400;
// 5xx, 408 and 429 not stored, so a retry runs the handler again.
func TestMiddlewareHeaderDraft(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	status := map[string]int{"/busy": http.StatusTooManyRequests, "/slow": http.StatusRequestTimeout, "/down": http.StatusBadGateway}
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if code, ok := status[r.URL.Path]; ok {
			w.WriteHeader(code)
			return
		}
		fmt.Fprintf(w, `{"run":%d}`, n)
	})

	// Other methods run every time, key or not, and store nothing.
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		runs.Store(0)
		for range 2 {
			if a := send(t, method, url+"/orders", "k-"+method, nil); a.status != http.StatusOK || a.header.Get(idem.ReplayedHeader) != "" {
				t.Errorf("%s with a key = %d %v", method, a.status, a.header)
			}
		}
		if runs.Load() != 2 {
			t.Errorf("%s with a key ran %d times in 2 requests, want 2", method, runs.Load())
		}
	}

	// "abc" and abc are one key.
	runs.Store(0)
	first := send(t, http.MethodPost, url+"/orders", `"sf-key"`, nil)
	again := send(t, http.MethodPost, url+"/orders", `sf-key`, nil)
	if runs.Load() != 1 || again.header.Get(idem.ReplayedHeader) != "true" || string(again.body) != string(first.body) {
		t.Errorf(`"sf-key" then sf-key: %d runs, second %d %s`, runs.Load(), again.status, again.body)
	}
	for _, bad := range []string{`""`, `"abc`, `"a"b"`, `"a\x"`, `a,b`, `"` + strings.Repeat("k", 256) + `"`} {
		if a := send(t, http.MethodPost, url+"/orders", bad, nil); a.status != http.StatusBadRequest || problemKind(a) != "invalid-request" {
			t.Errorf("key %q = %d %s, want 400 invalid-request", bad, a.status, a.body)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("the handler ran for a refused key")
	}

	// 429, 408 and 5xx are not stored: the retry runs the handler again.
	for path, code := range status {
		runs.Store(0)
		key := "retry" + path
		for range 2 {
			if a := send(t, http.MethodPost, url+path, key, nil); a.status != code || a.header.Get(idem.ReplayedHeader) != "" {
				t.Errorf("%s = %d %v, want the handler's %d", path, a.status, a.header, code)
			}
		}
		if runs.Load() != 2 {
			t.Errorf("a %d ran %d times in 2 requests with one key, want 2", code, runs.Load())
		}
	}
}

// The SDK's calls say who they are (User-Agent) and carry the incoming
// request's X-Request-Id, so idemsvc's log lines match the caller's.
func TestMiddlewareIdentifiesItsCalls(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	url := serveIdempotent(t, newClient(t, svc.URL), idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {})
	req, _ := http.NewRequest(http.MethodPost, url+"/orders", nil)
	req.Header.Set("Idempotency-Key", "identified")
	req.Header.Set("X-Request-Id", "req-7f3a")
	resp, err := callers.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := svc.received()
	if len(got) < 2 {
		t.Fatalf("idemsvc received %d requests, want begin and complete", len(got))
	}
	for _, h := range got {
		if h.Get("X-Request-Id") != "req-7f3a" || !strings.HasPrefix(h.Get("User-Agent"), "idemsvc-go/"+idem.Version) {
			t.Errorf("a call carried X-Request-Id %q, User-Agent %q", h.Get("X-Request-Id"), h.Get("User-Agent"))
		}
	}
}

// Without idemsvc the middleware fails closed within its budget (2 s by
// default), not after the client's 15 s retry budget, and the handler
// does not run.
func TestMiddlewareFailsClosedFast(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	var runs atomic.Int32
	url := serveIdempotent(t, newClient(t, down), idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })
	start := time.Now()
	a := send(t, http.MethodPost, url+"/orders", "down", nil)
	took := time.Since(start)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || runs.Load() != 0 {
		t.Errorf("without idemsvc = %d %v, handler ran %d times", a.status, a.header, runs.Load())
	}
	if took > 4*time.Second { // the budget is 2 s; the rest is margin for a busy machine
		t.Errorf("the 503 took %v", took)
	}
}

// The middleware's own problems carry idemsvc's titles and codes for the
// same kinds.
func TestMiddlewareProblemTitlesAreIdemsvcs(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	title := func(body []byte) string {
		var p idem.Problem
		_ = json.Unmarshal(body, &p)
		if p.Code == "" {
			return "no code: " + p.Title
		}
		return p.Title + " (" + p.Code + ")"
	}
	// idemsvc's own: a fingerprint mismatch and an invalid request.
	api := c.API()
	ctx := testContext(t)
	if _, err := api.BeginWithResponse(ctx, idem.BeginRequest{Key: "titles", Fingerprint: ptr("a")}); err != nil {
		t.Fatal(err)
	}
	mismatch, err := api.BeginWithResponse(ctx, idem.BeginRequest{Key: "titles", Fingerprint: ptr("b")})
	if err != nil || mismatch.StatusCode() != http.StatusUnprocessableEntity {
		t.Fatalf("fingerprint mismatch: %v %v", mismatch, err)
	}
	invalid, err := api.BeginWithResponse(ctx, idem.BeginRequest{Key: ""})
	if err != nil || invalid.StatusCode() != http.StatusBadRequest {
		t.Fatalf("invalid request: %v %v", invalid, err)
	}

	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	send(t, http.MethodPost, url+"/orders", "order-1", []byte(`{"qty":1}`))
	if a := send(t, http.MethodPost, url+"/orders", "order-1", []byte(`{"qty":2}`)); title(a.body) != title(mismatch.Body) {
		t.Errorf("the middleware's 422 title %q, idemsvc's %q", title(a.body), title(mismatch.Body))
	}
	if a := send(t, http.MethodPost, url+"/orders", "", []byte(`{}`)); title(a.body) != title(invalid.Body) {
		t.Errorf("the middleware's 400 title %q, idemsvc's %q", title(a.body), title(invalid.Body))
	}
}

// An answer over MaxStoredBodyBytes goes to the caller as the handler
// writes it, not held whole: memory stays bounded whatever its size, and
// its replays carry the status and headers with Idempotent-Body-Omitted.
func TestMiddlewareLargeAnswerIsStreamed(t *testing.T) {
	svc := startIdemsvc(t, nil)
	const size = 64 << 20
	chunk := bytes.Repeat([]byte("z"), 32<<10)
	opts := idem.MiddlewareOptions{Headers: []string{"Content-Type", "Link"}}
	url := serveIdempotent(t, newClient(t, svc.URL), opts, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Add("Link", "</a>; rel=preload")
		w.Header().Add("Link", "</b>; rel=preload")
		w.WriteHeader(http.StatusCreated)
		for n := 0; n < size; n += len(chunk) {
			_, _ = w.Write(chunk)
		}
	})
	key := "large-" + t.Name()
	req, _ := http.NewRequest(http.MethodPost, url, nil)
	req.Header.Set("Idempotency-Key", key)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := callers.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	if err != nil || n != size || resp.StatusCode != http.StatusCreated {
		t.Fatalf("first answer: %d, %d bytes, %v; want 201 and %d bytes", resp.StatusCode, n, err, size)
	}
	// The test's own client and server share this process: a held answer
	// would allocate its 64 MiB several times over.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("%d MiB allocated for a %d MiB answer: it was held, not streamed", alloc>>20, size>>20)
	}
	replay := send(t, http.MethodPost, url, key, nil)
	if replay.status != http.StatusCreated || len(replay.body) != 0 ||
		replay.header.Get(idem.ReplayedHeader) != "true" || replay.header.Get(idem.BodyOmittedHeader) != "true" {
		t.Errorf("replay: %d, %d bytes, %v", replay.status, len(replay.body), replay.header)
	}
	if got := replay.header.Values("Link"); len(got) != 1 || got[0] != "</a>; rel=preload, </b>; rel=preload" {
		t.Errorf("replayed Link: %q, want both values in one field", got)
	}
}

// A handled method spelt in other case (post for POST) is refused with
// 400, not passed through unkeyed: HTTP methods are case-sensitive, but
// a handler may take post as POST.
func TestMiddlewareRefusesMethodInOtherCase(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	var runs atomic.Int32
	url := serveIdempotent(t, newClient(t, svc.URL), idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		_, _ = w.Write([]byte("ok"))
	})
	for _, method := range []string{"post", "Patch"} {
		a := send(t, method, url+"/orders", "case-"+method, []byte(`{}`))
		var p idem.Problem
		if a.status != http.StatusBadRequest || json.Unmarshal(a.body, &p) != nil || p.Title == "" ||
			!strings.HasSuffix(p.Type, "/invalid-request") {
			t.Errorf("%s: %d %s, want a 400 problem", method, a.status, a.body)
		}
	}
	if a := send(t, "get", url+"/orders", "case-get", nil); a.status != http.StatusOK {
		t.Errorf("get (not handled in any case): %d, want it passed through", a.status)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (for get)", n)
	}
}

// sendAs makes one request with the key and the headers given (name,
// value, ...).
func sendAs(t *testing.T, url, key, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := callers.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

// bob, sending alice's key and request, never gets alice's answer: the
// credentials' digest (the Authorization header, the cookies named) gets
// him 422, a scope runs his own request; only Unscoped hands him alice's.
func TestMiddlewareUsersNeverShareAnswers(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL, idem.WithAPIKey("unused-by-an-open-idemsvc"))
	user := func(r *http.Request) string { return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") }
	for _, tc := range []struct {
		name       string
		opts       idem.MiddlewareOptions
		alice, bob []string
		bobStatus  int
		bobBody    string
	}{
		{"a bearer token", idem.MiddlewareOptions{},
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 422, ""},
		{"a cookie named", idem.MiddlewareOptions{CredentialCookies: []string{"session"}},
			[]string{"Cookie", "session=a; theme=dark"}, []string{"Cookie", "session=b; theme=dark"}, 422, ""},
		{"a scope", idem.MiddlewareOptions{Scope: user},
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 201, "run 2"},
		{"a scope that names no one: the credentials then", idem.MiddlewareOptions{Scope: func(*http.Request) string { return "" }},
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 422, ""},
		{"unscoped", idem.MiddlewareOptions{Unscoped: true},
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 201, "run 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			url := serveIdempotent(t, c, tc.opts, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d", runs.Add(1))
			})
			key := "order-" + strings.ReplaceAll(tc.name, " ", "-")
			if a := sendAs(t, url, key, `{"a":1}`, tc.alice...); a.status != 201 || string(a.body) != "run 1" {
				t.Fatalf("alice: %d %q", a.status, a.body)
			}
			bob := sendAs(t, url, key, `{"a":1}`, tc.bob...)
			if bob.status != tc.bobStatus || tc.bobBody != "" && string(bob.body) != tc.bobBody {
				t.Errorf("bob: %d %q, want %d %q", bob.status, bob.body, tc.bobStatus, tc.bobBody)
			}
			if !tc.opts.Unscoped && (string(bob.body) == "run 1" || bob.header.Get(idem.ReplayedHeader) != "") {
				t.Errorf("bob got alice's answer: %q", bob.body)
			}
			if a := sendAs(t, url, key, `{"a":1}`, tc.alice...); string(a.body) != "run 1" || a.header.Get(idem.ReplayedHeader) != "true" {
				t.Errorf("alice again: %d %q, want her answer replayed", a.status, a.body)
			}
		})
	}
}

// A record stored by an earlier version, under the fingerprint without a
// version, replays; with NoLegacyFingerprints it gets 422. The lookup (a
// status call, never a second begin) happens after a mismatch only.
func TestMiddlewareReplaysRecordsOfEarlierVersions(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	body := `{ "amount": 100 }`
	sum := sha256.Sum256([]byte("POST\x00/orders?\x00" + body))
	res, err := c.Begin(ctx, idem.BeginParams{Key: "before-upgrade", Fingerprint: "sha256:" + hex.EncodeToString(sum[:])})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin: %+v, %v", res, err)
	}
	if _, err := c.Complete(ctx, "before-upgrade", res.Lease.LeaseToken, idem.Response{StatusCode: 201, Body: []byte("stored before")}, 0); err != nil {
		t.Fatal(err)
	}
	ran := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ran again")) }
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, ran)
	begins := svc.calls.get("/v1/begin")
	a := sendAs(t, url+"/orders", "before-upgrade", body, "Content-Type", "application/json", "Authorization", "Bearer alice")
	if a.status != 201 || string(a.body) != "stored before" || a.header.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("%d %q, want the record stored before replayed", a.status, a.body)
	}
	if n, m := svc.calls.get("/v1/begin")-begins, svc.calls.get("/v1/status"); n != 1 || m != 1 {
		t.Errorf("%d begins and %d status calls, want 1 and 1: the begin, then the lookup of the legacy record", n, m)
	}
	begins = svc.calls.get("/v1/begin")
	if a := sendAs(t, url+"/orders", "after-upgrade", body); a.status != 200 || svc.calls.get("/v1/begin")-begins != 1 {
		t.Errorf("a new key: %d %q after %d begins, want 200 after 1", a.status, a.body, svc.calls.get("/v1/begin")-begins)
	}
	strict := serveIdempotent(t, c, idem.MiddlewareOptions{NoLegacyFingerprints: true}, ran)
	if a := sendAs(t, strict+"/orders", "before-upgrade", body); a.status != http.StatusUnprocessableEntity {
		t.Errorf("NoLegacyFingerprints: %d %q, want 422", a.status, a.body)
	}
}

// The legacy fingerprint only ever finds a record, never makes one: the
// lookup reads the record, replays a terminal failure, answers 409 while
// one is in progress and 422 for anything else; a record deleted between
// the begin and the lookup is not begun again under the legacy fingerprint.
func TestMiddlewareLegacyFingerprintNeverAcquires(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	body := `{"amount":100}`
	sum := sha256.Sum256([]byte("POST\x00/orders?\x00" + body))
	legacy := "sha256:" + hex.EncodeToString(sum[:])
	ran := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ran")) }
	url := serveIdempotent(t, c, idem.MiddlewareOptions{}, ran) + "/orders"
	auth := []string{"Content-Type", "application/json", "Authorization", "Bearer bob"}

	res, err := c.Begin(ctx, idem.BeginParams{Key: "legacy-failed", Fingerprint: legacy})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin: %+v, %v", res, err)
	}
	if _, err := c.Fail(ctx, "legacy-failed", res.Lease.LeaseToken, idem.FailParams{Terminal: true, Error: "declined",
		Response: idem.Response{StatusCode: 402, Body: []byte("declined before")}}); err != nil {
		t.Fatal(err)
	}
	if a := sendAs(t, url, "legacy-failed", body, auth...); a.status != 402 || string(a.body) != "declined before" || a.header.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("terminal failure: %d %q, want its 402 replayed", a.status, a.body)
	}

	if res, err = c.Begin(ctx, idem.BeginParams{Key: "legacy-running", Fingerprint: legacy, Lease: 30 * time.Second}); err != nil || res.Lease == nil {
		t.Fatalf("begin: %+v, %v", res, err)
	}
	if a := sendAs(t, url, "legacy-running", body, auth...); a.status != http.StatusConflict || a.header.Get("Retry-After") == "" {
		t.Errorf("in progress: %d %q Retry-After %q, want 409 with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}

	// alice's record: bob's request, the same but for its credentials,
	// gets 422, and alice's record stays as it was.
	if a := sendAs(t, url, "alice-only", body, "Content-Type", "application/json", "Authorization", "Bearer alice"); a.status != 200 {
		t.Fatalf("alice: %d %q", a.status, a.body)
	}
	before, err := c.Status(ctx, "alice-only", false)
	if err != nil {
		t.Fatal(err)
	}
	begins, statuses := svc.calls.get("/v1/begin"), svc.calls.get("/v1/status")
	if a := sendAs(t, url, "alice-only", body, auth...); a.status != http.StatusUnprocessableEntity {
		t.Errorf("bob: %d %q, want 422", a.status, a.body)
	}
	if n, m := svc.calls.get("/v1/begin")-begins, svc.calls.get("/v1/status")-statuses; n != 1 || m != 1 {
		t.Errorf("bob: %d begins, %d status calls; want 1 and 1", n, m)
	}
	if after, err := c.Status(ctx, "alice-only", false); err != nil || *after.Fingerprint != *before.Fingerprint || after.Attempt != before.Attempt {
		t.Errorf("alice's record after bob's request: %+v, %v; want it unchanged", after, err)
	}

	// Deleted between bob's begin (422) and the lookup: 422, and no record.
	deleting := &deleteAfterMismatch{base: http.DefaultTransport, c: c}
	dc := newClient(t, svc.URL, idem.WithHTTP(&http.Client{Transport: deleting}))
	durl := serveIdempotent(t, dc, idem.MiddlewareOptions{}, ran) + "/orders"
	if a := sendAs(t, durl, "alice-only", body, auth...); a.status != http.StatusUnprocessableEntity {
		t.Errorf("deleted meanwhile: %d %q, want 422", a.status, a.body)
	}
	if !deleting.deleted.Load() {
		t.Fatal("the record was not deleted between the calls")
	}
	if rec, err := c.Status(ctx, "alice-only", false); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("after the lookup: %+v, %v; want no record (none made with the legacy fingerprint)", rec, err)
	}
}

// deleteAfterMismatch deletes the key of a begin answered 422 before the
// answer reaches the middleware: the record is gone by its lookup.
type deleteAfterMismatch struct {
	base    http.RoundTripper
	c       *idem.Client
	deleted atomic.Bool
}

func (d *deleteAfterMismatch) RoundTrip(r *http.Request) (*http.Response, error) {
	var key struct{ Key string }
	if r.URL.Path == "/v1/begin" && r.GetBody != nil {
		if b, err := r.GetBody(); err == nil {
			_ = json.NewDecoder(b).Decode(&key)
		}
	}
	resp, err := d.base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusUnprocessableEntity && key.Key != "" {
		if err := d.c.Delete(r.Context(), key.Key); err == nil {
			d.deleted.Store(true)
		}
	}
	return resp, err
}

// JSON that a float64 does not hold exactly keeps its raw bytes: another
// account number under the same key gets 422, not the first answer.
func TestMiddlewareInexactNumbersGet422(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	url := serveIdempotent(t, newClient(t, svc.URL), idem.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	first := sendAs(t, url, "transfer", `{"to_account":9007199254740993}`, "Content-Type", "application/json")
	if first.status != 200 {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	if a := sendAs(t, url, "transfer", `{"to_account":9007199254740992}`, "Content-Type", "application/json"); a.status != http.StatusUnprocessableEntity {
		t.Errorf("another account: %d %q, want 422", a.status, a.body)
	}
	if a := sendAs(t, url, "transfer", `{"to_account":9007199254740993}`, "Content-Type", "application/json"); string(a.body) != `{"to_account":9007199254740993}` || a.header.Get(idem.ReplayedHeader) != "true" {
		t.Errorf("the same request: %d %q, want it replayed", a.status, a.body)
	}
}

// Configured methods are taken in upper case; Scope with Unscoped panics.
func TestMiddlewareOptionsNormalized(t *testing.T) {
	t.Parallel()
	svc := startIdemsvc(t, nil)
	c := newClient(t, svc.URL)
	var runs atomic.Int32
	url := serveIdempotent(t, c, idem.MiddlewareOptions{Methods: []string{"post"}}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "run %d", runs.Add(1))
	})
	for i := range 2 {
		if a := sendAs(t, url, "lower-case-methods", `{}`); a.status != 200 || string(a.body) != "run 1" {
			t.Errorf("POST %d with Methods [post]: %d %q, want run 1", i, a.status, a.body)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Scope with Unscoped: no panic")
		}
	}()
	idem.Middleware(c, idem.MiddlewareOptions{Scope: func(*http.Request) string { return "" }, Unscoped: true})
}

// The fingerprint idemsvc receives is conformance/fingerprints.json's,
// which the TypeScript SDK's tests hold it to as well.
func TestMiddlewareFingerprintOnTheWire(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../conformance/fingerprints.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Requests []struct {
			Name, Method, Target, Body, Secret, Fingerprint string
			Headers                                         map[string]string
			CredentialCookies                               []string `json:"credential_cookies"`
		}
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	svc := startIdemsvc(t, nil)
	for i, r := range v.Requests {
		c := newClient(t, svc.URL, idem.WithAPIKey(r.Secret))
		url := serveIdempotent(t, c, idem.MiddlewareOptions{Methods: []string{r.Method}, CredentialCookies: r.CredentialCookies},
			func(w http.ResponseWriter, _ *http.Request) {})
		key := fmt.Sprintf("wire-%d", i)
		req, _ := http.NewRequest(r.Method, url+r.Target, strings.NewReader(r.Body))
		req.Header.Set("Idempotency-Key", key)
		for name, value := range r.Headers {
			req.Header.Set(name, value)
		}
		resp, err := callers.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		st, err := c.Status(testContext(t), key, false)
		if err != nil {
			t.Fatal(err)
		}
		if st.Fingerprint == nil || *st.Fingerprint != r.Fingerprint {
			t.Errorf("%s: idemsvc holds %v, want %s", r.Name, st.Fingerprint, r.Fingerprint)
		}
	}
}
