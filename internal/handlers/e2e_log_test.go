// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/logbuf"
)

// logLines is a log output that tests read while the service writes.
type logLines struct{ logbuf.Buffer }

// find returns the request line with the given request id.
func (l *logLines) find(t *testing.T, id string) map[string]any {
	t.Helper()
	text := l.String()
	for _, line := range strings.Split(text, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["request_id"] == id {
			return m
		}
	}
	t.Fatalf("no log line for request %s:\n%s", id, text)
	return nil
}

// A request's log line names the client's address, the tenant acted for
// and, when another key acted (an admin for a tenant, or a key refused for
// the tenant it named), that key's own tenant; never the key.
func TestE2EAuditLog(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
		Keyring: tenantsKeyring(t), Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	for _, tt := range []struct {
		id, apiKey, body  string
		status            int
		tenant, principal any
	}{
		{"admin-for-payments", keyOps, `{"key":"audit","tenant":"payments"}`, http.StatusCreated, "payments", "ops"},
		{"own", keyPayments, `{"key":"audit-2"}`, http.StatusCreated, "payments", nil},
		{"refused", keyPayments, `{"key":"audit-3","tenant":"billing"}`, http.StatusForbidden, "billing", "payments"},
		{"no-key", "wrong", `{"key":"audit-4"}`, http.StatusUnauthorized, nil, nil},
	} {
		resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(tt.body),
			"Authorization", "Bearer "+tt.apiKey, "X-Request-Id", tt.id)
		if resp.StatusCode != tt.status {
			t.Fatalf("%s: %d", tt.id, resp.StatusCode)
		}
		line := logs.find(t, tt.id)
		if line["client"] != "127.0.0.1" || line["peer"] != nil || line["tenant"] != tt.tenant || line["principal"] != tt.principal {
			t.Errorf("%s: client %v, tenant %v, principal %v; want 127.0.0.1, %v, %v", tt.id, line["client"], line["tenant"], line["principal"], tt.tenant, tt.principal)
		}
		for _, v := range line {
			if s, ok := v.(string); ok && (strings.Contains(s, tt.apiKey) || strings.Contains(s, "audit")) {
				t.Errorf("%s: the log line holds %q", tt.id, s)
			}
		}
	}
	// Who freed a key: the line of DELETE /v1/keys names the tenant freed
	// for and, for an admin acting for it, the admin's tenant; a tenant
	// freeing its own key is named as the tenant alone.
	for _, tt := range []struct {
		id, apiKey, query string
		principal         any
	}{
		{"admin-frees", keyOps, "key=audit&tenant=payments", "ops"},
		{"own-frees", keyPayments, "key=audit-2", nil},
	} {
		resp, _ := e.raw(t, http.MethodDelete, "/v1/keys?"+tt.query, "", nil, "Authorization", "Bearer "+tt.apiKey, "X-Request-Id", tt.id)
		line := logs.find(t, tt.id)
		if resp.StatusCode != http.StatusNoContent || line["method"] != http.MethodDelete || line["route"] != "/v1/keys" ||
			line["outcome"] != "deleted" || line["tenant"] != "payments" || line["principal"] != tt.principal || line["client"] != "127.0.0.1" {
			t.Errorf("%s: %d, log line %v; want DELETE /v1/keys deleted, tenant payments, principal %v", tt.id, resp.StatusCode, line, tt.principal)
		}
	}
	// A 401 names the tenant its query names.
	resp, _ := e.raw(t, http.MethodGet, "/v1/status?key=audit&tenant=payments", "", nil, "Authorization", "Bearer wrong", "X-Request-Id", "no-key-status")
	if line := logs.find(t, "no-key-status"); resp.StatusCode != http.StatusUnauthorized || line["tenant"] != "payments" {
		t.Errorf("401 with ?tenant=payments: %d, tenant %v", resp.StatusCode, line["tenant"])
	}
}

// X-Forwarded-For names the client in the log only when the connection
// comes from a trusted proxy; the proxy is then the peer.
func TestE2EForwardedFor(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		trusted      []netip.Prefix
		forwarded    []string
		client, peer any
	}{
		{"no trusted proxies", nil, []string{"203.0.113.9"}, "127.0.0.1", nil},
		{"a trusted proxy", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9", "127.0.0.1"},
		{"a chain of trusted proxies", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")},
			[]string{"203.0.113.9, 10.1.2.3", "10.0.0.7"}, "203.0.113.9", "127.0.0.1"},
		{"a malformed hop", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []string{"203.0.113.9, junk"}, "127.0.0.1", nil},
		{"another proxy", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []string{"203.0.113.9"}, "127.0.0.1", nil},
	} {
		logs := &logLines{}
		e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
			Logger: slog.New(slog.NewJSONHandler(logs, nil)), TrustedProxies: tt.trusted})
		headers := []string{"X-Request-Id", "xff"}
		for _, f := range tt.forwarded {
			headers = append(headers, "X-Forwarded-For", f)
		}
		resp, _ := e.raw(t, http.MethodGet, "/healthz", "", nil, headers...)
		resp.Body.Close()
		if line := logs.find(t, "xff"); line["client"] != tt.client || line["peer"] != tt.peer {
			t.Errorf("%s: client %v, peer %v; want %v, %v", tt.name, line["client"], line["peer"], tt.client, tt.peer)
		}
	}
}

