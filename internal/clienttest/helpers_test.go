// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
)

// idemsvc is an idemsvc served in process on a port of its own, over an
// in-memory store, until the test ends.
type idemsvc struct {
	URL string
	// calls counts the requests idemsvc received, by path.
	calls *pathCounter

	mu      sync.Mutex
	headers []http.Header // of every request received
}

// startIdemsvc starts an idemsvc authenticating with keyring; nil turns
// authentication off (every call acts for tenant "default").
func startIdemsvc(t testing.TB, keyring *auth.Keyring) *idemsvc {
	t.Helper()
	s := &idemsvc{calls: &pathCounter{}}
	s.URL = idemtest.Serve(t, handlers.Config{Keyring: keyring}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.calls.add(r.URL.Path)
			s.mu.Lock()
			s.headers = append(s.headers, r.Header.Clone())
			s.mu.Unlock()
			next.ServeHTTP(w, r)
		})
	}).URL
	return s
}

// received returns the headers of every request idemsvc received so far.
func (s *idemsvc) received() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.headers...)
}

// newClient is a client of url; it fails the test when New does.
func newClient(t testing.TB, url string, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.New(url, opts...)
	if err != nil {
		t.Fatalf("idem.New: %v", err)
	}
	return c
}

// testContext bounds a test's calls, so that a hang fails the test instead
// of stalling the package.
func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pathCounter counts requests by URL path.
type pathCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *pathCounter) add(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[path]++
}

func (c *pathCounter) get(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

// waitFor polls cond until it holds, failing the test after a few seconds.
// Call it from the test's goroutine only.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	idemtest.Eventually(t, 5*time.Second, what, cond)
}

// recv receives from ch, failing the test after a few seconds.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// errReplyLost is what lossyTransport returns instead of a reply it drops.
var errReplyLost = errors.New("test: reply lost on the way back")

// lossyTransport loses replies on the network: for a path in drop, the
// request reaches idemsvc and takes effect, but the caller gets an error
// instead of the reply. drop[path] is how many replies of path to lose; a
// negative count loses every one. For a path in refuse, the request does
// not even leave.
type lossyTransport struct {
	base   http.RoundTripper
	mu     sync.Mutex
	drop   map[string]int
	refuse map[string]bool
	sent   pathCounter // requests that reached idemsvc, by path
}

func (l *lossyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	path := req.URL.Path
	l.mu.Lock()
	refuse := l.refuse[path]
	l.mu.Unlock()
	if refuse {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, errors.New("test: connection refused")
	}
	resp, err := l.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	l.sent.add(path)
	l.mu.Lock()
	left, lose := l.drop[path]
	if lose && left > 0 {
		l.drop[path] = left - 1
	}
	l.mu.Unlock()
	if lose && left != 0 {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errReplyLost
	}
	return resp, nil
}

// lossyClient is a client of url whose calls go through a lossyTransport.
func lossyClient(t testing.TB, url string, opts ...idem.Option) (*idem.Client, *lossyTransport) {
	t.Helper()
	lt := &lossyTransport{base: http.DefaultTransport, drop: map[string]int{}, refuse: map[string]bool{}}
	opts = append([]idem.Option{idem.WithHTTP(&http.Client{Transport: lt})}, opts...)
	return newClient(t, url, opts...), lt
}

// constant is an fn for Do that counts its runs and returns resp.
func constant(runs *atomic.Int32, resp idem.Response) func(context.Context) (idem.Response, error) {
	return func(context.Context) (idem.Response, error) {
		runs.Add(1)
		return resp, nil
	}
}

func ptr[T any](v T) *T { return &v }
