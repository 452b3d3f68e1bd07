// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/httpserve"
)

// proxy is idemproxy's request path: idem.Middleware in front of a
// reverse proxy to the upstream, with metrics around both.
type proxy struct {
	cfg      config
	log      *slog.Logger
	forward  http.Handler // the middleware and the reverse proxy
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	upstream prometheus.Histogram
	upErrors prometheus.Counter
	bodies   *httpserve.Budget // keyed request bodies held at once
}

// Outcomes of a request, as idemproxy_requests_total labels them.
const (
	outcomePassed   = "passed"   // forwarded without idempotency: no key, or another method
	outcomeExecuted = "executed" // forwarded under a key idemproxy acquired
	outcomeReplayed = "replayed" // answered with the stored answer of an earlier request
	outcomeRefused  = "refused"  // answered by idemproxy: bad key, in flight, mismatch, idemsvc down
)

func newProxy(cfg config, log *slog.Logger) (*proxy, error) {
	opts := []idem.Option{idem.WithAPIKey(cfg.apiKey)}
	if cfg.caFile != "" || cfg.certFile != "" {
		opts = append(opts, idem.WithTLSFiles(cfg.caFile, cfg.certFile, cfg.keyFile))
	}
	client, err := idem.New(cfg.idemsvcURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("IDEMSVC_URL: %w", err)
	}
	p := &proxy{cfg: cfg, log: log, registry: prometheus.NewRegistry()}
	p.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_requests_total",
		Help: "Requests answered, by outcome (passed, executed, replayed, refused) and status code.",
	}, []string{"outcome", "status"}) // "status", as idemsvc_http_requests_total names it
	p.upstream = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "idemproxy_upstream_duration_seconds",
		Help:    "Time from forwarding a request to the upstream's answer, its body included.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	p.upErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemproxy_upstream_errors_total",
		Help: "Requests the upstream did not answer (refused, reset, timed out): 502 to the caller, and the key released.",
	})
	p.bodies = httpserve.NewBudget(cfg.maxBodyBytesInFlight, 2, false, p.registry, "idemproxy") // idemproxy's copy and the middleware's
	p.registry.MustRegister(p.requests, p.upstream, p.upErrors,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))

	transport := http.DefaultTransport.(*http.Transport).Clone()
	// A proxy keeps a connection per request in flight, not 2 per host.
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 512, 256
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(cfg.upstream)
			r.Out.Host = r.In.Host
			forwardedFor(r)
			unreplayable(r.Out)
		},
		Transport:    transport,
		ErrorHandler: p.upstreamError,
	}
	p.forward = p.oneScope(p.budgeted(idem.Middleware(client, cfg.middleware)(p.timed(rp))))
	return p, nil
}

// handler serves the proxy, and /healthz and /metrics unless they have a
// listener of their own.
func (p *proxy) handler() http.Handler {
	counted := p.counted(p.forward)
	if p.cfg.adminListen != "" {
		return counted
	}
	admin := p.admin()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ownPath(r) && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			admin.ServeHTTP(w, r)
			return
		}
		counted.ServeHTTP(w, r)
	})
}

// ownPath reports whether a request is for idemproxy's own /healthz or
// /metrics, spelt exactly so: any other spelling of those paths
// (/%6detrics, say) is the upstream's and goes to it untouched, so that
// idemproxy answers nothing the upstream could be asked for.
func ownPath(r *http.Request) bool {
	return r.URL.RawPath == "" && (r.URL.Path == "/healthz" || r.URL.Path == "/metrics")
}

