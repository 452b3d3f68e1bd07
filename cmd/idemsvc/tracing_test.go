// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes the protobuf
// export requests the exporter sends and keeps each span's name and trace.
type otlpReceiver struct {
	mu    sync.Mutex
	spans map[string]string // name → trace id
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collector.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				o.spans[s.Name] = hex.EncodeToString(s.TraceId)
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// TestTracesReachAnOTLPReceiver: with OTEL_EXPORTER_OTLP_ENDPOINT set, a
// request's span and its store call's span arrive at the receiver over
// OTLP, in the caller's trace, by the time idemsvc has stopped.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	receiver := &otlpReceiver{spans: map[string]string{}}
	srv := httptest.NewServer(receiver)
	t.Cleanup(srv.Close)
	in := start(t, nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, _ := http.NewRequest(http.MethodPost, in.url+"/v1/begin", strings.NewReader(`{"key":"traced"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("begin = %d", resp.StatusCode)
	}
	in.stop()
	if err := <-in.done; err != nil {
		t.Fatal(err)
	}
	in.done <- nil // for the cleanup's receive

	receiver.mu.Lock()
	defer receiver.mu.Unlock()
	for _, name := range []string{"POST /v1/begin", "store begin.lua"} {
		if got := receiver.spans[name]; got != traceID {
			t.Errorf("span %q: trace %q, want %s; received %v", name, got, traceID, receiver.spans)
		}
	}
}
