package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheck asks the idemproxy that the same configuration describes, on
// this host, whether it serves (GET /healthz), for a container's
// HEALTHCHECK: distroless images have no shell or curl. It returns the
// process's exit status: 0 when it answered 200.
func healthcheck(args, env []string, out io.Writer) int {
	cfg, err := parseConfig(args, env)
	if err != nil {
		fmt.Fprintf(out, "idemproxy healthcheck: %v\n", err)
		return 1
	}
	addr := cfg.listen
	if cfg.adminListen != "" {
		addr = cfg.adminListen
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintf(out, "idemproxy healthcheck: listen address %q: %v\n", addr, err)
		return 1
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		fmt.Fprintf(out, "idemproxy healthcheck: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(out, "idemproxy healthcheck: /healthz answered %d\n", resp.StatusCode)
		return 1
	}
	return 0
}
