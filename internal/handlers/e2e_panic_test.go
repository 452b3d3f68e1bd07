// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// panickingStore is the memory store, but its Begin panics with value for
// the key "panic": a fault that no handler expects.
type panickingStore struct {
	statemachine.Store
	value any
}

func (s panickingStore) Begin(ctx context.Context, tenant string, req statemachine.BeginRequest) (statemachine.BeginResult, error) {
	if req.Key == "panic" {
		panic(s.value)
	}
	return s.Store.Begin(ctx, tenant, req)
}

// A handler's panic is answered with a 500 problem of kind internal, which
// says nothing of the panic, and logged at error with its value and stack;
// the request's own line counts it as a 500 too, and the server goes on
// serving.
func TestE2EPanicIsAProblem(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	store := panickingStore{statemachine.NewMemoryStore(statemachine.DefaultLimits()), fmt.Errorf("store bug: secret-%d", 42)}
	e := start(t, handlers.Config{Store: store, Logger: slog.New(slog.NewJSONHandler(logs, nil))})

	resp, body := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"panic"}`), "X-Request-Id", "panicked")
	p := requireProblem(t, resp, body, http.StatusInternalServerError, "internal")
	if strings.Contains(string(body), "secret") || strings.Contains(string(body), "store bug") {
		t.Errorf("the problem tells of the panic: %s", body)
	}
	if p.Detail == "" {
		t.Errorf("no detail: %s", body)
	}

	lines := map[string]map[string]any{} // by msg
	for _, line := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["request_id"] == "panicked" {
			lines[m["msg"].(string)] = m
		}
	}
	panicLine, requestLine := lines["panic"], lines["request"]
	if panicLine == nil || requestLine == nil {
		t.Fatalf("no panic line or no request line in the log:\n%s", logs.String())
	}
	stack, _ := panicLine["stack"].(string)
	if panicLine["level"] != "ERROR" || panicLine["request_id"] != "panicked" ||
		panicLine["panic"] != "store bug: secret-42" || !strings.Contains(stack, "panickingStore.Begin") {
		t.Errorf("panic line: %v", panicLine)
	}
	if requestLine["level"] != "ERROR" || requestLine["status"] != float64(500) || requestLine["outcome"] != "internal" {
		t.Errorf("request line: %v", requestLine)
	}

	resp, body = e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"after"}`))
	requireJSON(t, resp, body, http.StatusCreated)
}

// A handler that panics with http.ErrAbortHandler has its answer cut off,
// as net/http does for it: no problem is written and nothing is logged as
// a panic.
func TestE2EAbortHandlerIsNotAProblem(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	store := panickingStore{statemachine.NewMemoryStore(statemachine.DefaultLimits()), http.ErrAbortHandler}
	e := start(t, handlers.Config{Store: store, Logger: slog.New(slog.NewJSONHandler(logs, nil))})

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+"/v1/begin", strings.NewReader(`{"key":"panic"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer, %d; want the connection cut", resp.StatusCode)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), `"msg":"panic"`) {
		t.Errorf("an aborted handler is logged as a panic:\n%s", logs.String())
	}
}
