// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// requestInfo is what the layers of one request tell each other and the
// access log. observe puts it in the context.
type requestInfo struct {
	http.ResponseWriter // records the status written
	status              int
	id                  string
	principal           auth.Principal
	authenticated       bool
	tenants             *auth.Keyring // the tenants the principal's key was found among; nil without authentication
	tenant              string        // the tenant acted for, once known
	named               string        // a tenant the request named but may not act for (401, 403), for the log only
	outcome             string        // e.g. "acquired", or the problem kind
	err                 error         // the error answered, if any
	reads               largeRead     // the read slot of a begin or status, once readGate armed it
}

func (i *requestInfo) WriteHeader(code int) {
	if i.status == 0 {
		i.status = code
	}
	i.ResponseWriter.WriteHeader(code)
}

func (i *requestInfo) Write(b []byte) (int, error) {
	if i.status == 0 {
		i.status = http.StatusOK
	}
	return i.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (i *requestInfo) Unwrap() http.ResponseWriter { return i.ResponseWriter }

type infoKey struct{}

// noStore is the Cache-Control of every answer under /v1/.
var noStore = []string{"no-store"}

// headerValue is h.Get(name) for a name already in canonical form, as
// net/http keeps the request's: without canonicalizing it again on every
// request, as Get would (so are the headers written here).
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func infoFrom(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(infoKey{}).(*requestInfo)
	return info
}

// setOutcome records what a request came to, for the log and metrics.
func setOutcome(ctx context.Context, tenant, outcome string) {
	if info := infoFrom(ctx); info != nil {
		info.tenant = tenant
		info.outcome = outcome
	}
}

// requestCtx is a request's context: its requestInfo and chi's routing
// context, in one allocation and one copy of the request, where a value
// context each (chi's own, made when it finds none) took two of each.
// Both are answered by Value without walking the parents.
type requestCtx struct {
	context.Context
	info     requestInfo
	route    *chi.Context
	idHeader [1]string // the X-Request-Id header's value
	idBytes  [16]byte  // a request id made here
	// logRest holds the request line's attributes past the first four:
	// a record keeps five inline and puts more in a slice of its own.
	logRest [8]slog.Attr
}

func (c *requestCtx) Value(key any) any {
	if _, ok := key.(infoKey); ok {
		return &c.info
	}
	if key == chi.RouteCtxKey {
		return c.route
	}
	if key == statemachine.ReadGateKey && c.info.reads.slots != nil {
		return &c.info.reads
	}
	return c.Context.Value(key)
}

// ServeHTTP serves the API.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.observe(w, r, s.router) }

// observe gives each request an id (the caller's X-Request-Id when it is
// sane), serves it with next, and when it is done logs one line and counts
// it. Nothing secret is logged: no API key, no client key, no body.
func (s *Service) observe(w http.ResponseWriter, r *http.Request, next http.Handler) {
	// The router finds its routing context in the request's, as it finds
	// a parent router's, and uses it. It comes from a pool and goes back
	// once the request is done, as the router's own would.
	rctx := s.routes.Get().(*chi.Context)
	defer s.routes.Put(rctx)
	rctx.Reset()
	rctx.Routes = s.router
	c := &requestCtx{Context: r.Context(), route: rctx}
	r = r.WithContext(c)
	start := time.Now()
	info := &c.info
	info.ResponseWriter = w
	info.id = requestID(headerValue(r.Header, "X-Request-Id"), &c.idBytes)
	c.idHeader[0] = info.id
	w.Header()["X-Request-Id"] = c.idHeader[:]
	var span trace.Span
	if s.tracer != nil {
		r, span = s.startRequestSpan(r)
	}
	next.ServeHTTP(info, r)

	end := time.Now()
	elapsed := end.Sub(start)
	route := c.route.RoutePattern()
	if route == "" {
		route = "unmatched"
	}
	status := info.status
	if status == 0 {
		status = http.StatusOK
	}
	outcome := info.outcome
	if outcome == "" {
		outcome = "ok"
	}
	if span != nil {
		endRequestSpan(span, r.Method, route, status, info, outcome)
	}
	series := s.metrics.series(route, outcome, status, info.tenant)
	series.requests.Inc()
	if series.beginTime != nil {
		series.beginTime.Observe(elapsed.Seconds())
	}
	if series.begins != nil {
		series.begins.Inc()
	}
	series.duration.Observe(elapsed.Seconds())
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
		s.metrics.storeErrors.WithLabelValues(route, outcome).Inc()
	}
	if s.accessLog == AccessLogOff || (s.accessLog == AccessLogErrors && status < 400) || !s.log.Enabled(r.Context(), level) {
		return
	}
	// Four attributes go in the record and the rest in a group without
	// a name, which handlers write inline, held by the request's context:
	// a record holds five attributes inline and would allocate for more.
	client, peer := s.client(r)
	rest := append(c.logRest[:0],
		slog.String("outcome", outcome),
		slog.Int64("duration_us", elapsed.Microseconds()),
		slog.String("client", client),
	)
	if peer != "" {
		rest = append(rest, slog.String("peer", peer))
	}
	if info.tenant != "" {
		rest = append(rest, slog.String("tenant", info.tenant))
	} else if info.named != "" {
		rest = append(rest, slog.String("tenant", info.named))
	}
	// Who acted, when it is not the tenant acted for: an admin acting
	// for another tenant, or a key refused (403) for the tenant it named.
	if info.authenticated && info.principal.Tenant != info.tenant && info.principal.Tenant != DefaultTenant && status != http.StatusUnauthorized {
		rest = append(rest, slog.String("principal", info.principal.Tenant))
	}
	if info.err != nil && status >= 500 {
		rest = append(rest, slog.String("error", info.err.Error()))
	}
	// The record is made here rather than by LogAttrs, which would also
	// take the caller's PC (runtime.Callers: 3,100 instructions a
	// request) for a source that idemsvc's log lines do not carry.
	rec := slog.NewRecord(end, level, "request", 0)
	rec.AddAttrs(
		slog.String("request_id", info.id),
		slog.String("method", r.Method),
		slog.String("route", route),
		slog.Int("status", status),
		slog.Attr{Value: slog.GroupValue(rest...)},
	)
	_ = s.log.Handler().Handle(r.Context(), rec)
}

