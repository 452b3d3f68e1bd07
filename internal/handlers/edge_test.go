// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The answers written before any handler runs (internal/httpserve) name
// their problem kinds as the table here does, with its statuses (431 for
// headers over the limit aside).
func TestConnectionProblemKindsAgree(t *testing.T) {
	types := handlers.ProblemTypes()
	for _, status := range []int{400, 431, 501, 503} {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(httpserve.ConnectionProblem(status, "detail"))), nil)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Type   string
			Title  string
			Status int
		}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		// too-large is 413 but for headers, which net/http answers 431.
		if want, ok := types[p.Type]; !ok || (want != p.Status && status != 431) || p.Status != resp.StatusCode || p.Title == "" || !resp.Close {
			t.Errorf("%d: %d %+v; the table has %q as %d", status, resp.StatusCode, p, p.Type, want)
		}
		if status == 503 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
	}
}

// A request is authenticated before its body is read: calls without a
// valid key are answered 401 while their declared bodies are still coming,
// take nothing from the budget of bodies in flight, and so cannot keep an
// authenticated complete out of it.
func TestAuthenticationBeforeBody(t *testing.T) {
	t.Parallel()
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: tenantsKeyring(t),
		MaxBodyBytes: 1 << 20, MaxBodyBytesInFlight: 6 << 20})
	pad := strings.Repeat("x", 900<<10)
	for range 6 { // enough to fill the budget, were their bodies read
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			_, _ = io.WriteString(conn, "POST /v1/complete HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"+
				"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"+pad)
		}()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a call with a wrong key, its body still coming: %v %v, want 401 at once", resp, err)
		}
		resp.Body.Close()
	}

	begin, out := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"auth-first"}`), "Authorization", "Bearer "+keyPayments)
	var lease struct {
		LeaseToken string `json:"lease_token"`
	}
	if begin.StatusCode != http.StatusCreated || json.Unmarshal(out, &lease) != nil {
		t.Fatalf("begin: %d %s", begin.StatusCode, out)
	}
	complete := `{"key":"auth-first","lease_token":"` + lease.LeaseToken + `","response":{"body":"` + pad + `"}}`
	if resp, out := e.raw(t, http.MethodPost, "/v1/complete", "application/json", strings.NewReader(complete), "Authorization", "Bearer "+keyPayments); resp.StatusCode != http.StatusOK {
		t.Errorf("an authenticated complete of %d bytes: %d %.200s, want 200", len(complete), resp.StatusCode, out)
	}
}

// One tenant whose bodies stall holds at most its share of the budget of
// bodies in flight, and another tenant's complete still gets in: it may
// use the part kept for outcomes, which no begin of anyone takes.
func TestStalledTenantLeavesRoomForCompletes(t *testing.T) {
	t.Parallel()
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: tenantsKeyring(t),
		MaxBodyBytes: 1 << 20, MaxBodyBytesInFlight: 8 << 20})
	pad := strings.Repeat("x", 900<<10)
	stop := make(chan struct{})
	defer close(stop)
	for range 4 { // enough to fill the whole budget, were a tenant's bodies not held to its half
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		go func() {
			_, _ = io.WriteString(conn, "POST /v1/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+keyBilling+"\r\n"+
				"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"+pad)
			for { // a byte now and then: the body is stalled, but never cut
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
					if _, err := conn.Write([]byte("x")); err != nil {
						return
					}
				}
			}
		}()
	}
	// One body of 1 MiB holds 2 MiB (it counts twice), 3 MiB while its
	// buffer grows: the tenant's half has room for one and part of another.
	const half, one = 4 << 20, 2 << 20
	deadline := time.Now().Add(10 * time.Second)
	for e.metricValue(t, "idemsvc_body_bytes_in_flight") < one && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if held := e.metricValue(t, "idemsvc_body_bytes_in_flight"); held < one || held > half {
		t.Fatalf("the stalled bodies hold %v bytes, want at least one body's %d, up to the tenant's half, %d", held, one, half)
	}

	begin, out := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"beside-a-hog"}`), "Authorization", "Bearer "+keyPayments)
	var lease struct {
		LeaseToken string `json:"lease_token"`
	}
	if begin.StatusCode != http.StatusCreated || json.Unmarshal(out, &lease) != nil {
		t.Fatalf("another tenant's begin: %d %s", begin.StatusCode, out)
	}
	complete := `{"key":"beside-a-hog","lease_token":"` + lease.LeaseToken + `","response":{"body":"` + pad + `"}}`
	if resp, out := e.raw(t, http.MethodPost, "/v1/complete", "application/json", strings.NewReader(complete), "Authorization", "Bearer "+keyPayments); resp.StatusCode != http.StatusOK {
		t.Errorf("another tenant's complete of %d bytes: %d %.200s, want 200", len(complete), resp.StatusCode, out)
	}
	if held := e.metricValue(t, "idemsvc_body_bytes_in_flight"); held < one {
		t.Errorf("the stalled bodies were let go (%v bytes held) before the complete was checked", held)
	}
}
