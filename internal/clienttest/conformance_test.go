// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/conformance"
)

// The Go middleware behaves as every entry point must (conformance/cases.json).
func TestMiddlewareConformance(t *testing.T) {
	svc := startIdemsvc(t, nil)
	app := &conformance.App{}
	up := httptest.NewServer(idem.Middleware(newClient(t, svc.URL), idem.MiddlewareOptions{})(app))
	t.Cleanup(up.Close)
	down := httptest.NewServer(idem.Middleware(newClient(t, "http://"+closedAddr(t)), idem.MiddlewareOptions{})(app))
	t.Cleanup(down.Close)
	scoped := httptest.NewServer(idem.Middleware(newClient(t, svc.URL), idem.MiddlewareOptions{
		Scope: func(r *http.Request) string { return r.Header.Get("X-User") },
	})(app))
	t.Cleanup(scoped.Close)
	conformance.Run(t, conformance.Target{URL: up.URL, DownURL: down.URL, ScopedURL: scoped.URL, Runs: app.Runs})
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
