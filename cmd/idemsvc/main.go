// SPDX-License-Identifier: Apache-2.0

// Command idemsvc serves the idempotency API: over Redis (one node,
// Sentinel or Cluster) in production, or over an in-memory store for
// development. Configuration comes from IDEMSVC_* environment variables or
// flags of the same names; run it with -h for the list.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/buildinfo"
	"github.com/idemsvc/idemsvc/internal/console"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/jsonlog"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// limitMemory bounds the runtime's heap by the budget of bodies in flight
// (tests that run several servers in one process turn it off).
var limitMemory = httpserve.LimitMemory

func main() {
	if buildinfo.IsVersionFlag(os.Args[1:]) {
		fmt.Println(buildinfo.Line("idemsvc"))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:], os.Environ(), os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Environ(), os.Stderr, nil)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemsvc:", err)
		os.Exit(1)
	}
}

// Server timeouts (the others are httpserve's defaults). A begin may wait
// up to max-wait-ms, so writes get that and writeMargin on top.
const (
	readTimeout     = 30 * time.Second
	writeMargin     = 15 * time.Second
	idleTimeout     = 2 * time.Minute
	shutdownTimeout = 30 * time.Second
	// logFlushInterval is how long an info line may wait in the buffer
	// (warnings and errors are written at once).
	logFlushInterval = 200 * time.Millisecond
)

