// SPDX-License-Identifier: Apache-2.0

package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/jsonlog"
)

// The cost of a request's log line, batched by logWriter or written to the
// file at once (a write system call per line).
func BenchmarkLogLine(b *testing.B) {
	for _, batched := range []bool{false, true} {
		name := "direct"
		if batched {
			name = "batched"
		}
		b.Run(name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			var out interface {
				Write([]byte) (int, error)
			} = f
			if batched {
				w := newLogWriter(f, 100*time.Millisecond)
				defer w.Close()
				out = w
			}
			log := slog.New(jsonlog.NewHandler(out, slog.LevelInfo))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					log.LogAttrs(b.Context(), slog.LevelInfo, "request", slog.String("request_id", "0123456789abcdef"),
						slog.String("method", "POST"), slog.String("route", "/v1/begin"), slog.Int("status", 201),
						slog.String("outcome", "acquired"), slog.Int64("duration_us", 123), slog.String("tenant", "payments"))
				}
			})
		})
	}
}
