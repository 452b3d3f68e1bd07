package main

import (
	"bytes"
	"net"
	"strconv"

	"github.com/idemsvc/idemsvc/internal/handlers"
)

// problemListener has the errors net/http writes on a connection itself,
// before any handler runs, answered as problem details like every other
// error: a malformed request line or header (400), headers over the limit
// (431), an unknown transfer coding (501). net/http offers no hook for
// them, so the connection recognises their fixed form as it is written.
type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return problemConn{c}, nil
}

type problemConn struct{ net.Conn }

// netHTTPErrorHeaders follow the status line of every error net/http
// writes itself, and of nothing else: the answers handlers write have
// their headers in sorted order, Connection before Content-Type.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c problemConn) Write(b []byte) (int, error) {
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
func (c problemConn) CloseWrite() error {
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
