package idem

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
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

	mu   sync.Mutex
	idle []*wireConn // most recently used last
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
// buffered). A call that fails on a pooled connection before any byte of
// an answer arrived is sent once more, on a new connection: idemsvc may
// have closed the pooled one meanwhile, and every call of this SDK may be
// sent twice (a begin carries its owner; complete, fail and extend, their
// lease token).
func (w *wire) Do(req *http.Request) (*http.Response, error) {
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	for {
		c, pooled, err := w.conn(ctx)
		if err != nil {
			return nil, &url.Error{Op: req.Method, URL: req.URL.String(), Err: err}
		}
		resp, err := w.exchange(ctx, c, req, body)
		if err == nil {
			return resp, nil
		}
		c.nc.Close()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		if !pooled || c.read > 0 || ctx.Err() != nil {
			return nil, &url.Error{Op: req.Method, URL: req.URL.String(), Err: err}
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

// conn takes the most recently used idle connection, or dials one.
func (w *wire) conn(ctx context.Context) (c *wireConn, pooled bool, err error) {
	now := time.Now()
	w.mu.Lock()
	for len(w.idle) > 0 {
		c = w.idle[len(w.idle)-1]
		w.idle[len(w.idle)-1] = nil
		w.idle = w.idle[:len(w.idle)-1]
		if now.Sub(c.idleFrom) < wireIdleTimeout {
			w.mu.Unlock()
			return c, true, nil
		}
		c.nc.Close()
	}
	w.mu.Unlock()
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

// release gives c back to the idle pool, or closes it when the pool is full.
func (w *wire) release(c *wireConn) {
	c.idleFrom = time.Now()
	w.mu.Lock()
	if len(w.idle) < wireMaxIdle {
		w.idle = append(w.idle, c)
		c = nil
	}
	w.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// longAgo is a deadline in the past: it interrupts a connection's I/O.
var longAgo = time.Unix(1, 0)

// exchange writes req on c and reads its answer whole. On success c is back
// in the pool, or closed if the answer said so; on error the caller closes
// it.
func (w *wire) exchange(ctx context.Context, c *wireConn, req *http.Request, body []byte) (*http.Response, error) {
	deadline, _ := ctx.Deadline() // none: the zero time
	if err := c.nc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(longAgo) })
	defer stop()
	c.read = 0
	if err := writeRequest(c.bw, req, body); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(c.br, req)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("idemsvc switched protocols")
		}
		resp, err = http.ReadResponse(c.br, req)
	}
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = &bodyReader{data: data}
	if !stop() || resp.Close {
		c.nc.Close() // the context ended meanwhile: its deadline stays on c
	} else {
		w.release(c)
	}
	return resp, nil
}

// writeRequest writes req's head and body as HTTP/1.1. Header names and
// values are checked as http.Transport checks them, so that no value can
// add a header or a request.
func writeRequest(bw *bufio.Writer, req *http.Request, body []byte) error {
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	bw.WriteString(host)
	bw.WriteString("\r\n")
	for name, values := range req.Header {
		if !validHeaderName(name) {
			return fmt.Errorf("invalid header name %q", name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("invalid value of header %q", name)
			}
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if body != nil || req.Method == http.MethodPost {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(body)), 10))
		bw.WriteString("\r\n")
	}
	bw.WriteString("\r\n")
	bw.Write(body)
	return bw.Flush()
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

// WriteTo hands the whole body over in one write (io.ReadAll does not use
// it, but io.Copy does).
func (b *bodyReader) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b.data[b.off:])
	b.off += n
	return int64(n), err
}
