// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// conn is one worker's keep-alive HTTP/1.1 connection to the service.
// Each worker has one request in flight at a time, so it needs none of
// http.Transport's pooling, and going without it saves the goroutine
// hand-offs Transport makes on every request: CPU that, on a machine shared
// with the service, goes to the service being measured. Requests are
// written by hand; replies are read by net/http's parser.
type conn struct {
	target *target
	nc     net.Conn // nil until dialled, and after a failure
	br     *bufio.Reader
	bw     *bufio.Writer
	ctx    context.Context // whose end interrupts nc's I/O
	stop   func() bool     // stops that; nil when nothing watches nc
}

// target is what every conn of a run shares: where to dial, and each
// request's head before its own headers and Content-Length.
type target struct {
	addr      string // host:port
	tlsConfig *tls.Config
	heads     map[string][]byte // by path
}

// dialTimeout bounds connecting to the service.
const dialTimeout = 5 * time.Second

// newTarget prepares requests to paths under u, with apiKey as a bearer
// token unless it is empty.
func newTarget(u *url.URL, apiKey string, paths ...string) *target {
	t := &target{heads: make(map[string][]byte, len(paths))}
	port := u.Port()
	if u.Scheme == "https" {
		t.tlsConfig = &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}}
		if port == "" {
			port = "443"
		}
	} else if port == "" {
		port = "80"
	}
	t.addr = net.JoinHostPort(u.Hostname(), port)
	base := strings.TrimRight(u.EscapedPath(), "/")
	for _, path := range paths {
		head := "POST " + base + path + " HTTP/1.1\r\nHost: " + u.Host +
			"\r\nContent-Type: application/json\r\n"
		if apiKey != "" {
			head += "Authorization: Bearer " + apiKey + "\r\n"
		}
		t.heads[path] = []byte(head)
	}
	return t
}

// post sends body to path, with header (whole header lines, or nil), and
// reads the whole reply into reply. A request that fails is not sent
// again, it counts as failed; its connection is dropped and the next
// request dials a new one.
func (c *conn) post(ctx context.Context, path string, header, body []byte, reply *bytes.Buffer) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, context.Cause(ctx)
	}
	status, err := c.send(ctx, path, header, body, reply)
	if err != nil {
		c.close()
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		return 0, fmt.Errorf("POST %s: %w", path, err)
	}
	return status, nil
}

// send makes the connection ready for ctx and exchanges one request.
func (c *conn) send(ctx context.Context, path string, header, body []byte, reply *bytes.Buffer) (int, error) {
	if c.nc != nil && c.ctx != ctx {
		// Stop watching the other context; if it already ended, it may have
		// interrupted the connection: drop it.
		if c.stop() {
			c.stop = nil
		} else {
			c.close()
		}
	}
	if c.nc == nil {
		if err := c.dial(ctx); err != nil {
			return 0, err
		}
	}
	if c.stop == nil { // the end of ctx interrupts the connection's I/O
		nc := c.nc
		c.ctx, c.stop = ctx, context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	}
	return c.exchange(path, header, body, reply)
}

// exchange writes one request and reads its reply, past any interim (1xx)
// replies.
func (c *conn) exchange(path string, header, body []byte, reply *bytes.Buffer) (int, error) {
	c.bw.Write(c.target.heads[path])
	c.bw.Write(header)
	c.bw.WriteString("Content-Length: ")
	c.bw.Write(strconv.AppendInt(c.bw.AvailableBuffer(), int64(len(body)), 10))
	c.bw.WriteString("\r\n\r\n")
	c.bw.Write(body)
	if err := c.bw.Flush(); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return 0, errors.New("the service switched protocols")
		}
		resp, err = http.ReadResponse(c.br, nil)
	}
	if err != nil {
		return 0, err
	}
	reply.Reset()
	_, err = reply.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("reading the reply: %w", err)
	}
	if resp.Close {
		c.close()
	}
	return resp.StatusCode, nil
}

func (c *conn) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	var nc net.Conn
	var err error
	if c.target.tlsConfig != nil {
		nc, err = (&tls.Dialer{NetDialer: &d, Config: c.target.tlsConfig}).DialContext(ctx, "tcp", c.target.addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", c.target.addr)
	}
	if err != nil {
		return err
	}
	c.nc = nc
	c.br = bufio.NewReader(nc)
	c.bw = bufio.NewWriter(nc)
	return nil
}

// close drops the connection; the next request dials a new one.
func (c *conn) close() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	if c.nc != nil {
		c.nc.Close()
		c.nc, c.ctx = nil, nil
	}
}
