// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// benchService is the service as shipped: authentication on, JSON request
// logs (to io.Discard, to count their formatting but not a terminal's
// speed) and metrics.
func benchService(b *testing.B, store statemachine.Store, tracer ...trace.TracerProvider) *handlers.Service {
	keyring := idemtest.Keyring(b, idemtest.Tenant{Name: "bench", Key: "bench-key"})
	cfg := handlers.Config{
		Store:   store,
		Keyring: keyring,
		Logger:  slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	if len(tracer) > 0 {
		cfg.Tracer = tracer[0]
	}
	return handlers.New(cfg)
}

var benchRun atomic.Int64

// BenchmarkServeBegin is the handler's own cost of a begin on a new key:
// in process, on the memory store, no network.
func BenchmarkServeBegin(b *testing.B) {
	benchServeBegin(b, benchService(b, statemachine.NewMemoryStore(statemachine.DefaultLimits())))
}

// BenchmarkServeBeginTraced is BenchmarkServeBegin with tracing on: the
// OpenTelemetry SDK's batching span processor, into an exporter that drops
// the spans (so the network is not counted).
func BenchmarkServeBeginTraced(b *testing.B) {
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	benchServeBegin(b, benchService(b, statemachine.NewMemoryStore(statemachine.DefaultLimits()), provider))
}

func benchServeBegin(b *testing.B, svc *handlers.Service) {
	prefix := fmt.Sprintf("serve-%d-", benchRun.Add(1))
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := `{"key":"` + prefix + strconv.FormatInt(n.Add(1), 10) + `"}`
			req := httptest.NewRequest(http.MethodPost, "/v1/begin", bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench-key")
			w := httptest.NewRecorder()
			svc.ServeHTTP(w, req)
			if w.Code != http.StatusCreated {
				b.Fatalf("begin: %d %s", w.Code, w.Body)
			}
		}
	})
}

// BenchmarkServeCycle is the handler's own cost of a full cycle, begin on
// a new key then complete with the lease token and a small JSON response:
// in process, on the memory store, no network. One op is both requests.
func BenchmarkServeCycle(b *testing.B) {
	svc := benchService(b, statemachine.NewMemoryStore(statemachine.DefaultLimits()))
	prefix := fmt.Sprintf("cycle-%d-", benchRun.Add(1))
	var n atomic.Int64
	serve := func(path, body string, want int) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer bench-key")
		w := httptest.NewRecorder()
		svc.ServeHTTP(w, req)
		if w.Code != want {
			b.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
		return w
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := prefix + strconv.FormatInt(n.Add(1), 10)
			w := serve("/v1/begin", `{"key":"`+key+`"}`, http.StatusCreated)
			var lease struct {
				Token string `json:"lease_token"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &lease); err != nil {
				b.Fatal(err)
			}
			serve("/v1/complete", `{"key":"`+key+`","lease_token":"`+lease.Token+
				`","response":{"status_code":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ch_1\"}"}}`,
				http.StatusOK)
		}
	})
}

// BenchmarkServeReplay is the handler's own cost of a begin on a completed
// key, which replays a stored JSON response of 1 KiB: in process, on the
// memory store, no network.
func BenchmarkServeReplay(b *testing.B) {
	store := statemachine.NewMemoryStore(statemachine.DefaultLimits())
	benchServeReplay(b, store, benchService(b, store))
}

// BenchmarkServeReplayLimiter is BenchmarkServeReplay with the limiter
// main always has, so with the read accounting: the tenant has the
// largest read budget, so that none is refused.
func BenchmarkServeReplayLimiter(b *testing.B) {
	store := statemachine.NewMemoryStore(statemachine.DefaultLimits())
	limiter := quota.NewMemory(quota.Options{})
	b.Cleanup(limiter.Close)
	svc := handlers.New(handlers.Config{
		Store:   store,
		Keyring: idemtest.Keyring(b, idemtest.Tenant{Name: "bench", Key: "bench-key", Limits: "{read_bytes_per_s: 1099511627776}"}),
		Logger:  slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Limiter: limiter,
	})
	benchServeReplay(b, store, svc)
}

func benchServeReplay(b *testing.B, store statemachine.Store, svc *handlers.Service) {
	key := fmt.Sprintf("replay-%d", benchRun.Add(1))
	res, err := store.Begin(b.Context(), "bench", statemachine.BeginRequest{Key: key})
	if err != nil {
		b.Fatal(err)
	}
	stored := `{"id":"ch_1","note":"` + strings.Repeat("x", 1000) + `"}`
	if _, err := store.Complete(b.Context(), "bench", statemachine.CompleteRequest{Key: key, Token: res.Lease.Token, Response: statemachine.Response{
		StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: stored,
	}}); err != nil {
		b.Fatal(err)
	}
	replay := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/begin", strings.NewReader(`{"key":"`+key+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer bench-key")
		w := httptest.NewRecorder()
		svc.ServeHTTP(w, req)
		return w
	}
	first := replay()
	if want, _ := json.Marshal(stored); first.Code != http.StatusOK || !bytes.Contains(first.Body.Bytes(), want) {
		b.Fatalf("replay: %d %s", first.Code, first.Body)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if w := replay(); w.Code != http.StatusOK || w.Body.Len() != first.Body.Len() {
				b.Fatalf("replay: %d %s", w.Code, w.Body)
			}
		}
	})
}

// BenchmarkHTTPBeginRedis is a begin on a new key over loopback HTTP to a
// standalone Redis, 64 callers in parallel.
func BenchmarkHTTPBeginRedis(b *testing.B) {
	rdb := redistest.SharedServer(b).Client(b)
	svc := benchService(b, redisstore.New(rdb, redisstore.Options{}))
	srv := httptest.NewServer(svc)
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 128
	prefix := fmt.Sprintf("http-%d-", benchRun.Add(1))
	var n atomic.Int64
	b.SetParallelism(32) // 64 callers on 2 cores
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := `{"key":"` + prefix + strconv.FormatInt(n.Add(1), 10) + `"}`
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/begin", bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench-key")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Fatalf("begin: %d", resp.StatusCode)
			}
		}
	})
}
