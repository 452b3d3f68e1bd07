// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// Each request gets a server span that continues the caller's traceparent,
// named by its route, with a child span per store call naming the script,
// the tenant and the outcome; no span carries a key, a token, an owner, a
// fingerprint or a body.
func TestE2ETracing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		recorder := tracetest.NewSpanRecorder()
		provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
		e := start(t, handlers.Config{Store: b.Open(t), Keyring: tenantsKeyring(t), Tracer: provider})

		const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		key, owner, fingerprint, body := idemtest.Unique("secret-key"), "owner-secret", "fp-secret", "body-secret"
		traced := func(method, path, payload string) (*http.Response, []byte) {
			return e.raw(t, method, path, "application/json", strings.NewReader(payload),
				"Authorization", "Bearer "+keyPayments, "traceparent", "00-"+traceID+"-"+parentID+"-01")
		}
		resp, raw := traced(http.MethodPost, "/v1/begin", `{"key":"`+key+`","owner":"`+owner+`","fingerprint":"`+fingerprint+`"}`)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("begin = %d %s", resp.StatusCode, raw)
		}
		token := strings.Split(strings.Split(string(raw), `"lease_token":"`)[1], `"`)[0]
		if resp, raw := traced(http.MethodPost, "/v1/complete", `{"key":"`+key+`","lease_token":"`+token+`","response":{"body":"`+body+`"}}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("complete = %d %s", resp.StatusCode, raw)
		}
		if resp, _ := traced(http.MethodGet, "/v1/status?key="+key, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("status = %d", resp.StatusCode)
		}

		spans := recorder.Ended()
		byName := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range spans {
			byName[s.Name()] = s
			if s.SpanContext().TraceID().String() != traceID {
				t.Errorf("span %s is in trace %s, not the caller's", s.Name(), s.SpanContext().TraceID())
			}
			for _, a := range s.Attributes() {
				for _, secret := range []string{key, token, owner, fingerprint, body} {
					if strings.Contains(a.Value.Emit(), secret) {
						t.Errorf("span %s carries %s=%s", s.Name(), a.Key, a.Value.Emit())
					}
				}
			}
		}
		for name, want := range map[string]map[string]string{
			"POST /v1/begin":     {"http.route": "/v1/begin", "http.response.status_code": "201", "idemsvc.tenant": "payments", "idemsvc.outcome": "acquired"},
			"POST /v1/complete":  {"http.response.status_code": "200", "idemsvc.tenant": "payments"},
			"GET /v1/status":     {"http.response.status_code": "200"},
			"store begin.lua":    {"idemsvc.script": "begin.lua", "idemsvc.tenant": "payments", "idemsvc.outcome": "acquired"},
			"store complete.lua": {"idemsvc.outcome": "completed"},
			"store status.lua":   {"idemsvc.outcome": "found"},
		} {
			s, ok := byName[name]
			if !ok {
				t.Errorf("no span %q among %d", name, len(spans))
				continue
			}
			got := map[string]string{}
			for _, a := range s.Attributes() {
				got[string(a.Key)] = a.Value.Emit()
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("span %q: %s = %q, want %q", name, k, got[k], v)
				}
			}
		}
		if server, store := byName["POST /v1/begin"], byName["store begin.lua"]; server != nil && store != nil {
			if server.Parent().SpanID().String() != parentID || server.SpanKind() != trace.SpanKindServer {
				t.Errorf("the begin span's parent is %s, want the caller's %s", server.Parent().SpanID(), parentID)
			}
			if store.Parent().SpanID() != server.SpanContext().SpanID() {
				t.Errorf("the store span is not the request span's child")
			}
		}
	})
}

// A caller's trace goes on into idemsvc through the Go SDK when its HTTP
// client is instrumented, as docs/operating.md shows.
func TestE2ETracingThroughTheSDK(t *testing.T) {
	t.Parallel()
	recorder := tracetest.NewSpanRecorder()
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
		Tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))})
	caller := sdktrace.NewTracerProvider()
	ctx, span := caller.Tracer("caller").Start(t.Context(), "charge")
	instrumented := &http.Client{Transport: otelhttp.NewTransport(e.http.Transport,
		otelhttp.WithTracerProvider(caller), otelhttp.WithPropagators(propagation.TraceContext{}))}
	client, err := idem.New(e.url, idem.WithHTTP(instrumented))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Begin(ctx, idem.BeginParams{Key: idemtest.Unique("sdk-traced")}); err != nil {
		t.Fatal(err)
	}
	span.End()
	for _, s := range recorder.Ended() {
		if s.Name() == "POST /v1/begin" {
			if s.SpanContext().TraceID() != span.SpanContext().TraceID() {
				t.Errorf("idemsvc's span is in trace %s, not the caller's %s", s.SpanContext().TraceID(), span.SpanContext().TraceID())
			}
			return
		}
	}
	t.Errorf("no span for the begin among %d", len(recorder.Ended()))
}