// oneScope refuses with 400 a keyed request (of a handled method, with the
// key header) that carries the scope header more than once: a gateway that
// appends its header rather than replacing the caller's would otherwise let
// the caller's own value name the scope, and read another user's records.
func (p *proxy) oneScope(next http.Handler) http.Handler {
	if p.cfg.scopeHeader == "" {
		return next
	}
	opts := p.cfg.middleware
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values(p.cfg.scopeHeader)) > 1 && slices.Contains(opts.Methods, r.Method) && len(r.Header.Values(opts.KeyHeader)) > 0 {
			idem.WriteProblem(w, http.StatusBadRequest, "invalid-request", "the "+p.cfg.scopeHeader+" header must appear once", 0)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// budgeted reads the body of a keyed request (of a handled method, with
// the key header) under the budget of bodies in flight, before the
// middleware copies it for the fingerprint: the body counts twice, for
// the two copies. Past the budget the request waits briefly, then gets
// 503 with Retry-After, and the upstream does not see it. Other requests
// stream their bodies to the upstream and hold none.
//
// A keyed request also gets its own read and write deadlines: the read
// timeout for its body, and for its answer the read timeout, the wait
// for a duplicate, the upstream timeout and writeMargin. Requests passed
// through have none but the server's header and idle timeouts, so that
// slow uploads, long downloads and event streams pass untouched.
//
// The answer of a keyed request is counted in the same budget as it is
// written (see answerHold): the upstream's, as the middleware records it,
// and a replay, as it is written to the caller.
func (p *proxy) budgeted(next http.Handler) http.Handler {
	opts := p.cfg.middleware
	writeLimit := p.cfg.readTimeout + opts.Wait + p.cfg.upstreamTimeout + writeMargin
	storedBodyBytes := int64(opts.MaxStoredBodyBytes)
	if storedBodyBytes <= 0 {
		storedBodyBytes = 1 << 20 // the middleware's default
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(opts.Methods, r.Method) || len(r.Header.Values(opts.KeyHeader)) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		now := time.Now()
		_ = rc.SetReadDeadline(now.Add(p.cfg.readTimeout))
		_ = rc.SetWriteDeadline(now.Add(writeLimit))
		defer func() {
			// The answer's last bytes go out under the deadline; then the
			// connection's next request, perhaps passed through, has none.
			_ = rc.Flush()
			_ = rc.SetWriteDeadline(time.Time{})
		}()
		hold := &answerHold{budget: p.bodies, left: storedBodyBytes}
		defer hold.release()
		w = &answerWriter{ResponseWriter: w, hold: hold}
		r = r.WithContext(context.WithValue(r.Context(), answerHoldKey{}, hold))
		if r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > opts.MaxBodyBytes {
			idem.WriteProblem(w, http.StatusRequestEntityTooLarge, "too-large", "the request body is too large to be made idempotent", 0)
			return
		}
		body, taken, err := p.bodies.ReadBody(r.Context(), http.MaxBytesReader(w, r.Body, opts.MaxBodyBytes), r.ContentLength, opts.MaxBodyBytes, httpserve.Claim{})
		defer p.bodies.Give(taken, httpserve.Claim{})
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			idem.WriteProblem(w, http.StatusRequestEntityTooLarge, "too-large", "the request body is too large to be made idempotent", 0)
			return
		case errors.Is(err, httpserve.ErrOverBudget):
			idem.WriteProblem(w, http.StatusServiceUnavailable, "store-unavailable", "idemproxy holds as many request bodies as its memory budget allows; the request did not reach the upstream", 1)
			return
		case err != nil:
			idem.WriteProblem(w, http.StatusBadRequest, "invalid-request", "the request body could not be read", 0)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// answerCopies is what a keyed request holds per byte of its answer, up
// to the largest body stored: as the middleware records the upstream's,
// its buffer (which may double as it grows) and the base64 of it in the
// complete sent to idemsvc; for a replay, the base64 read from idemsvc
// and its decoding.
const answerCopies = 4

// answerHold counts the bytes of one keyed request's answer in the
// budget, up to the largest body stored (past it, the middleware streams
// the answer and holds none of it). They are counted, never refused: an
// answer under way is not cut, as the upstream has run. So recorded and
// replayed answers do not wait for room, but while they are held new
// keyed bodies do, and get 503 past BudgetWait. They are given back when
// the request ends.
type answerHold struct {
	budget *httpserve.Budget
	mu     sync.Mutex
	left   int64 // bytes of the answer still to count
	held   int64 // bytes counted, copies included
}

type answerHoldKey struct{}

func (h *answerHold) count(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := min(int64(n), h.left); m > 0 {
		h.left -= m
		h.held += m * answerCopies
		h.budget.Hold(m * answerCopies)
	}
}

func (h *answerHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.budget.GiveBytes(h.held, httpserve.Claim{})
	h.held = 0
}

// answerWriter counts what is written through it in its answerHold.
type answerWriter struct {
	http.ResponseWriter
	hold *answerHold
}

func (w *answerWriter) Write(b []byte) (int, error) {
	w.hold.count(len(b))
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// admin serves /healthz (200 while idemproxy serves; it does not ask
// idemsvc, so that pass-through traffic keeps flowing when idemsvc is
// down) and /metrics.
func (p *proxy) admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{}))
	return mux
}

// forwardedFor tells the upstream what it would have seen without
// idemproxy: the Host the caller asked for and the Forwarded and
// X-Forwarded-* headers the caller's proxies set (Rewrite drops them), with
// the caller's address added to X-Forwarded-For.
func forwardedFor(r *httputil.ProxyRequest) {
	for _, name := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v, ok := r.In.Header[name]; ok {
			r.Out.Header[name] = v
		}
	}
	if ip, _, err := net.SplitHostPort(r.In.RemoteAddr); err == nil {
		if prior := r.Out.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		r.Out.Header.Set("X-Forwarded-For", ip)
	}
	if r.Out.Header.Get("X-Forwarded-Host") == "" {
		r.Out.Header.Set("X-Forwarded-Host", r.In.Host)
	}
	if r.Out.Header.Get("X-Forwarded-Proto") == "" {
		proto := "http"
		if r.In.TLS != nil {
			proto = "https"
		}
		r.Out.Header.Set("X-Forwarded-Proto", proto)
	}
}

