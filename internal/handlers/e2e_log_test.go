package handlers_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// logLines is a log output that tests read while the service writes.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// find returns the request line with the given request id.
func (l *logLines) find(t *testing.T, id string) map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["request_id"] == id {
			return m
		}
	}
	t.Fatalf("no log line for request %s:\n%s", id, l.buf.String())
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
		{"refused", keyPayments, `{"key":"audit-3","tenant":"billing"}`, http.StatusForbidden, nil, "payments"},
		{"no-key", "wrong", `{"key":"audit-4"}`, http.StatusUnauthorized, nil, nil},
	} {
		resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(tt.body),
			"Authorization", "Bearer "+tt.apiKey, "X-Request-Id", tt.id)
		if resp.StatusCode != tt.status {
			t.Fatalf("%s: %d", tt.id, resp.StatusCode)
		}
		line := logs.find(t, tt.id)
		if line["client"] != "127.0.0.1" || line["tenant"] != tt.tenant || line["principal"] != tt.principal {
			t.Errorf("%s: client %v, tenant %v, principal %v; want 127.0.0.1, %v, %v", tt.id, line["client"], line["tenant"], line["principal"], tt.tenant, tt.principal)
		}
		for _, v := range line {
			if s, ok := v.(string); ok && (strings.Contains(s, tt.apiKey) || strings.Contains(s, "audit")) {
				t.Errorf("%s: the log line holds %q", tt.id, s)
			}
		}
	}
}
