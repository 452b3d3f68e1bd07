// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// DefaultTenant is the tenant of every call when no tenants are configured.
const DefaultTenant = "default"

// Config is what New needs. Zero values take the defaults.
type Config struct {
	Store statemachine.Store
	// Keyring authenticates API keys. Nil turns authentication off: every
	// call is admin of DefaultTenant (development only).
	Keyring *auth.Keyring
	Logger  *slog.Logger
	// AccessLog says which requests get their line in the log (default
	// AccessLogAll).
	AccessLog AccessLog
	// Registry receives the service's metrics and serves /metrics; a new
	// one when nil.
	Registry *prometheus.Registry
	// MaxBodyBytes bounds a request body (default 2 MiB).
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes of request bodies held at
	// once (default 256 MiB); past it a body waits briefly, then 503.
	MaxBodyBytesInFlight int64
	// MaxWait bounds wait_ms (default 30 s).
	MaxWait time.Duration
	// MaxBatch bounds the items of a batch (default DefaultMaxBatch).
	MaxBatch int
	// Limiter enforces the tenants' limits (from Keyring) at begin; nil
	// enforces none.
	Limiter quota.Limiter
	// StoreTimeout, when set, bounds a begin's limit calls and its first
	// store call together (the store's own timeout bounds each call): a
	// begin of a limited tenant then fails within one timeout while the
	// store is down, not one for the limits and another for the store.
	StoreTimeout time.Duration
	// WaitPollInterval is how often the status of a waited key is read
	// when the store cannot push the end of attempts (default 25 ms).
	WaitPollInterval time.Duration
	// WaitFallbackInterval is how often the status of a waited key is read
	// when the store pushes the end of attempts, against lost pushes
	// (default 5 s; at least 1 s).
	WaitFallbackInterval time.Duration
	// A large answer must be written within WriteDeadlineBase plus its
	// size at MinClientRate bytes per second (defaults 5 s, 1 MiB/s).
	WriteDeadlineBase time.Duration
	MinClientRate     int64
	// ReadsInFlight bounds the large answers (replays and statuses with
	// a stored response of 64 KiB or more) each tenant has in flight on
	// this instance (default DefaultReadsInFlight).
	ReadsInFlight int
	// Tracer gives each request and each store call a span. Nil traces
	// nothing, at no cost.
	Tracer trace.TracerProvider
	// TrustedProxies are the networks of the proxies in front of idemsvc:
	// a request from one of them is logged with the client its
	// X-Forwarded-For names (the last address not itself trusted), and
	// with the proxy as its peer. Without them X-Forwarded-For is ignored.
	TrustedProxies []netip.Prefix
	// Blob, when its Store is set, keeps large stored bodies in a blob
	// store, and POST /v1/complete/stream takes bodies up to its
	// MaxStoredBytes.
	Blob *BlobConfig
}

// AccessLog says which requests get a line in the log
// (IDEMSVC_ACCESS_LOG).
type AccessLog int

const (
	// AccessLogAll logs every request, at info (errors of the store at
	// error): the default.
	AccessLogAll AccessLog = iota
	// AccessLogErrors logs only the requests answered 400 or above.
	AccessLogErrors
	// AccessLogOff logs no request; the metrics still count them all.
	AccessLogOff
)

// ParseAccessLog reads all, errors or off.
func ParseAccessLog(s string) (AccessLog, error) {
	switch s {
	case "all", "":
		return AccessLogAll, nil
	case "errors":
		return AccessLogErrors, nil
	case "off":
		return AccessLogOff, nil
	}
	return 0, fmt.Errorf("access log %q is none of all, errors and off", s)
}

// Defaults of Config.
const (
	DefaultMaxBodyBytes         = 2 << 20
	DefaultMaxBodyBytesInFlight = 256 << 20
	DefaultMaxWait              = 30 * time.Second
	DefaultWaitPollInterval     = 25 * time.Millisecond
	DefaultWaitFallbackInterval = 5 * time.Second
)

// bodyCopies is how many copies of its body a request holds: the bytes
// read, and the strings they are decoded into.
const bodyCopies = 2

// Service implements the API over a Store. It is an http.Handler.
type Service struct {
	store        statemachine.Store
	tracer       trace.Tracer // nil when tracing is off
	keyring      *auth.Keyring
	log          *slog.Logger
	accessLog    AccessLog
	registry     *prometheus.Registry
	metrics      *metrics
	waiters      *waiters
	quota        quota.Limiter
	storeTimeout time.Duration
	maxBodyBytes int64
	maxBatch     int
	bodies       *httpserve.Budget
	// bounds are the store's, with MaxWait from Config: every value a
	// request carries is checked against them.
	bounds statemachine.Limits
	// writeDeadlineBase and minClientRate bound the writing of a large
	// answer.
	writeDeadlineBase time.Duration
	minClientRate     int64
	reads             *readSlots
	trustedProxies    []netip.Prefix
	blobs             *blobs // nil without a blob store
	router            *chi.Mux
	routes            sync.Pool // of *chi.Context, for ServeHTTP
	// pasted holds the tenants file's entries already reported as an API
	// key where its digest belongs (tenant and index), each once.
	pasted sync.Map
}

