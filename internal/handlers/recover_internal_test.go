// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// A handler that panics once its answer has begun has the answer cut
// off, so that the client cannot take what it got for the whole answer;
// the panic is still logged. (No route of the service writes before it
// can fail, so the handler here is the test's own, behind the service's
// middleware, on a real server.)
func TestPanicAfterTheAnswerBeganCutsItOff(t *testing.T) {
	// The log goes to a file, which the server's goroutine writes and the
	// test reads without sharing memory.
	logs, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logs.Close() })
	s := New(Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	late := s.recoverPanic(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10)) // past net/http's buffer: on the wire
		panic("late")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.observe(w, r, late) }))
	t.Cleanup(srv.Close)

	resp, err := srv.Client().Get(srv.URL)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Errorf("the cut answer read as a whole one: %d", resp.StatusCode)
	}
	var line struct{ Level, Msg, Panic, Stack string }
	logged, err := os.ReadFile(logs.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(strings.SplitN(string(logged), "\n", 2)[0]), &line); err != nil ||
		line.Level != "ERROR" || line.Msg != "panic" || line.Panic != "late" || line.Stack == "" {
		t.Errorf("the panic is not logged (%v):\n%s", err, logged)
	}
}
