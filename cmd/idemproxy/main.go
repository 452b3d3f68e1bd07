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
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemsvc/idemsvc/internal/buildinfo"
)

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

// Server timeouts. The upstream may take its time, so writes have no bound
// of their own; a request's lease is kept alive while it runs.
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 30 * time.Second
)

// run serves until ctx ends, then lets requests in flight finish. Logs are
// JSON lines on logOut.
func run(ctx context.Context, args, env []string, logOut io.Writer) error {
	cfg, err := parseConfig(args, env)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logOut, nil))
	version, revision, goVersion := buildinfo.Get()
	log.Info("idemproxy starting", "version", version, "revision", revision, "goversion", goVersion)
	proxy, err := newProxy(cfg, log)
	if err != nil {
		return err
	}
	servers := []*http.Server{{Addr: cfg.listen, Handler: proxy.handler()}}
	if cfg.adminListen != "" {
		servers = append(servers, &http.Server{Addr: cfg.adminListen, Handler: proxy.admin()})
	}
	errs := make(chan error, len(servers))
	for _, srv := range servers {
		srv.ReadHeaderTimeout, srv.IdleTimeout = readHeaderTimeout, idleTimeout
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return err
		}
		log.Info("idemproxy serving", "addr", l.Addr().String(), "upstream", cfg.upstream.String(), "idemsvc", cfg.idemsvcURL)
		go func() { errs <- srv.Serve(l) }()
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
