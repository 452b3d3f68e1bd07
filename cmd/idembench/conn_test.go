// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echo answers a well-formed POST with 202 and "<host><path> <Authorization> <body>".
func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || r.ContentLength != int64(len(body)) {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	io.WriteString(w, r.Host+r.URL.Path+" "+r.Header.Get("Authorization")+" "+string(body))
}

// server serves h and counts the connections it accepted.
func server(t *testing.T, h http.HandlerFunc, tlsToo bool) (*httptest.Server, *atomic.Int32) {
	srv := httptest.NewUnstartedServer(h)
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if tlsToo {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &conns
}

// host is the Host a request to srv carries.
func host(srv *httptest.Server) string {
	return strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")
}

func newConn(t *testing.T, srv *httptest.Server, base string) *conn {
	u, err := url.Parse(srv.URL + base)
	if err != nil {
		t.Fatal(err)
	}
	target := newTarget(u, "k3y", beginPath, completePath)
	if target.tlsConfig != nil {
		target.tlsConfig.RootCAs = srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	}
	c := &conn{target: target}
	t.Cleanup(c.close)
	return c
}

func mustPost(t *testing.T, c *conn, path, body string, wantStatus int, wantReply string) {
	t.Helper()
	var reply bytes.Buffer
	status, err := c.post(t.Context(), path, nil, []byte(body), &reply)
	if err != nil || status != wantStatus || reply.String() != wantReply {
		t.Fatalf("post %s: got %d %q, %v; want %d %q", path, status, reply.String(), err, wantStatus, wantReply)
	}
}

// Requests go over one kept-alive connection, to paths under the URL's
// own path, over TLS for https.
func TestConnKeepsAlive(t *testing.T) {
	for _, tlsToo := range []bool{false, true} {
		srv, conns := server(t, echo, tlsToo)
		c := newConn(t, srv, "/base/")
		for i := range 3 {
			body := strings.Repeat("b", i*5000) // 0, and more than one buffer
			mustPost(t, c, beginPath, body, 202, host(srv)+"/base/v1/begin Bearer k3y "+body)
			mustPost(t, c, completePath, `{}`, 202, host(srv)+"/base/v1/complete Bearer k3y {}")
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("tls %v: %d connections, want 1", tlsToo, n)
		}
	}
}

// Replies of every framing are read whole: chunked, and ended by closing
// the connection, after which the next request dials again.
func TestConnReadsEveryFraming(t *testing.T) {
	srv, conns := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == completePath {
			w.Header().Set("Transfer-Encoding", "identity") // to the close
		}
		io.WriteString(w, "chunk one,")
		w.(http.Flusher).Flush() // no Content-Length
		io.WriteString(w, "chunk two")
	}, false)
	c := newConn(t, srv, "")
	for range 2 {
		mustPost(t, c, beginPath, `{}`, 200, "chunk one,chunk two")
		mustPost(t, c, completePath, `{}`, 200, "chunk one,chunk two")
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (one per reply ended by a close)", n)
	}
}

// A connection the service drops fails its request, which is not sent
// again; the next request works on a new connection.
func TestConnFailsAndRedials(t *testing.T) {
	var calls atomic.Int32
	srv, conns := server(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 2 {
			panic(http.ErrAbortHandler) // drops the connection
		}
		echo(w, r)
	}, false)
	c := newConn(t, srv, "")
	mustPost(t, c, beginPath, "1", 202, host(srv)+"/v1/begin Bearer k3y 1")
	if status, err := c.post(t.Context(), beginPath, nil, []byte("2"), new(bytes.Buffer)); err == nil {
		t.Fatalf("post on a dropped connection: got %d, want an error", status)
	}
	mustPost(t, c, beginPath, "3", 202, host(srv)+"/v1/begin Bearer k3y 3")
	if n, m := calls.Load(), conns.Load(); n != 3 || m != 2 {
		t.Errorf("%d calls on %d connections, want 3 on 2", n, m)
	}
}

// The end of the context interrupts a request that waits for its reply.
func TestConnStopsWithContext(t *testing.T) {
	release := make(chan struct{})
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(10 * time.Second): // the test fails rather than hangs
		}
	}, false)
	defer close(release)
	c := newConn(t, srv, "")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.post(ctx, beginPath, nil, []byte("{}"), new(bytes.Buffer))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want %v", err, context.DeadlineExceeded)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the request ended %v after its context", d)
	}
}

// A connection used under one context, which then ends, serves the next
// context on a new connection, and the end of the first does not disturb
// requests under the second.
func TestConnMovesToAnotherContext(t *testing.T) {
	srv, conns := server(t, echo, false)
	c := newConn(t, srv, "")
	first, cancelFirst := context.WithCancel(t.Context())
	second, cancelSecond := context.WithCancel(t.Context())
	defer cancelSecond()
	var reply bytes.Buffer
	post := func(ctx context.Context, body string) {
		t.Helper()
		if status, err := c.post(ctx, beginPath, nil, []byte(body), &reply); err != nil || status != 202 {
			t.Fatalf("post %s: got %d, %v", body, status, err)
		}
	}
	post(first, "a")
	cancelFirst()
	post(second, "b")
	post(second, "c")
	post(t.Context(), "d") // the second context, still running, lets go of the connection
	cancelSecond()
	post(t.Context(), "e")
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: one dropped when its context ended", n)
	}
}

// Interim replies (1xx) are skipped: each request gets its own final reply.
func TestConnSkipsInterimReplies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		rd := bufio.NewReader(nc)
		for _, reply := range []string{
			"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nfirst",
			"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond",
		} {
			req, err := http.ReadRequest(rd)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(nc, reply)
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	c := &conn{target: newTarget(u, "", beginPath)}
	defer c.close()
	mustPost(t, c, beginPath, "{}", 201, "first")
	mustPost(t, c, beginPath, "{}", 200, "second")
}