// errPanic is what a request whose handler panicked is answered and
// logged as: an internal error (no row of errorKinds knows it), whose
// panic value and stack go to a log line of their own.
var errPanic = errors.New("the handler panicked")

// recoverPanic answers a handler's panic with a 500 problem of kind
// internal, through the one table (chi's middleware.Recoverer would answer
// text/plain), and logs the panic at error with its stack and the
// request's id. A panic with http.ErrAbortHandler, a handler's way of
// cutting its answer off, is panicked again for net/http, which expects
// it; so is any panic once the answer has begun, as a problem cannot
// follow it and the client must not take the cut answer for a whole one.
// It sits inside observe, which then logs and counts the 500.
func (s *Service) recoverPanic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler { // net/http compares it so, unwrapped
				panic(v)
			}
			info := infoFrom(r.Context())
			attrs := []slog.Attr{slog.Any("panic", v), slog.String("stack", string(debug.Stack()))}
			if info != nil {
				attrs = append([]slog.Attr{slog.String("request_id", info.id)}, attrs...)
			}
			s.log.LogAttrs(r.Context(), slog.LevelError, "panic", attrs...)
			if info != nil && info.status != 0 {
				panic(http.ErrAbortHandler)
			}
			writeProblem(w, r, errPanic)
		}()
		next.ServeHTTP(w, r)
	})
}

// Request ids are made of a random prefix drawn at start and a count: they
// need to be unique, not secret, so a request costs no random bytes. The
// count wraps after 2^32 requests of one process.
var (
	requestIDPrefix = func() (p [8]byte) {
		var b [4]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
		hex.Encode(p[:], b[:])
		return p
	}()
	requestIDCount atomic.Uint32
)

// requestID keeps a caller's id of up to 64 visible ASCII characters, and
// otherwise makes one of 16 hex digits in buf, which it must not outlive.
func requestID(given string, buf *[16]byte) string {
	if n := len(given); n > 0 && n <= 64 {
		ok := true
		for i := 0; i < n; i++ {
			if given[i] < 0x21 || given[i] > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			return given
		}
	}
	copy(buf[:], requestIDPrefix[:])
	n := requestIDCount.Add(1)
	hex.Encode(buf[8:], []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	// The id's string is the context's bytes, written once, here: no
	// allocation of its own.
	return unsafe.String(&buf[0], len(buf))
}

// authenticate finds the principal of the request's API key.
func (s *Service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := infoFrom(r.Context())
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r) // health, readiness and metrics are open
			return
		}
		// Answers carry lease tokens and stored responses: no cache keeps them.
		w.Header()["Cache-Control"] = noStore
		// Two of a header that must be one would leave it to chance which
		// one counts.
		for _, name := range []string{"Authorization", "Content-Type"} {
			if len(r.Header[name]) > 1 {
				writeProblem(w, r, &duplicateHeaderError{name})
				return
			}
		}
		if s.keyring == nil {
			info.principal = auth.Principal{Tenant: DefaultTenant, Admin: true}
			info.authenticated = true
			next.ServeHTTP(w, r)
			return
		}
		key, given := bearer(headerValue(r.Header, "Authorization"))
		ok := false
		if given {
			info.principal, ok = s.keyring.Lookup(key)
			info.tenants = s.keyring
		}
		if !ok {
			if given {
				s.reportPasted(key)
			}
			// The tenant a refused call names in its query, if any, for
			// the log (a body is not read for a call refused here).
			if named := r.URL.Query().Get("tenant"); auth.ValidTenantName(named) {
				info.named = named
			}
			writeProblem(w, r, errUnauthorized)
			return
		}
		info.authenticated = true
		next.ServeHTTP(w, r)
	})
}

