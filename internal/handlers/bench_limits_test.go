// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// BenchmarkServeBeginLimits is the cost of tenant limits on a begin of a new
// key, in process: without limits, and with limits high enough never to
// refuse, on the memory store and on Redis (rate taken in batches, as
// shipped, or with one Redis call per begin), and with in_progress (a
// Redis call per begin).
func BenchmarkServeBeginLimits(b *testing.B) {
	const limits = `{"begins_per_s":10000000,"burst":10000000,"stored_bytes":1125899906842624,"waiters":10000000}`
	const inProgress = `{"begins_per_s":10000000,"burst":10000000,"stored_bytes":1125899906842624,"in_progress":10000000}`
	for _, bc := range []struct {
		name   string
		redis  bool
		limits string
		batch  int
	}{
		{"memory/none", false, "", 0},
		{"memory/limits", false, limits, 0},
		{"memory/in_progress", false, inProgress, 0},
		{"redis/none", true, "", 0},
		{"redis/limits", true, limits, 0},
		{"redis/limits-per-call", true, limits, 1},
		{"redis/in_progress", true, inProgress, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tenant := idemtest.Tenant{Name: "bench", Key: "bench-key", Limits: bc.limits}
			keyring := idemtest.Keyring(b, tenant)
			var store statemachine.Store = statemachine.NewMemoryStore(statemachine.DefaultLimits())
			limiter := quota.NewMemory(quota.Options{})
			if bc.redis {
				rdb := redistest.SharedServer(b).Client(b)
				store = redisstore.New(rdb, redisstore.Options{})
				limiter = quota.NewRedis(rdb, quota.Options{RateBatch: bc.batch})
			}
			b.Cleanup(limiter.Close)
			svc := handlers.New(handlers.Config{Store: store, Keyring: keyring, Limiter: limiter,
				Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
			prefix := fmt.Sprintf("limits-%d-", benchRun.Add(1))
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
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
		})
	}
}