// run serves until ctx ends, then shuts down gracefully: it stops taking
// connections, wakes waiters, lets requests in flight finish and returns
// nil. Logs are JSON lines on logOut. listening, when not nil, is told
// the URL served (scheme and the address listened on) once it listens:
// tests take the port from it.
func run(ctx context.Context, args, env []string, logOut io.Writer, listening func(url string)) error {
	cfg, err := parseConfig(args, env)
	if err != nil {
		return err
	}
	if cfg.usesRedis() {
		// Not with the in-memory store (development only): its records
		// live on the heap, beyond the budget, and a limit near the
		// budget would have the collector run without pause.
		limitMemory(cfg.maxBodyBytesInFlight, env)
	}
	logs := newLogWriter(logOut, logFlushInterval)
	defer logs.Close()
	log := slog.New(flushingHandler{jsonlog.NewHandler(logs, cfg.logLevel), logs})
	version, revision, goVersion := buildinfo.Get()
	log.Info("idemsvc starting", "version", version, "revision", revision, "goversion", goVersion)

	// First, so that a misspelt variable is named before any refusal it causes.
	for _, name := range cfg.unknownVars {
		log.Warn("ignoring an environment variable that names no setting", "variable", name)
	}
	var keyring *auth.Keyring
	var tenantsData []byte
	if cfg.tenantsFile != "" {
		if keyring, tenantsData, err = auth.LoadFile(cfg.tenantsFile); err != nil {
			return err
		}
	}
	store, limiter, closeStore, err := openStore(ctx, &cfg, keyring, log)
	if err != nil {
		return err
	}
	defer closeStore()
	defer limiter.Close() // before the store closes: it flushes the stored bytes

	registry := prometheus.NewRegistry()
	evictionAllowed := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemsvc_redis_eviction_allowed",
		Help: "1 when IDEMSVC_REDIS_ALLOW_EVICTION lets idemsvc serve on a Redis whose eviction policy may drop records.",
	})
	if cfg.redisAllowEviction {
		evictionAllowed.Set(1)
	}
	registry.MustRegister(evictionAllowed)
	if rs, ok := store.(*redisstore.Store); ok {
		registry.MustRegister(headroomCollector{rs})
	}
	registerBuildInfo(registry)
	if keyring != nil {
		stopWatching := watchTenants(ctx, cfg.tenantsFile, keyring, tenantsData, registry, log)
		defer stopWatching()
	}
	provider, stopTracing, err := tracing(env)
	if err != nil {
		return err
	}
	defer func() { // flushes the spans buffered
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(flushCtx)
	}()
	hc := handlers.Config{Store: store, Keyring: keyring, Logger: log, AccessLog: cfg.accessLog, Registry: registry,
		MaxBodyBytes: cfg.maxRequestBytes, MaxBodyBytesInFlight: cfg.maxBodyBytesInFlight, MaxWait: cfg.maxWait, MaxBatch: cfg.maxBatch, ReadsInFlight: cfg.readsInFlight, Limiter: limiter,
		TrustedProxies: cfg.trustedProxies, StoreTimeout: cfg.storeTimeout()}
	if cfg.blobURL != "" {
		if hc.Blob, err = openBlob(ctx, &cfg, registry, log); err != nil {
			return err
		}
	}
	if provider != nil {
		hc.Tracer = provider
		log.Info("tracing: spans exported over OTLP")
	}
	svc := handlers.New(hc)
	edge := httpserve.Config{
		Addr:           cfg.listen,
		MaxConnections: cfg.maxConnections,
		ReadTimeout:    readTimeout,
		WriteTimeout:   cfg.maxWait + writeMargin,
		Log:            log,
		Registry:       registry,
		MetricPrefix:   "idemsvc",
	}
	scheme := "http"
	if cfg.tlsCertFile != "" {
		certs, err := newServingTLS(cfg.tlsCertFile, cfg.tlsKeyFile, cfg.tlsClientCAFile, log)
		if err != nil {
			return err
		}
		edge.TLS = certs.Config()
		scheme = "https"
		if cfg.tlsClientCAFile != "" {
			log.Info("TLS: client certificates required")
		}
	} else {
		log.Warn("TLS is off: API keys and stored responses cross the network in clear; set IDEMSVC_TLS_CERT_FILE and IDEMSVC_TLS_KEY_FILE to serve HTTPS")
	}
	var handler http.Handler = svc
	if cfg.console {
		handler = console.Handler(svc)
		log.Info("console: serving the operators' console", "path", console.Path)
	}
	srv, err := httpserve.Listen(edge, handler)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	log.Info("listening", "addr", srv.Addr().String(), "scheme", scheme)
	if listening != nil {
		listening(scheme + "://" + srv.Addr().String())
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight")
	svc.StopWaiting()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// openStore opens the configured store, and the tenant limits kept where
// it keeps its records, and says what it chose.
func openStore(ctx context.Context, cfg *config, keyring *auth.Keyring, log *slog.Logger) (statemachine.Store, quota.Limiter, func(), error) {
	limits := cfg.limits
	if !cfg.usesRedis() {
		log.Warn("NO REDIS CONFIGURED: serving from the in-memory store. Records live in this process only and are lost when it exits, and other instances do not see them. For development only; set IDEMSVC_REDIS_URL, IDEMSVC_REDIS_CLUSTER_ADDRS or IDEMSVC_REDIS_SENTINEL_ADDRS in production.")
		if keyring == nil {
			log.Warn("NO AUTHENTICATION: no tenants file, so every call is accepted as tenant " + handlers.DefaultTenant + ".")
		}
		return statemachine.NewMemoryStore(limits), quota.NewMemory(quota.Options{Logger: log, NewToken: statemachine.NewToken}), func() {}, nil
	}
	if keyring == nil {
		if !cfg.insecureNoAuth {
			return nil, nil, nil, errors.New("refusing to serve Redis without tenants: set IDEMSVC_TENANTS_FILE, or pass --insecure-no-auth to accept every call as tenant " + handlers.DefaultTenant)
		}
		log.Warn("NO AUTHENTICATION (--insecure-no-auth): every call is accepted as tenant " + handlers.DefaultTenant + ".")
	}
	client, desc, err := redisClient(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	redis.SetLogger(redisLogger{log})
	reserve := cfg.redisReserveBytes
	if reserve == 0 {
		reserve = -1 // none; redisstore.Options' zero is the default
	}
	store := redisstore.New(client, redisstore.Options{
		Limits:        limits,
		Timeout:       cfg.redisTimeout,
		WaitReplicas:  cfg.redisWaitReplicas,
		WaitTimeout:   cfg.redisWaitTimeout,
		AllowEviction: cfg.redisAllowEviction,
		MaxInFlight:   cfg.redisMaxInFlight,
		ReserveBytes:  reserve,
		ProbeKeys:     quota.ProbeKeys(),
	})
	log.Info("store: Redis", "mode", desc, "wait_replicas", cfg.redisWaitReplicas)
	if cfg.redisWaitReplicas == 0 {
		log.Warn("IDEMSVC_REDIS_WAIT_REPLICAS is 0: transitions are acknowledged before any replica has them, so a Redis failover can lose acknowledged transitions")
	}
	checker := &redisChecker{store: store, allowEviction: cfg.redisAllowEviction, log: log, warned: map[string]bool{},
		refused: map[string]bool{}, every: redisCheckInterval, retry: redisRetryInterval}
	allRead := false
	// A Redis that refuses the credentials answers the ping: the check
	// names the refusal.
	if err := store.Ping(ctx); err != nil && !redis.IsAuthError(err) {
		log.Warn("Redis is not reachable yet; answering 503 until it is", "error", err.Error())
	} else if allRead, err = checker.check(ctx, true); err != nil {
		_ = client.Close()
		return nil, nil, nil, err
	}
	go checker.watch(ctx, allRead)
	go watchRoom(ctx, store, roomCheckInterval, log)
	limiter := quota.NewRedis(client, quota.Options{Logger: log, Timeout: cfg.redisTimeout, NewToken: statemachine.NewToken})
	return store, limiter, func() { _ = client.Close() }, nil
}

// redisPoolSize is the connections the client may open per Redis node: one
// for each script the store may run at a time (redis-max-in-flight), so
// that the scripts it admits do not queue for a connection, and room for
// the calls around them (tenant limits, waiter counts, health checks,
// listing), which are not bounded with the scripts.
func redisPoolSize(cfg *config) int { return cfg.redisMaxInFlight + 32 }

// redisClient builds the go-redis client of the configured mode. Every
// mode bounds each command by its context, so the store's timeout holds
// even while Redis hangs, and so do its tries: the store gives up a try on
// a hung master and tries again once a replica took over (see
// internal/redisstore/failover.go).
func redisClient(cfg *config) (redis.UniversalClient, string, error) {
	var tlsConfig *tls.Config
	if cfg.redisTLS || cfg.redisURLTLS() {
		var err error
		if tlsConfig, err = redisTLS(cfg); err != nil {
			return nil, "", err
		}
	}
	switch {
	case cfg.redisURL != "":
		opts, err := redis.ParseURL(cfg.redisURL)
		if err != nil {
			// ParseURL's errors quote the URL, password and all.
			return nil, "", errors.New("IDEMSVC_REDIS_URL is not a valid redis:// or rediss:// URL")
		}
		if opts.TLSConfig != nil {
			if opts.TLSConfig.InsecureSkipVerify {
				return nil, "", errors.New("IDEMSVC_REDIS_URL: skip_verify is refused, certificates are always verified: give the CA that signs Redis's certificate as IDEMSVC_REDIS_TLS_CA_FILE")
			}
			tlsConfig.ServerName = opts.TLSConfig.ServerName
			opts.TLSConfig = tlsConfig
		}
		// What the URL gives wins; the rest comes from the settings.
		if opts.Username == "" {
			opts.Username = cfg.redisUsername
		}
		if opts.Password == "" {
			opts.Password = cfg.redisPassword
		}
		opts.ContextTimeoutEnabled = true
		opts.PoolSize = redisPoolSize(cfg)
		return redis.NewClient(opts), "standalone", nil
	case len(cfg.redisClusterAddrs) > 0:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 cfg.redisClusterAddrs,
			Username:              cfg.redisUsername,
			Password:              cfg.redisPassword,
			TLSConfig:             tlsConfig,
			ContextTimeoutEnabled: true,
			PoolSize:              redisPoolSize(cfg),
		}), "cluster", nil
	default:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            cfg.redisSentinelMaster,
			SentinelAddrs:         cfg.redisSentinelAddrs,
			SentinelUsername:      cfg.redisUsername,
			SentinelPassword:      cfg.redisPassword,
			Username:              cfg.redisUsername,
			Password:              cfg.redisPassword,
			TLSConfig:             tlsConfig,
			ContextTimeoutEnabled: true,
			PoolSize:              redisPoolSize(cfg),
		}), "sentinel", nil
	}
}

