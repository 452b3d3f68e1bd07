// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// wire is the default client's transport: HTTP/1.1 keep-alive connections
// to one idemsvc, each call made on the caller's goroutine, on a
// connection taken from an idle pool (or dialled) and given back when the
// answer has been read.
//
// It exists for its cost. http.Transport hands every request to two
// goroutines of its connection (a writer and a reader) and back through
// channels; under load those hand-offs cost the calling service more CPU
// than the request itself (make load-sdk measures both, side by side).
// idemsvc's calls need none of what that buys: one host, no proxy (New
// keeps http.Transport when the environment names one), no redirects, no
// HTTP/2, no compression, and a caller that waits for each answer.
//
// Requests are still built, and answers parsed, by the generated client;
// wire only carries them, and wire_test.go checks that idemsvc receives
// the same requests through it as through http.Transport.
type wire struct {
	addr      string      // host:port to dial
	tlsConfig *tls.Config // nil for http
	dialer    net.Dialer

	mu      sync.Mutex
	idle    []*wireConn // most recently used last
	sweeper *time.Timer // while idle is not empty
}

// Bounds of the idle pool: enough connections for a busy service's calls in
// flight to reuse theirs rather than leave sockets in TIME_WAIT, none kept
// so long that idemsvc (idle timeout 2 min) may have closed it.
const (
	wireMaxIdle     = 128
	wireIdleTimeout = 90 * time.Second
)