// reportPasted logs, once per entry, that the tenants file lists apiKey,
// a key refused, itself instead of its digest (or that the caller was
// given the digest instead of the key): the key gets 401, and the operator
// learns why and what to put there. Neither the key nor the entry's value
// is logged.
func (s *Service) reportPasted(apiKey string) {
	tenant, index, ok := s.keyring.Pasted(apiKey)
	if !ok {
		return
	}
	type entry struct {
		tenant string
		index  int
	}
	if _, seen := s.pasted.LoadOrStore(entry{tenant, index}, true); seen {
		return
	}
	s.log.Error("tenants file: a caller presented as its API key the value the entry lists, and got 401: "+
		"the key was pasted where its digest belongs, or the caller holds the digest instead of the key",
		slog.String("tenant", tenant), slog.String("entry", fmt.Sprintf("api_key_sha256[%d]", index)),
		slog.String("hint", `list the key's SHA-256 digest (64 hex characters), never the key: printf %s "$KEY" | sha256sum`))
}

// client is the address of the request's client, and of the proxy it
// came through ("" when it came directly): the connection's peer, unless
// the peer is a trusted proxy; then the last address of X-Forwarded-For
// that is not a trusted proxy itself.
func (s *Service) client(r *http.Request) (client, peer string) {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if len(s.trustedProxies) == 0 {
		return host, ""
	}
	if addr, err := netip.ParseAddr(host); err != nil || !s.trusted(addr) {
		return host, ""
	}
	forwarded := r.Header.Values("X-Forwarded-For")
	for i := len(forwarded) - 1; i >= 0; i-- {
		hops := strings.Split(forwarded[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			addr, err := netip.ParseAddr(strings.TrimSpace(hops[j]))
			if err != nil {
				return host, "" // a malformed hop: nothing before it can be trusted
			}
			if !s.trusted(addr) {
				return addr.String(), host
			}
		}
	}
	return host, ""
}

// trusted reports whether addr is the address of a trusted proxy.
func (s *Service) trusted(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range s.trustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// bearer takes the token out of an "Authorization: Bearer <token>" value.
func bearer(header string) (string, bool) {
	const scheme = "bearer "
	if len(header) <= len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) {
		return "", false
	}
	return strings.TrimSpace(header[len(scheme):]), true
}

// readBody checks a request body's content type, size and JSON syntax, and
// hands the handler the body read in full.
func (s *Service) readBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == completeStreamPath {
			s.streamBody(next, w, r)
			return
		}
		if !isJSON(headerValue(r.Header, "Content-Type")) {
			writeProblem(w, r, errMediaType)
			return
		}
		if r.ContentLength > s.maxBodyBytes {
			writeProblem(w, r, bodyTooLarge(s.maxBodyBytes))
			return
		}
		claim := httpserve.Claim{Finish: finishes(r.URL.Path)}
		if s.keyring != nil { // one tenant's bodies hold at most its share of the budget
			claim.Tenant = infoFrom(r.Context()).principal.Tenant
		}
		body, taken, err := s.bodies.ReadBody(r.Context(), http.MaxBytesReader(w, r.Body, s.maxBodyBytes), r.ContentLength, s.maxBodyBytes, claim)
		defer s.bodies.Give(taken, claim) // once the handler is done with the body
		if err != nil {
			var tooLarge *http.MaxBytesError
			switch {
			case errors.As(err, &tooLarge):
				writeProblem(w, r, bodyTooLarge(s.maxBodyBytes))
			case errors.Is(err, httpserve.ErrOverBudget):
				writeProblem(w, r, err)
			default:
				// Not err's text: it names socket addresses.
				writeProblem(w, r, badField("", "could not be read in full (the connection stalled or broke)"))
			}
			return
		}
		r.Body = api.NewBody(body) // the generated handler decodes it, strictly
		next.ServeHTTP(w, r)
	})
}

// finishes reports whether a path's call finishes an operation (complete,
// fail) or keeps its lease (extend): their bodies may use the part of the
// budget kept for them, so that an outcome never loses its place to other
// bodies (httpserve.Budget).
func finishes(path string) bool {
	return path == "/v1/complete" || path == completeStreamPath || path == "/v1/fail" || path == "/v1/extend"
}

// isJSON reports whether a Content-Type names application/json.
func isJSON(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// requestError answers a request the generated code could not decode: a
// body that does not fit its schema, or a bad query parameter.
func requestError(w http.ResponseWriter, r *http.Request, err error) {
	var invalid *statemachine.InvalidError
	var required *api.RequiredParamError
	var format *api.InvalidParamFormatError
	var many *api.TooManyValuesForParamError
	switch {
	case errors.As(err, &invalid):
		writeProblem(w, r, invalid)
	case errors.As(err, &required):
		writeProblem(w, r, badField(required.ParamName, "is required"))
	case errors.As(err, &format):
		writeProblem(w, r, badField(format.ParamName, "is not valid"))
	case errors.As(err, &many):
		writeProblem(w, r, badField(many.ParamName, "must be given once"))
	default: // anything else the generated code refuses
		writeProblem(w, r, badField("", "does not fit the operation's request body"))
	}
}
