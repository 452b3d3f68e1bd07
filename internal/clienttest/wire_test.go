// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// exchange is one request as idemsvc received it.
type exchange struct {
	Method, URI, Host string
	Header            http.Header
	Body              string
	remote            string // the connection's address at the client
}

// recorded is an idemsvc that keeps every request it receives.
type recorded struct {
	*idemtest.Idemsvc
	mu   sync.Mutex
	seen []exchange
}

func startRecorded(t *testing.T) *recorded {
	r := &recorded{}
	r.Idemsvc = idemtest.Serve(t, handlers.Config{}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			r.mu.Lock()
			r.seen = append(r.seen, exchange{req.Method, req.RequestURI, req.Host, req.Header.Clone(), string(body), req.RemoteAddr})
			r.mu.Unlock()
			next.ServeHTTP(w, req)
		})
	})
	return r
}

func (r *recorded) exchanges() []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// leaseTokens matches the lease tokens in request bodies, which differ
// from one idemsvc to another.
var leaseTokens = regexp.MustCompile(`"lease_token":"[^"]*"`)

// TestDefaultTransportSendsWhatNetHTTPSends makes every call of the SDK,
// batch calls too,
// through the default client (the SDK's own transport) and through an
// http.Client, each against an idemsvc of its own, and compares what the
// two idemsvcs received: the same methods, URIs, headers (but the
// Accept-Encoding that http.Transport adds) and bodies, byte for byte but
// the lease tokens.
func TestDefaultTransportSendsWhatNetHTTPSends(t *testing.T) {
	calls := func(t *testing.T, c *idem.Client) {
		ctx := idem.WithRequestID(testContext(t), "req-7")
		res, err := c.Begin(ctx, idem.BeginParams{Key: "k1", Owner: "o1", Fingerprint: "f", Lease: 5 * time.Second})
		if err != nil || res.Lease == nil {
			t.Fatalf("begin: %+v, %v", res, err)
		}
		token := res.Lease.LeaseToken
		if _, err := c.Extend(ctx, "k1", token, 7*time.Second); err != nil {
			t.Fatalf("extend: %v", err)
		}
		resp := idem.Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: []byte{0, 1, 0xff, 'x'}}
		if _, err := c.Complete(ctx, "k1", token, resp, time.Hour); err != nil {
			t.Fatalf("complete: %v", err)
		}
		if res, err := c.Begin(ctx, idem.BeginParams{Key: "k1", Owner: "o2", Fingerprint: "f"}); err != nil || res.Replay == nil {
			t.Fatalf("replay: %+v, %v", res, err)
		}
		if _, err := c.Status(ctx, "k1", true); err != nil {
			t.Fatalf("status: %v", err)
		}
		for _, err := range c.Keys(ctx, idem.ListParams{State: idem.StateCompleted, PageSize: 10}) {
			if err != nil {
				t.Fatalf("keys: %v", err)
			}
		}
		res, err = c.Begin(ctx, idem.BeginParams{Key: "k2%2F+", Owner: "o3"})
		if err != nil || res.Lease == nil {
			t.Fatalf("begin k2: %+v, %v", res, err)
		}
		if _, err := c.Fail(ctx, "k2%2F+", res.Lease.LeaseToken, idem.FailParams{Terminal: true, Error: "card \"declined\"\n"}); err != nil {
			t.Fatalf("fail: %v", err)
		}
		if err := c.Delete(ctx, "k2%2F+"); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if _, err := c.Status(ctx, "absent", false); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("status of an absent key: %v, want ErrNotFound", err)
		}
		batch, err := c.BeginBatch(ctx, []idem.BeginParams{{Key: "b1", Owner: "o4", Fingerprint: "f", Lease: 5 * time.Second},
			{Key: "k1", Owner: "o5", Fingerprint: "f"}, {Key: "b1", Owner: "o6", Fingerprint: "f"}, {Key: "b2", Owner: "o7"}})
		if err != nil || batch[0].Lease == nil || batch[1].Replay == nil || *batch[1].Replay.Response.StatusCode != 201 ||
			!errors.Is(batch[2].Err, idem.ErrInProgress) || batch[3].Lease == nil {
			t.Fatalf("begin batch: %+v, %v", batch, err)
		}
		fin, err := c.FinishBatch(ctx, []idem.FinishParams{{Key: "b1", Token: batch[0].Lease.LeaseToken, Response: resp, Retention: time.Hour},
			{Key: "b2", Token: batch[3].Lease.LeaseToken, Fail: &idem.FailParams{Terminal: true, Error: "no"}},
			{Key: "b2", Token: batch[0].Lease.LeaseToken}})
		if err != nil || fin[0].Status != idem.FinishedStateCompleted || fin[1].Status != idem.FinishedStateFailed ||
			!errors.Is(fin[2].Err, idem.ErrLeaseLost) {
			t.Fatalf("finish batch: %+v, %v", fin, err)
		}
	}
	own, std := startRecorded(t), startRecorded(t)
	calls(t, newClient(t, own.URL, idem.WithAPIKey("secret")))
	calls(t, newClient(t, std.URL, idem.WithAPIKey("secret"), idem.WithHTTP(&http.Client{})))
	got, want := own.exchanges(), std.exchanges()
	if len(got) != len(want) {
		t.Fatalf("%d requests through the SDK's transport, %d through http.Client", len(got), len(want))
	}
	for i := range want {
		want[i].Header.Del("Accept-Encoding")
		g, w := got[i], want[i]
		g.Body = leaseTokens.ReplaceAllString(g.Body, `"lease_token":"T"`)
		w.Body = leaseTokens.ReplaceAllString(w.Body, `"lease_token":"T"`)
		gh, _ := json.Marshal(g.Header)
		wh, _ := json.Marshal(w.Header)
		g.Host = strings.Replace(g.Host, own.Server.Listener.Addr().String(), "idemsvc", 1)
		w.Host = strings.Replace(w.Host, std.Server.Listener.Addr().String(), "idemsvc", 1)
		if g.Method != w.Method || g.URI != w.URI || g.Host != w.Host || string(gh) != string(wh) || g.Body != w.Body {
			t.Errorf("request %d:\n got %s %s %s %s %s\nwant %s %s %s %s %s", i, g.Method, g.URI, g.Host, gh, g.Body, w.Method, w.URI, w.Host, wh, w.Body)
		}
	}
	if g := got[0].Header.Get("X-Request-Id"); g != "req-7" {
		t.Errorf("X-Request-Id %q, want req-7", g)
	}
	// Every call went on one connection.
	for _, e := range got[1:] {
		if e.remote != got[0].remote {
			t.Fatalf("calls came from %s and %s: want one connection, reused", got[0].remote, e.remote)
		}
	}
}