// newWire returns a transport to the host of base, an http or https URL.
func newWire(base *url.URL, tlsConfig *tls.Config) *wire {
	w := &wire{dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
	port := base.Port()
	if base.Scheme == "https" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if tlsConfig != nil {
			cfg = tlsConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = base.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		w.tlsConfig = cfg
		if port == "" {
			port = "443"
		}
	} else if port == "" {
		port = "80"
	}
	w.addr = net.JoinHostPort(base.Hostname(), port)
	return w
}

// wireConn is one connection, used by one call at a time.
type wireConn struct {
	nc       net.Conn
	br       *bufio.Reader // reads through the wireConn, counting
	bw       *bufio.Writer
	read     int64     // bytes read since the current request was written
	idleFrom time.Time // when it went back to the pool
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.nc.Read(p)
	c.read += int64(n)
	return n, err
}

// Do sends req and returns its answer, whose body is already read (and
// buffered). A GET, HEAD or DELETE that fails on a pooled connection
// before any byte of an answer arrived is sent once more, on a new
// connection, as idemsvc may have closed the pooled one meanwhile;
// another method is not, as http.Transport would not (the generated
// client's calls through Client.API carry no owner).
func (w *wire) Do(req *http.Request) (*http.Response, error) {
	if err := checkHeader(req.Header); err != nil {
		return nil, err
	}
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	resend := req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodDelete
	return w.send(req.Context(), &request{method: req.Method, uri: req.URL.RequestURI(), host: host,
		header: req.Header, body: body, resend: resend})
}

// request is what wire sends: the method and URI, and either a Host and
// header to write, or head, the header lines (the Host's among them)
// written ready, with the request id, if any, apart.
type request struct {
	method, uri string
	host        string
	header      http.Header
	head        []byte
	requestID   string
	body        []byte
	// resend allows a second sending after a pooled connection failed
	// before any answer came: the request is safe to send twice (every
	// call of the fast path is: a begin carries its owner; complete, fail
	// and extend their lease token).
	resend bool
}

// send makes the exchange of req, once more on a new connection if a
// pooled one failed before any answer came and req.resend allows it.
func (w *wire) send(ctx context.Context, req *request) (*http.Response, error) {
	for try := 0; ; try++ {
		if ctx.Err() != nil {
			return nil, &url.Error{Op: req.method, URL: req.uri, Err: context.Cause(ctx)}
		}
		c, pooled, err := w.conn(ctx, try == 0)
		if err != nil {
			return nil, &url.Error{Op: req.method, URL: req.uri, Err: err}
		}
		resp, err := w.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		c.nc.Close()
		timedOut := errors.Is(err, os.ErrDeadlineExceeded)
		if ctx.Err() != nil || timedOut {
			// The connection's deadline is the context's: a read that
			// timed out may beat the context's own timer by a little.
			if cause := context.Cause(ctx); cause != nil {
				err = cause
			} else {
				err = context.DeadlineExceeded
			}
		}
		if !req.resend || try > 0 || !pooled || c.read > 0 || timedOut || ctx.Err() != nil {
			return nil, &url.Error{Op: req.method, URL: req.uri, Err: err}
		}
	}
}

// requestBody reads the body of req, kept for a second sending.
func requestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

// conn takes the most recently used idle connection, if pooled is allowed,
// or dials one.
func (w *wire) conn(ctx context.Context, pooled bool) (c *wireConn, reused bool, err error) {
	if pooled {
		var stale *wireConn
		w.mu.Lock()
		if n := len(w.idle); n > 0 {
			c = w.idle[n-1]
			w.idle[n-1] = nil
			w.idle = w.idle[:n-1]
			if time.Since(c.idleFrom) >= wireIdleTimeout { // the sweeper is late
				stale, c = c, nil
			}
		}
		w.mu.Unlock()
		if stale != nil {
			stale.nc.Close()
		}
		if c != nil {
			return c, true, nil
		}
	}
	var nc net.Conn
	if w.tlsConfig != nil {
		nc, err = (&tls.Dialer{NetDialer: &w.dialer, Config: w.tlsConfig}).DialContext(ctx, "tcp", w.addr)
	} else {
		nc, err = w.dialer.DialContext(ctx, "tcp", w.addr)
	}
	if err != nil {
		return nil, false, err
	}
	c = &wireConn{nc: nc, bw: bufio.NewWriter(nc)}
	c.br = bufio.NewReader(c)
	return c, false, nil
}

// release gives c back to the idle pool, or closes it when the pool is
// full. The sweeper closes connections idle for wireIdleTimeout.
func (w *wire) release(c *wireConn) {
	c.idleFrom = time.Now()
	w.mu.Lock()
	if len(w.idle) < wireMaxIdle {
		w.idle = append(w.idle, c)
		c = nil
		if w.sweeper == nil {
			w.sweeper = time.AfterFunc(wireIdleTimeout, w.sweep)
		}
	}
	w.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// sweep closes the connections idle for wireIdleTimeout or more (the
// oldest are first in the pool), and runs again while any are left.
func (w *wire) sweep() {
	cutoff := time.Now().Add(-wireIdleTimeout)
	w.mu.Lock()
	n := 0
	for n < len(w.idle) && !w.idle[n].idleFrom.After(cutoff) {
		n++
	}
	stale := slices.Clone(w.idle[:n])
	w.idle = slices.Delete(w.idle, 0, n)
	if len(w.idle) > 0 {
		w.sweeper.Reset(w.idle[0].idleFrom.Sub(cutoff))
	} else {
		w.sweeper = nil
	}
	w.mu.Unlock()
	for _, c := range stale {
		c.nc.Close()
	}
}

// longAgo is a deadline in the past: it interrupts a connection's I/O.
var longAgo = time.Unix(1, 0)

// exchange writes req on c and reads its answer whole. On success c is back
// in the pool, or closed if the answer said so; on error the caller closes
// it.
func (w *wire) exchange(ctx context.Context, c *wireConn, req *request) (*http.Response, error) {
	deadline, _ := ctx.Deadline() // none: the zero time
	if err := c.nc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(longAgo) })
	defer stop()
	c.read = 0
	var resp *http.Response
	var err error
	if len(req.body) <= bigBody {
		if err = writeRequest(c.bw, req); err == nil {
			resp, err = readAnswer(c.br, req.method)
		}
	} else {
		resp, err = w.exchangeBig(c, req)
	}
	if err != nil {
		return nil, err
	}
	// Reuse c only when the answer ended where its framing said, and the
	// context did not interrupt c meanwhile.
	if !stop() || resp.Close || c.br.Buffered() > 0 {
		c.nc.Close()
	} else {
		w.release(c)
	}
	return resp, nil
}

