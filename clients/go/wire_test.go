// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawServer answers each request it reads with the next of answers, as
// given, and counts the connections it accepted.
type rawServer struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   int
	answers []string
}

func newRawServer(t *testing.T, answers ...string) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, answers: answers}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

func (s *rawServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		s.mu.Lock()
		if len(s.answers) == 0 {
			s.mu.Unlock()
			return
		}
		answer := s.answers[0]
		s.answers = s.answers[1:]
		s.mu.Unlock()
		if _, err := io.WriteString(c, answer); err != nil || strings.Contains(answer, "Connection: close") {
			return
		}
	}
}

func (s *rawServer) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// TestWireReadsAnswers reads answers of each framing, and reuses the
// connection only when the answer ended where its framing said.
func TestWireReadsAnswers(t *testing.T) {
	const next = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"
	for _, tt := range []struct {
		name, answer string
		status       int
		body         string
		reused       bool
	}{
		{"content-length", "HTTP/1.1 201 Created\r\nContent-Length: 5\r\ncontent-type: application/json\r\n\r\n{\"a\"}", 201, `{"a"}`, true},
		{"chunked, with a trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n", 200, "abcde", true},
		{"interim answers first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "ok", true},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 204, "", true},
		{"connection: close among others", "HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok", 200, "ok", false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "ok", false},
		{"more than its framing said", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", 200, "ok", false},
		{"chunks and a length", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\nok\r\n0\r\n\r\n", 200, "ok", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRawServer(t, tt.answer, next)
			u, _ := url.Parse("http://" + srv.ln.Addr().String())
			w := newWire(u, nil)
			for i, want := range []struct {
				status int
				body   string
			}{{tt.status, tt.body}, {200, "next"}} {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u.String()+"/x", nil)
				resp, err := w.Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != want.status || string(body) != want.body {
					t.Fatalf("request %d: %d %q, want %d %q", i, resp.StatusCode, body, want.status, want.body)
				}
			}
			if conns := srv.connections(); (conns == 1) != tt.reused {
				t.Errorf("%d connections for two requests; reused: want %v", conns, tt.reused)
			}
		})
	}
}

// TestWireRefusesMalformedAnswers: an answer that cannot be framed is an
// error, not a guess.
func TestWireRefusesMalformedAnswers(t *testing.T) {
	for name, answer := range map[string]string{
		"status line":     "HTTP/1.1 2xx OK\r\n\r\n",
		"content-length":  "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
		"two lengths":     "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok",
		"coding":          "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
		"header line":     "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
		"cut short":       "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort",
		"switching proto": "HTTP/1.1 101 Switching Protocols\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			srv := newRawServer(t, answer)
			u, _ := url.Parse("http://" + srv.ln.Addr().String())
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u.String()+"/x", nil)
			if resp, err := newWire(u, nil).Do(req); err == nil {
				t.Fatalf("got %d, want an error", resp.StatusCode)
			}
		})
	}
}

// TestWireRefusesHeaderInjection: a header value with a line end fails
// the request before anything is sent.
func TestWireRefusesHeaderInjection(t *testing.T) {
	srv := newRawServer(t)
	u, _ := url.Parse("http://" + srv.ln.Addr().String())
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u.String()+"/x", nil)
	req.Header.Set("X-A", "1\r\nX-Injected: 1")
	if _, err := newWire(u, nil).Do(req); err == nil {
		t.Fatal("a header with CR LF was sent")
	}
	if _, err := New(u.String(), WithAPIKey("k3y\n")); err == nil {
		t.Fatal("New took an API key with a line end")
	}
	time.Sleep(10 * time.Millisecond)
	if n := srv.connections(); n != 0 {
		t.Fatalf("%d connections made", n)
	}
}

// TestWireDoesNotResendAPost: a POST that failed on a pooled connection is
// not sent again, unless it is a call of the SDK's own (resend).
func TestWireDoesNotResendAPost(t *testing.T) {
	// The first answer says nothing of closing, but the server closes
	// after the second request without answering.
	srv := newRawServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	u, _ := url.Parse("http://" + srv.ln.Addr().String())
	w := newWire(u, nil)
	ctx := context.Background()
	if _, err := w.send(ctx, &request{method: http.MethodGet, uri: "/a", host: u.Host}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.send(ctx, &request{method: http.MethodPost, uri: "/b", host: u.Host, body: []byte("{}")}); err == nil {
		t.Fatal("want the failure of the POST")
	}
	if n := srv.connections(); n != 1 {
		t.Fatalf("%d connections: the POST was sent again", n)
	}
}
