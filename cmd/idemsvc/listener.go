// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"

	"github.com/idemsvc/idemsvc/internal/handlers"
)

// problemListener has the errors net/http writes on a connection itself,
// before any handler runs, answered as problem details like every other
// error: a malformed request line or header (400), headers over the limit
// (431), an unknown transfer coding (400). net/http offers no hook for
// them, so the connection recognises their fixed form as it is written.
//
// Over TLS the connection it wraps is a *tls.Conn, which net/http then no
// longer sees as one: so the connection also does what net/http would do
// with a failed handshake, answering plain HTTP sent to the HTTPS port
// (as a problem detail) and logging the other failures.
type problemListener struct {
	net.Listener
	log *slog.Logger
}

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c, log: l.log}, nil
}

type problemConn struct {
	net.Conn
	log       *slog.Logger
	handshook bool // a TLS handshake's end was seen
}

// Read reads, and when it is a TLS handshake that failed, says so.
func (c *problemConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err == nil || c.handshook {
		return n, err
	}
	tc, ok := c.Conn.(*tls.Conn)
	if !ok {
		return n, err
	}
	c.handshook = true
	if tc.ConnectionState().HandshakeComplete {
		return n, err
	}
	var plain tls.RecordHeaderError
	switch {
	case errors.As(err, &plain) && plain.Conn != nil && looksLikeHTTP(plain.RecordHeader[:]):
		_, _ = plain.Conn.Write(handlers.ConnectionProblem(http.StatusBadRequest, "this port serves HTTPS only: send the request over TLS"))
	case !errors.Is(err, io.EOF):
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		c.log.Warn("TLS handshake failed", "client", host, "error", err.Error())
	}
	return n, err
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

func (c *problemConn) Write(b []byte) (int, error) {
	if status, detail, ok := netHTTPError(b); ok {
		if _, err := c.Conn.Write(handlers.ConnectionProblem(status, detail)); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite lets net/http half-close the connection after a 431, as it
// does on a bare TCP connection.
func (c *problemConn) CloseWrite() error {
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
