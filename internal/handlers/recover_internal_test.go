// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// lockedBuffer is a log output written by the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A handler that panics once its answer has begun has the answer cut
// off, so that the client cannot take what it got for the whole answer;
// the panic is still logged. (No route of the service writes before it
// can fail, so the handler here is the test's own, behind the service's
// middleware, on a real server.)
func TestPanicAfterTheAnswerBeganCutsItOff(t *testing.T) {
	logs := &lockedBuffer{}
	s := New(Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	srv := httptest.NewServer(s.observe(s.recoverPanic(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10)) // past net/http's buffer: on the wire
		panic("late")
	}))))
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
	if err := json.Unmarshal([]byte(strings.SplitN(logs.String(), "\n", 2)[0]), &line); err != nil ||
		line.Level != "ERROR" || line.Msg != "panic" || line.Panic != "late" || line.Stack == "" {
		t.Errorf("the panic is not logged (%v):\n%s", err, logs.String())
	}
}