var _ api.StrictServerInterface = (*Service)(nil)

// New builds the service and its routes.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.WriteDeadlineBase <= 0 {
		cfg.WriteDeadlineBase = DefaultWriteDeadlineBase
	}
	if cfg.MinClientRate <= 0 {
		cfg.MinClientRate = DefaultMinClientRate
	}
	if cfg.ReadsInFlight <= 0 {
		cfg.ReadsInFlight = DefaultReadsInFlight()
	}
	if cfg.WaitPollInterval <= 0 {
		cfg.WaitPollInterval = DefaultWaitPollInterval
	}
	if cfg.WaitFallbackInterval <= 0 {
		cfg.WaitFallbackInterval = DefaultWaitFallbackInterval
	}
	s := &Service{
		routes:            sync.Pool{New: func() any { return chi.NewRouteContext() }},
		store:             cfg.Store,
		keyring:           cfg.Keyring,
		log:               cfg.Logger,
		accessLog:         cfg.AccessLog,
		registry:          cfg.Registry,
		metrics:           newMetrics(cfg.Registry, tenantLabeller(cfg.Limiter)),
		maxBodyBytes:      cfg.MaxBodyBytes,
		maxBatch:          cfg.MaxBatch,
		bodies:            httpserve.NewBudget(cfg.MaxBodyBytesInFlight, bodyCopies, true, cfg.Registry, "idemsvc"),
		bounds:            cfg.Store.Limits(),
		writeDeadlineBase: cfg.WriteDeadlineBase,
		minClientRate:     cfg.MinClientRate,
		reads:             newReadSlots(cfg.ReadsInFlight),
		quota:             cfg.Limiter,
		storeTimeout:      cfg.StoreTimeout,
		trustedProxies:    cfg.TrustedProxies,
	}
	s.bounds.MaxWait = cfg.MaxWait
	s.blobs = newBlobs(cfg.Blob, cfg.Registry)
	s.metrics.windowed = func(tenant string) bool {
		if cfg.Keyring == nil {
			return tenant == DefaultTenant
		}
		return cfg.Keyring.Has(tenant)
	}
	if a, ok := cfg.Store.(admitting); ok {
		registerAdmission(cfg.Registry, a)
	}
	if cfg.Limiter != nil {
		s.reads.refusedOf = cfg.Limiter.ReadsInFlightRefused
		cfg.Registry.MustRegister(cfg.Limiter)
		if cfg.Keyring != nil {
			cfg.Limiter.Known(cfg.Keyring.Tenants()...)
		}
	}
	if cfg.Tracer != nil {
		s.tracer = cfg.Tracer.Tracer("github.com/idemsvc/idemsvc/internal/handlers")
		s.store = tracedStore{cfg.Store, s.tracer}
	}
	s.waiters = newWaiters(cfg.Store, cfg.WaitPollInterval, cfg.WaitFallbackInterval, s.metrics)

	r := chi.NewRouter()
	// Every GET route answers HEAD too (RFC 9110): chi routes a HEAD
	// without a route of its own to the GET handler, and net/http drops
	// the body it writes.
	r.Use(middleware.GetHead)
	r.Use(s.recoverPanic)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { writeProblem(w, r, errNoRoute) })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				allowed = append(allowed, m)
				if m == http.MethodGet {
					allowed = append(allowed, http.MethodHead)
				}
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeProblem(w, req, errMethod)
	})
	strict := api.NewStrictHandlerWithOptions(s, nil, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  requestError,
		ResponseErrorHandlerFunc: writeProblem,
	})
	api.HandlerWithOptions(strict, api.ChiServerOptions{
		// Authenticate before the generated wrapper reads the query, so
		// that a call without a valid key is 401 whatever its parameters;
		// then read the body.
		BaseRouter:       r.With(s.authenticate),
		Middlewares:      []api.MiddlewareFunc{s.readBody},
		ErrorHandlerFunc: requestError,
	})
	s.router = r
	// Error counters exist from the start, at zero, so that an alert on
	// their rate sees the first burst: every route by each kind of store
	// error.
	_ = chi.Walk(r, func(_, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		for _, kind := range []string{kindStoreUnavailable.name, kindInternal.name} {
			s.metrics.storeErrors.WithLabelValues(route, kind)
		}
		return nil
	})
	return s
}

// tenantLabeller is the limiter's tenant labels, or labels of its own
// bounded alike.
func tenantLabeller(l quota.Limiter) func(string) string {
	if l != nil {
		return l.TenantLabel
	}
	return new(quota.TenantLabels).Of
}

// StopWaiting makes every waiting begin answer now and later ones not wait.
// Call it when shutting down, before http.Server.Shutdown, so that waiters
// answer instead of holding the shutdown for up to their wait.
func (s *Service) StopWaiting() { s.waiters.close() }
