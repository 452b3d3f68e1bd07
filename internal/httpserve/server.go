// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxConnections    = 10000
)

// Config is a server's edge. Zero durations and sizes take the defaults.
type Config struct {
	Addr string
	// TLS serves HTTPS when not nil.
	TLS *tls.Config
	// MaxConnections caps the connections open at once. Past it, the
	// connection idle longest (between requests, or before its first) is
	// closed to make room; when none is idle, the new one is answered 503
	// and closed at once.
	MaxConnections int
	// ReadHeaderTimeout bounds the reading of a request's head,
	// ReadTimeout the reading of the whole request, body included; a
	// negative ReadTimeout leaves it unbounded (for deadlines set per
	// request, with http.ResponseController).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds a request from the end of its head to the end
	// of its answer; zero leaves it unbounded.
	WriteTimeout   time.Duration
	IdleTimeout    time.Duration
	MaxHeaderBytes int
	Log            *slog.Logger
	// Registry receives the edge's metrics, named with MetricPrefix
	// (e.g. "idemsvc"): failed TLS handshakes and connections refused.
	Registry     prometheus.Registerer
	MetricPrefix string
}

// Server is an http.Server on its listener, set up from a Config.
type Server struct {
	srv   *http.Server
	ln    net.Listener
	conns *connSet
}

// Listen opens cfg.Addr and sets up a server of handler on it; Serve
// then serves.
func Listen(cfg Config, handler http.Handler) (*Server, error) {
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	switch {
	case cfg.ReadTimeout < 0:
		cfg.ReadTimeout = 0
	case cfg.ReadTimeout == 0:
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := newEdgeMetrics(cfg.Registry, cfg.MetricPrefix)
	tcp, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	conns := &connSet{conns: make(map[*conn]struct{})}
	capped := &capListener{Listener: tcp, max: int64(cfg.MaxConnections), conns: conns, metrics: m}
	if cfg.TLS == nil {
		// Over TLS a refusal is a close: a plain-text answer would be noise.
		capped.refusal = ConnectionProblem(http.StatusServiceUnavailable, "the server has as many connections open as it allows: retry after Retry-After")
	}
	var ln net.Listener = capped
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
	}
	ln = &edgeListener{Listener: ln, handshakes: newHandshakeLog(cfg.Log, m.handshakeFailures)}
	s := &Server{ln: ln, conns: conns}
	s.srv = &http.Server{
		Handler: markHandling(closeAfterChunked(handler)),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ConnState:         conns.track,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Addr is the address served.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown; it returns http.ErrServerClosed then.
func (s *Server) Serve() error { return s.srv.Serve(s.ln) }

// Shutdown stops taking connections and waits for the requests in flight.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// closeAfterChunked closes the connection after the answer to a request
// with a Transfer-Encoding. net/http drops a Content-Length sent with
// Transfer-Encoding, and RFC 9112 (section 6.3) requires a server to close
// the connection after such a request: it cannot be told apart here, so
// every chunked request's connection is closed, and bytes after its body
// (a smuggled request) are never read as a request.
func closeAfterChunked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			w.Header()["Connection"] = []string{"close"}
		}
		next.ServeHTTP(w, r)
	})
}