// bigBody is the size past which a request's body is written while its
// answer is read, as http.Transport does: idemsvc answers a body over its
// limit (413) without reading it, and closes the connection, which stops
// the writing.
const bigBody = 64 << 10

// exchangeBig writes req on a goroutine of its own while it reads the
// answer. An answer that comes before the body is written whole ends the
// writing and the connection.
func (w *wire) exchangeBig(c *wireConn, req *request) (*http.Response, error) {
	written := make(chan error, 1)
	go func() { written <- writeRequest(c.bw, req) }()
	resp, err := readAnswer(c.br, req.method)
	select {
	case werr := <-written:
		if err == nil && werr != nil {
			resp.Close = true
		}
	default:
		c.nc.Close() // answered early: stop the writing
		<-written
		if err == nil {
			resp.Close = true
		}
	}
	return resp, err
}

// writeRequest writes req's head and body as HTTP/1.1; its header was
// checked (checkHeader), and its request id is sent only when valid.
func writeRequest(bw *bufio.Writer, req *request) error {
	bw.WriteString(req.method)
	bw.WriteByte(' ')
	bw.WriteString(req.uri)
	bw.WriteString(" HTTP/1.1\r\n")
	if req.head != nil {
		bw.Write(req.head)
	} else {
		bw.WriteString("Host: ")
		bw.WriteString(req.host)
		bw.WriteString("\r\n")
	}
	if req.requestID != "" && validHeaderValue(req.requestID) {
		bw.WriteString("X-Request-Id: ")
		bw.WriteString(req.requestID)
		bw.WriteString("\r\n")
	}
	for name, values := range req.header {
		if framingHeader(name) {
			continue
		}
		for _, v := range values {
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if req.body != nil || req.method == http.MethodPost {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(req.body)), 10))
		bw.WriteString("\r\n")
	}
	bw.WriteString("\r\n")
	bw.Write(req.body)
	return bw.Flush()
}

// checkHeader checks names and values as http.Transport checks them, so
// that no value can add a header or a request.
func checkHeader(h http.Header) error {
	for name, values := range h {
		if !validHeaderName(name) {
			return fmt.Errorf("invalid header name %q", name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("invalid value of header %q", name)
			}
		}
	}
	return nil
}

// framingHeader reports whether the transport writes the header name
// itself (Host, Content-Length) or does not do what it asks (chunks, a
// connection's end), as http.Transport leaves them out too.
func framingHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Trailer", "Te", "Upgrade", "Keep-Alive":
		return true
	}
	return false
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || c == ':' || c == '"' || c == '(' || c == ')' || c == ',' ||
			c == '/' || c == ';' || c == '<' || c == '=' || c == '>' || c == '?' || c == '@' ||
			c == '[' || c == '\\' || c == ']' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v has no control character but tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// bodyReader is an answer's body, read whole already.
type bodyReader struct {
	data []byte
	off  int
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.off == len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	return n, nil
}

func (b *bodyReader) Close() error { return nil }

// maxHeadBytes bounds an answer's status line and header lines, as
// http.Transport's default does.
const maxHeadBytes = 1 << 20

// readAnswer reads one answer, past any interim (1xx) ones, whole: its
// body is read to the end (by Content-Length, chunks, or the connection's
// close), so that the connection can carry the next request. It reads
// only what idemsvc's answers need, which is cheaper than
// http.ReadResponse: the status, the header (with names made canonical),
// and the body.
func readAnswer(br *bufio.Reader, method string) (*http.Response, error) {
	for {
		resp, err := readHead(br)
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("idemsvc switched protocols")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			continue
		}
		data, err := readBody(br, resp, method)
		if err != nil {
			return nil, err
		}
		resp.ContentLength = int64(len(data))
		resp.Body = &bodyReader{data: data}
		return resp, nil
	}
}

// readLine reads one line of an answer's head, without its end, counting
// its bytes into read; it stays valid until the next read of br.
func readLine(br *bufio.Reader, read *int) ([]byte, error) {
	b, err := br.ReadSlice('\n')
	*read += len(b)
	if err == bufio.ErrBufferFull || *read > maxHeadBytes {
		return nil, errors.New("an answer's header is too long")
	}
	if err != nil {
		return nil, err
	}
	return bytes.TrimRight(b, "\r\n"), nil
}