// redisLogger routes go-redis's own messages into the log: Sentinel's
// routine news (a master found, a Sentinel discovered) at info, the rest
// (failed dials, pool trouble) at warn, each once prefixed.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	text := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	level := slog.LevelWarn
	if strings.HasPrefix(text, "sentinel: ") {
		level = slog.LevelInfo
	}
	l.log.Log(ctx, level, "redis client: "+text)
}

// sweepInterval is how often the blob store's expired objects are swept.
const sweepInterval = time.Hour

// openBlob opens the blob store of large responses, says whether it
// answers (it serves either way: a store down fails the completes of
// large bodies, 503, not idemsvc), and sweeps its expired objects every
// sweepInterval until ctx ends.
func openBlob(ctx context.Context, cfg *config, reg prometheus.Registerer, log *slog.Logger) (*handlers.BlobConfig, error) {
	bc := blob.Config{URL: cfg.blobURL}
	if cfg.blobTLSCAFile != "" {
		pool, err := certPool(cfg.blobTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("blob-tls-ca-file: %w", err)
		}
		bc.TLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	st, err := blob.Open(ctx, bc)
	if err != nil {
		return nil, err
	}
	if err := st.Ping(ctx); err != nil {
		log.Warn("blob store: the bucket does not answer; large completes get 503 until it does", "bucket", st.Bucket(), "err", err)
	} else {
		log.Info("blob store: stored bodies over the threshold go to the bucket", "bucket", st.Bucket(), "threshold_bytes", cfg.blobThreshold, "max_stored_bytes", cfg.maxStoredBytes)
	}
	swept := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemsvc_blob_swept_total",
		Help: "Objects of the blob store removed by the sweeper, past their records' expiry.",
	})
	reg.MustRegister(swept)
	go st.Sweeper(ctx, sweepInterval, func(n int, err error) {
		swept.Add(float64(n))
		if err != nil && ctx.Err() == nil {
			log.Warn("blob store: sweep", "removed", n, "err", err)
		}
	})
	threshold := cfg.blobThreshold
	if threshold == 0 {
		threshold = -1 // every non-empty body
	}
	return &handlers.BlobConfig{Store: st, Threshold: threshold, MaxStoredBytes: cfg.maxStoredBytes, SpoolDir: cfg.blobSpoolDir}, nil
}
