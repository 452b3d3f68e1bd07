// SPDX-License-Identifier: Apache-2.0

// Command idemproxy makes any HTTP service idempotent without code, as a
// sidecar or gateway in front of it, per the Idempotency-Key header draft
// (draft-ietf-httpapi-idempotency-key-header). A request on a configured
// method (POST, PATCH) that carries the key header reaches the upstream at
// most once per key: idemsvc holds the key, and every duplicate gets the
// upstream's stored answer byte for byte, with "Idempotent-Replayed: true".
// Requests without a key, or on other methods, pass through untouched.
//
// It is the Go SDK's middleware (idem.Middleware) in front of
// httputil.ReverseProxy, so it behaves exactly as that middleware does.
// Configuration comes from environment variables or flags of the same
// names; run it with -h for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemsvc/idemsvc/internal/buildinfo"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/jsonlog"
)

// limitMemory bounds the runtime's heap by the budget of bodies in flight
// (tests that run several servers in one process turn it off).
var limitMemory = httpserve.LimitMemory

func main() {
	if buildinfo.IsVersionFlag(os.Args[1:]) {
		fmt.Println(buildinfo.Line("idemproxy"))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:], os.Environ(), os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Environ(), os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy:", err)
		os.Exit(1)
	}
}

// Server timeouts. A keyed request may wait for a duplicate (wait-ms) and
// upstream-timeout-ms for the upstream, so its answer gets those, its
// read timeout and writeMargin (for the calls to idemsvc) to be written;
// idle connections and request heads are bounded as idemsvc bounds them
// (internal/httpserve).
const (
	writeMargin     = 15 * time.Second
	shutdownTimeout = 30 * time.Second
)

// run serves until ctx ends, then lets requests in flight finish. Logs are
// JSON lines on logOut.
func run(ctx context.Context, args, env []string, logOut io.Writer) error {
	cfg, err := parseConfig(args, env)
	if err != nil {
		return err
	}
	limitMemory(cfg.maxBodyBytesInFlight, env)
	log := slog.New(jsonlog.NewHandler(logOut, slog.LevelInfo))
	version, revision, goVersion := buildinfo.Get()
	log.Info("idemproxy starting", "version", version, "revision", revision, "goversion", goVersion)
	proxy, err := newProxy(cfg, log)
	if err != nil {
		return err
	}
	servers, err := listen(cfg, proxy, log)
	if err != nil {
		return err
	}
	errs := make(chan error, len(servers))
	for _, srv := range servers {
		log.Info("idemproxy serving", "addr", srv.Addr().String(), "upstream", cfg.upstream.String(), "idemsvc", cfg.idemsvcURL)
		go func() { errs <- srv.Serve() }()
	}
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	log.Info("idemproxy shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			return err
		}
	}
	return nil
}

// listen opens idemproxy's listener, and the admin one if configured, with
// the edge idemsvc has (internal/httpserve).
func listen(cfg config, proxy *proxy, log *slog.Logger) ([]*httpserve.Server, error) {
	edge := httpserve.Config{
		Addr:           cfg.listen,
		MaxConnections: cfg.maxConnections,
		// Keyed requests get their read and write deadlines per request
		// (proxy.budgeted); requests passed through, none.
		ReadTimeout:  -1,
		Log:          log,
		Registry:     proxy.registry,
		MetricPrefix: "idemproxy",
	}
	public, err := httpserve.Listen(edge, proxy.handler())
	if err != nil {
		return nil, err
	}
	servers := []*httpserve.Server{public}
	if cfg.adminListen != "" {
		admin := edge
		admin.Addr, admin.Registry = cfg.adminListen, nil
		srv, err := httpserve.Listen(admin, proxy.admin())
		if err != nil {
			_ = public.Shutdown(context.Background())
			return nil, err
		}
		servers = append(servers, srv)
	}
	return servers, nil
}