// TestDefaultTransportSendsAgainOnAClosedConnection closes the pooled
// connection at idemsvc's end between two calls: the second call still
// succeeds, with the SDK's retries off, sent again on a new connection.
func TestDefaultTransportSendsAgainOnAClosedConnection(t *testing.T) {
	svc := startRecorded(t)
	c := newClient(t, svc.URL, idem.WithRetryBudget(0))
	ctx := testContext(t)
	if _, err := c.Begin(ctx, idem.BeginParams{Key: "a"}); err != nil {
		t.Fatal(err)
	}
	svc.Server.CloseClientConnections()
	res, err := c.Begin(ctx, idem.BeginParams{Key: "b"})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin after idemsvc closed the connection: %+v, %v", res, err)
	}
	seen := svc.exchanges()
	if len(seen) != 2 || seen[0].remote == seen[1].remote {
		t.Fatalf("want 2 requests on 2 connections, got %+v", seen)
	}
}

// TestDefaultTransportEndsWithItsContext cancels a begin that idemsvc
// holds (waiting for another attempt): the call ends with the context's
// error, and the next call works, on a connection without the cancelled
// call's deadline.
func TestDefaultTransportEndsWithItsContext(t *testing.T) {
	svc := startRecorded(t)
	c := newClient(t, svc.URL)
	ctx := testContext(t)
	if _, err := c.Begin(ctx, idem.BeginParams{Key: "held", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := c.Begin(short, idem.BeginParams{Key: "held", Wait: 20 * time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled begin: %v, want context.Canceled", err)
	}
	for i := range 3 {
		if _, err := c.Begin(ctx, idem.BeginParams{Key: "next" + string(rune('a'+i))}); err != nil {
			t.Fatalf("begin after a cancelled one: %v", err)
		}
	}
}

// TestRequestIDWithAControlCharacterIsNotSent: a request id that would
// break the request's head is left out, and the call goes through.
func TestRequestIDWithAControlCharacterIsNotSent(t *testing.T) {
	for name, hc := range map[string]idem.HttpRequestDoer{"default": nil, "http.Client": &http.Client{}} {
		t.Run(name, func(t *testing.T) {
			svc := startRecorded(t)
			var opts []idem.Option
			if hc != nil {
				opts = append(opts, idem.WithHTTP(hc))
			}
			c := newClient(t, svc.URL, opts...)
			ctx := idem.WithRequestID(testContext(t), "id\r\nX-Injected: yes")
			if _, err := c.Begin(ctx, idem.BeginParams{Key: "k"}); err != nil {
				t.Fatal(err)
			}
			h := svc.exchanges()[0].Header
			if h.Get("X-Injected") != "" || h.Get("X-Request-Id") != "" {
				t.Fatalf("headers received: %v", h)
			}
		})
	}
}

// TestDefaultTransportWithABaseURLPath calls an idemsvc served under a
// path prefix, as behind a gateway.
func TestDefaultTransportWithABaseURLPath(t *testing.T) {
	svc := startRecorded(t)
	front := http.NewServeMux()
	front.Handle("/idem/", http.StripPrefix("/idem", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.DefaultTransport.RoundTrip(mustRequest(t, r, svc.URL+r.URL.RequestURI()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})))
	gw := httptest.NewServer(front)
	t.Cleanup(gw.Close)
	c := newClient(t, gw.URL+"/idem")
	if _, err := c.Begin(testContext(t), idem.BeginParams{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if uri := svc.exchanges()[0].URI; !strings.HasSuffix(uri, "/v1/begin") {
		t.Fatalf("idemsvc received %s", uri)
	}
}

func mustRequest(t *testing.T, in *http.Request, url string) *http.Request {
	req, err := http.NewRequestWithContext(in.Context(), in.Method, url, in.Body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = in.Header.Clone()
	return req
}

// TestDefaultTransportReadsAnEarlyAnswer completes with a response far over
// idemsvc's request limit: idemsvc answers 413 without reading the body
// and closes the connection, and the call gets that answer, ErrTooLarge,
// rather than a broken connection.
func TestDefaultTransportReadsAnEarlyAnswer(t *testing.T) {
	svc := idemtest.Serve(t, handlers.Config{MaxBodyBytes: 64 << 10})
	c := newClient(t, svc.URL, idem.WithRetryBudget(0))
	ctx := testContext(t)
	res, err := c.Begin(ctx, idem.BeginParams{Key: "big"})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin: %+v, %v", res, err)
	}
	body := bytes.Repeat([]byte("x"), 16<<20) // more than the socket buffers hold
	_, err = c.Complete(ctx, "big", res.Lease.LeaseToken, idem.Response{StatusCode: 200, Body: body}, 0)
	if !errors.Is(err, idem.ErrTooLarge) {
		t.Fatalf("complete of 16 MiB: %v, want ErrTooLarge", err)
	}
	if _, err := c.Complete(ctx, "big", res.Lease.LeaseToken, idem.Response{StatusCode: 200}, 0); err != nil {
		t.Fatalf("complete after: %v", err)
	}
}