// Begin latency is a histogram per outcome, so that a wait or a 503 does
// not blur acquisitions and replays.
func TestE2EBeginDurationByOutcome(t *testing.T) {
	t.Parallel()
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits())})
	c := e.as(t, "")
	key := idemtest.Unique("histogram")
	l := c.acquire(idem.BeginRequest{Key: key})
	if r := c.begin(idem.BeginRequest{Key: key, Owner: ptr("another"), WaitMs: ptr[int64](50)}); r.StatusCode() != http.StatusConflict {
		t.Fatalf("begin while in progress: %d %s", r.StatusCode(), r.Body)
	}
	c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken})
	c.begin(idem.BeginRequest{Key: key})
	for outcome, want := range map[string]float64{"acquired": 1, "in-progress": 1, "replayed-completed": 1} {
		if got := e.labelled(t, "idemsvc_begin_duration_seconds_count", `outcome="`+outcome+`"`); got != want {
			t.Errorf("begins observed as %s: %v, want %v", outcome, got, want)
		}
	}
	// The waited begin took its 50 ms: it is not in the acquisitions' fast buckets.
	if got := e.labelled(t, "idemsvc_begin_duration_seconds_bucket", `outcome="in-progress",le="0.025"`); got != 0 {
		t.Errorf("a begin that waited 50 ms counted under 25 ms: %v", got)
	}
}

// A waiting begin whose client left is logged at info as client-gone, not
// as the error its end in the store came to.
func TestE2EClientGoneIsLoggedAtInfo(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"gone"}`)); resp.StatusCode != http.StatusCreated {
		t.Fatalf("begin: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/begin", strings.NewReader(`{"key":"gone","wait_ms":5000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "client-gone")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the waiting begin answered %d, want its client to have left", resp.StatusCode)
	}
	var line map[string]any
	for deadline := time.Now().Add(5 * time.Second); line == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(logs.String(), `"request_id":"client-gone"`) {
			line = logs.find(t, "client-gone")
		}
	}
	if line == nil || line["level"] != "INFO" || line["outcome"] != "client-gone" || line["status"] != float64(499) || line["error"] != nil {
		t.Errorf("log line %v, want INFO, outcome client-gone, status 499, no error", line)
	}
}

// A key of 64 hex characters pasted into the tenants file where its digest
// belongs gets 401, and the log says so once, naming the tenant and the
// entry, with what belongs there: never the key.
func TestE2EPastedKeyIsReported(t *testing.T) {
	t.Parallel()
	pasted := strings.Repeat("0a1b2c3d4e5f6789", 4)
	keyring, err := auth.Parse([]byte("tenants:\n  - name: payments\n    api_key_sha256: [\"" + auth.Digest(keyPayments) + "\", \"" + pasted + "\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
		Keyring: keyring, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	for range 3 {
		resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"pasted"}`), "Authorization", "Bearer "+pasted)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("the pasted key: %d, want 401", resp.StatusCode)
		}
	}
	// Another wrong key is not reported.
	if resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"pasted"}`), "Authorization", "Bearer "+strings.Repeat("f", 64)); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key: %d, want 401", resp.StatusCode)
	}
	out := logs.String()
	var reports []map[string]any
	for _, line := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["entry"] != nil {
			reports = append(reports, m)
		}
	}
	if len(reports) != 1 {
		t.Fatalf("%d reports, want 1:\n%s", len(reports), out)
	}
	r := reports[0]
	if r["level"] != "ERROR" || r["tenant"] != "payments" || r["entry"] != "api_key_sha256[1]" ||
		!strings.Contains(fmt.Sprint(r["hint"]), "SHA-256 digest") {
		t.Errorf("report %v: want an error naming payments' api_key_sha256[1], with a hint", r)
	}
	if strings.Contains(out, pasted) {
		t.Errorf("the log holds the key:\n%s", out)
	}
}

// TestE2EAccessLog: AccessLogErrors logs the requests answered 400 and
// above only, AccessLogOff none, AccessLogAll every one.
func TestE2EAccessLog(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode        handlers.AccessLog
		ok, refused bool // logged: a 201, a 400
	}{
		{handlers.AccessLogAll, true, true},
		{handlers.AccessLogErrors, false, true},
		{handlers.AccessLogOff, false, false},
	} {
		logs := &logLines{}
		e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
			Logger: slog.New(slog.NewJSONHandler(logs, nil)), AccessLog: tt.mode})
		for _, r := range []struct {
			id, body string
			status   int
			logged   bool
		}{
			{"ok", `{"key":"access-log"}`, http.StatusCreated, tt.ok},
			{"refused", `{"key":""}`, http.StatusBadRequest, tt.refused},
		} {
			resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(r.body), "X-Request-Id", r.id)
			if resp.StatusCode != r.status {
				t.Fatalf("%v %s: %d, want %d", tt.mode, r.id, resp.StatusCode, r.status)
			}
			got := strings.Contains(logs.String(), `"request_id":"`+r.id+`"`)
			if got != r.logged {
				t.Errorf("access log %v, a %d: logged %v, want %v", tt.mode, r.status, got, r.logged)
			}
		}
	}
}
