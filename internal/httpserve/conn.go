// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// capListener caps the connections open at once (see
// Config.MaxConnections). It accepts every connection the kernel has, so
// that none waits unanswered in the backlog: past the cap it makes room
// by closing the connection idle longest, or else refuses the new one.
// (x/net's netutil.LimitListener, used before, holds Accept back instead,
// which leaves new callers hanging while idle connections hold the cap;
// it knows nothing of idleness, which only net/http's ConnState tells.)
type capListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	conns   *connSet
	metrics *edgeMetrics
	refusal []byte // written to a refused connection; nil to close it only
	// refusing counts the refused connections lingering for their answer.
	refusing atomic.Int32
}

// maxRefusing caps the refused connections given their answer at once:
// past it, under a flood of connections, a refused one is closed at once.
const maxRefusing = 64

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max || l.conns.closeIdlest() {
			return &countedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.metrics.refused.Inc()
		if l.refusing.Add(1) > maxRefusing {
			l.refusing.Add(-1)
			_ = c.Close()
			continue
		}
		go l.refuse(c)
	}
}

// refuseLinger is how long a refused connection is given to take its
// answer before it is closed.
const refuseLinger = time.Second

// refuse answers a connection over the cap and closes it. What the client
// sent is read and dropped first, for a moment, so that the close does
// not reset the connection before the client has read the answer.
func (l *capListener) refuse(c net.Conn) {
	defer l.refusing.Add(-1)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	if l.refusal == nil {
		return
	}
	if _, err := c.Write(l.refusal); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.CopyN(io.Discard, c, 64<<10)
}

// countedConn gives its place under the cap back when closed.
type countedConn struct {
	net.Conn
	l      *capListener
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// CloseWrite lets net/http half-close the connection after a 431.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// connSet knows every connection served and which are idle, through
// http.Server's ConnState.
type connSet struct {
	mu    sync.Mutex
	conns map[*conn]struct{}
	// seq orders the moments connections became idle.
	seq atomic.Int64
}

// track is the server's ConnState hook. A connection is idle from its
// accept until its first request, and between requests; a request's
// first byte makes it active (conn.Read: net/http reports StateActive
// only once the request's head is read). Per request it costs a few
// atomic stores.
func (s *connSet) track(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew:
		c.idleSince.Store(s.seq.Add(1))
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
	case http.StateIdle:
		c.handling.Store(false)
		c.idleSince.Store(s.seq.Add(1))
	case http.StateActive:
		c.idleSince.Store(0)
	case http.StateHijacked, http.StateClosed:
		c.idleSince.Store(0)
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}
}

// closeIdlest closes the connection idle longest, if any is idle, and
// reports whether it did.
func (s *connSet) closeIdlest() bool {
	for {
		var idlest *conn
		var since int64
		s.mu.Lock()
		for c := range s.conns {
			if v := c.idleSince.Load(); v > 0 && (idlest == nil || v < since) {
				idlest, since = c, v
			}
		}
		s.mu.Unlock()
		if idlest == nil {
			return false
		}
		// Unless it became active meanwhile.
		if idlest.idleSince.CompareAndSwap(since, 0) {
			_ = idlest.Close()
			return true
		}
	}
}

// edgeListener gives each connection the problem answers and the
// handshake logging of conn.
type edgeListener struct {
	net.Listener
	handshakes *handshakeLog
}

func (l *edgeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, l: l}, nil
}

// conn has the errors net/http writes on a connection itself, before any
// handler runs, answered as problem details like every other error: a
// malformed request line or header (400), headers over the limit (431),
// an unknown transfer coding (501, answered 400). net/http offers no hook
// for them, so the connection recognises their fixed form as it is
// written, but only while no handler has run for the request: what is
// written from a handler's start until the connection is idle again is
// the handler's answer (an upstream's body, a stored one), passed on
// byte for byte whatever it holds.
//
// Over TLS the connection it wraps is a *tls.Conn, which net/http then no
// longer sees as one: so the connection also does what net/http would do
// with a failed handshake, answering plain HTTP sent to the HTTPS port
// (as a problem detail) and logging the other failures.
type conn struct {
	net.Conn
	l         *edgeListener
	handshook bool // a TLS handshake's end was seen
	// idleSince orders the moments it became idle; 0 while a request is
	// being served (see connSet).
	idleSince atomic.Int64
	// handling is set when a handler starts on the connection, and
	// cleared when it is idle again (see markHandling).
	handling atomic.Bool
	// readDeadline is the read deadline net/http last set, in Unix
	// nanoseconds (0 for none), which a paced body read restores.
	readDeadline atomic.Int64
}