// readHead reads a status line and header lines.
func readHead(br *bufio.Reader) (*http.Response, error) {
	read := 0
	status, err := readLine(br, &read)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1 201 Created
	if len(status) < 12 || !bytes.HasPrefix(status, []byte("HTTP/1.")) || status[8] != ' ' ||
		(len(status) > 12 && status[12] != ' ') {
		return nil, fmt.Errorf("malformed status line %q", status)
	}
	code, err := strconv.Atoi(string(status[9:12]))
	if err != nil || code < 100 {
		return nil, fmt.Errorf("malformed status line %q", status)
	}
	resp := &http.Response{StatusCode: code, Status: string(status[9:]), Proto: string(status[:8]),
		ProtoMajor: 1, ProtoMinor: int(status[7] - '0'), Header: make(http.Header, 4)}
	for {
		b, err := readLine(br, &read)
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			break
		}
		name, value, ok := bytes.Cut(b, []byte(":"))
		if !ok || !validHeaderName(string(name)) {
			return nil, fmt.Errorf("malformed header line %q", b)
		}
		key := canonicalHeader(name)
		resp.Header[key] = append(resp.Header[key], string(bytes.TrimSpace(value)))
	}
	closes, keepAlive := false, false
	for _, v := range resp.Header["Connection"] {
		for token := range strings.SplitSeq(v, ",") {
			switch strings.ToLower(strings.TrimSpace(token)) {
			case "close":
				closes = true
			case "keep-alive":
				keepAlive = true
			}
		}
	}
	resp.Close = closes || (resp.ProtoMinor == 0 && !keepAlive)
	return resp, nil
}

// knownHeaders are the names idemsvc answers with, made canonical without
// an allocation.
var knownHeaders = []string{"Content-Type", "Content-Length", "Date", "Retry-After", "Connection",
	"Transfer-Encoding", "X-Request-Id", "Cache-Control"}

func canonicalHeader(name []byte) string {
	for _, k := range knownHeaders {
		if len(k) == len(name) && bytes.EqualFold(name, []byte(k)) {
			return k
		}
	}
	return http.CanonicalHeaderKey(string(name))
}

// readBody reads an answer's body whole.
func readBody(br *bufio.Reader, resp *http.Response, method string) ([]byte, error) {
	if method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return nil, nil
	}
	if te := resp.Header["Transfer-Encoding"]; len(te) > 0 {
		if len(te) != 1 || !strings.EqualFold(te[0], "chunked") {
			return nil, fmt.Errorf("unsupported Transfer-Encoding %q", te)
		}
		if resp.ProtoMinor == 0 || resp.Header["Content-Length"] != nil {
			// Framing that RFC 9112 (section 6.1) calls faulty: read the
			// chunks, and use the connection for nothing more.
			resp.Close = true
			resp.Header.Del("Content-Length")
		}
		data, err := io.ReadAll(httputil.NewChunkedReader(br))
		if err != nil {
			return nil, err
		}
		for { // the trailer, up to an empty line
			b, err := br.ReadSlice('\n')
			if err != nil {
				return nil, err
			}
			if len(bytes.TrimRight(b, "\r\n")) == 0 {
				return data, nil
			}
		}
	}
	if cl := resp.Header["Content-Length"]; len(cl) > 0 {
		u, err := strconv.ParseUint(cl[0], 10, 63)
		n := int64(u)
		if err != nil || len(cl) > 1 && slices.ContainsFunc(cl[1:], func(v string) bool { return v != cl[0] }) {
			return nil, fmt.Errorf("malformed Content-Length %q", cl)
		}
		if n > 1<<20 { // read as it comes rather than trust a size
			data, err := io.ReadAll(io.LimitReader(br, n))
			if err == nil && int64(len(data)) < n {
				err = io.ErrUnexpectedEOF
			}
			return data, err
		}
		data := make([]byte, n)
		_, err = io.ReadFull(br, data)
		return data, err
	}
	resp.Close = true // the body runs to the connection's close
	return io.ReadAll(br)
}
