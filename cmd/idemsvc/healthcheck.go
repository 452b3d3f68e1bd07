package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// healthcheck asks the idemsvc listening where env's IDEMSVC_LISTEN (or
// --listen in args) says, on this host, whether it is alive (GET /healthz),
// for a container's HEALTHCHECK: distroless images have no shell or curl.
// It returns the process's exit status: 0 when it answered 200.
func healthcheck(args, env []string, out io.Writer) int {
	listen := ":8080"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "IDEMSVC_LISTEN="); ok && v != "" {
			listen = v
		}
	}
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			listen = v
		} else if a == "--listen" && i+1 < len(args) {
			listen = args[i+1]
		}
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		fmt.Fprintf(out, "idemsvc healthcheck: listen address %q: %v\n", listen, err)
		return 1
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(out, "idemsvc healthcheck: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(out, "idemsvc healthcheck: /healthz answered %d\n", resp.StatusCode)
		return 1
	}
	return 0
}