// connKey is the context key of a request's *conn.
type connKey struct{}

// markHandling tells the request's connection that a handler runs: from
// now on what is written on it is the handler's answer.
func markHandling(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(*conn); ok {
			c.handling.Store(true)
		}
		next.ServeHTTP(w, r)
	})
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(unixNano(t))
	return c.Conn.SetReadDeadline(t)
}

func (c *conn) SetDeadline(t time.Time) error {
	c.readDeadline.Store(unixNano(t))
	return c.Conn.SetDeadline(t)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Read reads, marks the connection active when a request's first bytes
// come, and when it is a TLS handshake that failed, says so.
//
// Its frame is kept small, the handshake's failure in a function of its
// own: net/http reads each connection, between a request's body and its
// answer, in a goroutine of its own started with the smallest stack, and
// the failure's locals (a tls.ConnectionState, 568 bytes of frame in all)
// made that goroutine grow and copy its stack on every request, about
// 16,000 instructions.
func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.idleSince.Load() != 0 {
		c.idleSince.Store(0)
	}
	if err == nil || c.handshook {
		return n, err
	}
	return n, c.readFailed(err)
}

// readFailed says, once per connection, when err is a TLS handshake that
// failed, and returns err.
//
//go:noinline
func (c *conn) readFailed(err error) error {
	tc, ok := c.Conn.(*tls.Conn)
	if !ok {
		return err
	}
	c.handshook = true
	if tc.ConnectionState().HandshakeComplete {
		return err
	}
	var plain tls.RecordHeaderError
	switch {
	case errors.As(err, &plain) && plain.Conn != nil && looksLikeHTTP(plain.RecordHeader[:]):
		_, _ = plain.Conn.Write(ConnectionProblem(http.StatusBadRequest, "this port serves HTTPS only: send the request over TLS"))
	case !errors.Is(err, io.EOF):
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		c.l.handshakes.failed(host, err)
	}
	return err
}

// looksLikeHTTP reports whether the first bytes of a connection are an
// HTTP request line, as net/http tells plain HTTP on a TLS port.
func looksLikeHTTP(head []byte) bool {
	for _, method := range []string{"GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH"} {
		if string(head) == method {
			return true
		}
	}
	return false
}

// netHTTPErrorHeaders follow the status line of every error net/http
// writes itself, and of nothing else: the answers handlers write have
// their headers in sorted order, Connection before Content-Type.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *conn) Write(b []byte) (int, error) {
	if c.handling.Load() {
		return c.Conn.Write(b)
	}
	if status, detail, ok := netHTTPError(b); ok {
		if _, err := c.Conn.Write(ConnectionProblem(status, detail)); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite lets net/http half-close the connection after a 431, as it
// does on a bare TCP connection.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// netHTTPError recognises one of net/http's own error answers, written in
// one piece: "HTTP/1.1 431 Request Header Fields Too Large", its headers,
// and a plain-text body, which becomes the detail.
func netHTTPError(b []byte) (status int, detail string, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(b) < len(prefix)+3 || !bytes.HasPrefix(b, []byte(prefix)) || (b[len(prefix)] != '4' && b[len(prefix)] != '5') {
		return 0, "", false
	}
	line, rest, found := bytes.Cut(b, []byte("\r\n"))
	if !found || !bytes.HasPrefix(rest, []byte(netHTTPErrorHeaders[2:])) {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(line[len(prefix) : len(prefix)+3]))
	if err != nil {
		return 0, "", false
	}
	body := string(rest[len(netHTTPErrorHeaders)-2:])
	// "400 Bad Request: missing required Host header" says it all after
	// the code; "Unsupported transfer encoding" is the whole text.
	if len(body) > 4 && body[:3] == string(line[len(prefix):len(prefix)+3]) {
		body = body[4:]
	}
	return status, body, true
}
