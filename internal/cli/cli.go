// SPDX-License-Identifier: Apache-2.0

// Package cli holds what idemsvc's commands (idemsvc, idemproxy) share
// around their flags and their container health check.
package cli

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// List splits a comma-separated setting, dropping blanks.
func List(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Usage is fs's flags under a first line, for an error or -h.
func Usage(fs *flag.FlagSet, first string) string {
	var b strings.Builder
	b.WriteString(first + "\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}

// CheckHealth asks the server listening at listen on this host for
// GET /healthz, over HTTPS when tlsConfig is given, and says why it is not
// healthy (nil: it answered 200). An unspecified host (":8080",
// "0.0.0.0:8080") is asked on 127.0.0.1.
func CheckHealth(listen string, tlsConfig *tls.Config) error {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", listen, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	transport := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConfig}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthz answered %d", resp.StatusCode)
	}
	return nil
}