// unreplayable keeps http.Transport from sending a request twice. It
// resends a request without a body (or one it can rewind) that failed on
// a reused connection when the request's Header map has an
// "Idempotency-Key" or "X-Idempotency-Key" entry, even after the upstream
// read it: for a POST, a second run. Stored under a lower-case name, the
// header still goes out (field names are case-insensitive), but the
// Transport no longer finds the entry it looks for.
func unreplayable(out *http.Request) {
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := out.Header[name]; ok {
			delete(out.Header, name)
			out.Header[strings.ToLower(name)] = v
		}
	}
}

// requestState is what the handlers learn of one request.
type requestState struct {
	keyed     bool // a handled method with the key header
	forwarded bool // it reached the reverse proxy
}

type stateKey struct{}

// counted counts each request by its outcome.
//
// A keyed request outlives its caller: once the upstream has it, the
// upstream's answer is what a retry must get, so the request to the
// upstream goes on (within the upstream timeout) when the caller leaves,
// and its answer is stored. Cancelled with the caller, the request would
// release the key while the upstream may still run it, and the caller's
// retry would run it again.
func (p *proxy) counted(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keyed := slices.Contains(p.cfg.middleware.Methods, r.Method) && r.Header.Get(p.cfg.middleware.KeyHeader) != ""
		st := &requestState{keyed: keyed}
		sw := &statusWriter{ResponseWriter: w}
		ctx := r.Context()
		if keyed {
			ctx = context.WithoutCancel(ctx)
		}
		defer func() {
			// Counted also when the answer broke off (the reverse proxy
			// panics with http.ErrAbortHandler).
			outcome := outcomeRefused
			switch {
			case sw.Header().Get(idem.ReplayedHeader) == "true" && !st.forwarded:
				outcome = outcomeReplayed
			case st.forwarded && keyed:
				outcome = outcomeExecuted
			case st.forwarded:
				outcome = outcomePassed
			}
			p.requests.WithLabelValues(outcome, strconv.Itoa(sw.status)).Inc()
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(ctx, stateKey{}, st)))
	})
}

// timed forwards to the upstream, marking the request forwarded and timing
// the upstream's answer.
func (p *proxy) timed(rp http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, _ := r.Context().Value(stateKey{}).(*requestState)
		if st != nil {
			st.forwarded = true
		}
		if st != nil && st.keyed {
			ctx, cancel := context.WithTimeout(r.Context(), p.cfg.upstreamTimeout)
			defer cancel()
			r = r.WithContext(ctx)
			if hold, ok := r.Context().Value(answerHoldKey{}).(*answerHold); ok {
				// What the middleware records, counted as it comes.
				w = &answerWriter{ResponseWriter: w, hold: hold}
			}
		}
		start := time.Now()
		rp.ServeHTTP(w, r)
		p.upstream.Observe(time.Since(start).Seconds())
	})
}

// upstreamError answers a request the upstream did not answer: 502, which
// the middleware takes as a retryable failure, releasing the key.
func (p *proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	status, detail := http.StatusBadGateway, "the upstream did not answer"
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		status, detail = http.StatusGatewayTimeout, "the upstream did not answer in time"
	}
	if errors.Is(err, context.Canceled) {
		// A caller of a request passed through left: no answer to give,
		// and nothing wrong with the upstream.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	p.upErrors.Inc()
	p.log.Warn("upstream error", "method", r.Method, "path", r.URL.Path, "err", err)
	idem.WriteProblem(w, status, "", detail, 0) // about:blank, code bad-gateway or gateway-timeout
}

// statusWriter notes the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer, for
// the reverse proxy's flushes of a streamed answer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
