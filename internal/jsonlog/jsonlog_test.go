// SPDX-License-Identifier: Apache-2.0

package jsonlog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/jsonlog"
)

// line logs one record through a handler of level Info and returns the
// line it wrote, decoded.
func line(t *testing.T, log func(*slog.Logger)) (map[string]any, string) {
	t.Helper()
	var out bytes.Buffer
	log(slog.New(jsonlog.NewHandler(&out, slog.LevelInfo)))
	text := out.String()
	if strings.Count(text, "\n") != 1 || !strings.HasSuffix(text, "\n") {
		t.Fatalf("want one line, got %q", text)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("the line is not JSON: %v: %q", err, text)
	}
	return m, text
}

func TestSlogKeysAndValues(t *testing.T) {
	before := time.Now()
	m, text := line(t, func(l *slog.Logger) {
		l.Warn("store slow", "tenant", "acme", "status", 503, "took", 1500*time.Millisecond,
			"error", errors.New("dial tcp: refused"), "ok", false, slog.Group("redis", "addr", "10.0.0.1:6379"))
	})
	want := map[string]any{"level": "WARN", "msg": "store slow", "tenant": "acme", "status": 503.0,
		"took": 1.5e9, "error": "dial tcp: refused", "ok": false, "redis.addr": "10.0.0.1:6379"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %#v, want %#v in %s", k, m[k], v, text)
		}
	}
	at, err := time.Parse(time.RFC3339Nano, m["time"].(string))
	if err != nil || at.Before(before.Truncate(time.Microsecond)) || at.After(time.Now()) {
		t.Errorf("time = %v (%v), want the record's time in RFC 3339", m["time"], err)
	}
}

func TestLevels(t *testing.T) {
	var out bytes.Buffer
	l := slog.New(jsonlog.NewHandler(&out, slog.LevelInfo))
	l.Debug("hidden")
	if out.Len() != 0 || l.Enabled(context.Background(), slog.LevelDebug) {
		t.Fatalf("a debug record passed a handler of level info: %q", out.String())
	}
	for _, c := range []struct {
		level slog.Level
		want  string
	}{{slog.LevelInfo, "INFO"}, {slog.LevelWarn, "WARN"}, {slog.LevelError, "ERROR"}, {slog.LevelError + 4, "ERROR"}} {
		m, _ := line(t, func(l *slog.Logger) { l.Log(context.Background(), c.level, "x") })
		if m["level"] != c.want {
			t.Errorf("level %v written as %v, want %s", c.level, m["level"], c.want)
		}
	}
}

// A caller's bytes in a field (a tenant's name, a client address from a
// header) cannot end the line or the string, or make it invalid JSON.
func TestHostileStringsStayInTheirField(t *testing.T) {
	hostile := "a\"b\\c\nd\re\tf\x00g\x01h\x1fi\x7fj\xffk<script>\u2028"
	m, text := line(t, func(l *slog.Logger) { l.Info("request", "tenant", hostile, hostile, "key") })
	if m["tenant"] != strings.ToValidUTF8(hostile, "\uFFFD") || m[strings.ToValidUTF8(hostile, "\uFFFD")] != "key" {
		t.Errorf("tenant = %q, want the string itself (invalid UTF-8 as U+FFFD): %s", m["tenant"], text)
	}
	for _, c := range text[:len(text)-1] {
		if c < 0x20 {
			t.Fatalf("a control character written raw: %q", text)
		}
	}
}

// requestLine logs a line shaped as idemsvc's request line.
func requestLine(h slog.Handler) {
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "request", 0)
	rec.AddAttrs(slog.String("request_id", "3f2a9c1b00000001"), slog.String("method", "POST"),
		slog.String("route", "/v1/begin"), slog.Int("status", 201),
		slog.Attr{Value: slog.GroupValue(slog.String("outcome", "acquired"), slog.Int64("duration_us", 1234),
			slog.String("client", "127.0.0.1:45678"), slog.String("tenant", "acme"))})
	_ = h.Handle(context.Background(), rec)
}

// BenchmarkRequestLine: a request's line through this package's handler
// and through slog's JSONHandler, the baseline.
func BenchmarkRequestLine(b *testing.B) {
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{
		{"jsonlog", jsonlog.NewHandler(io.Discard, slog.LevelInfo)},
		{"slog", slog.NewJSONHandler(io.Discard, nil)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				requestLine(c.h)
			}
		})
	}
}

// The request line's attributes past the record's inline five go in a
// group without a name: they are written inline, as slog's handler does.
func TestUnnamedGroupInline(t *testing.T) {
	var out bytes.Buffer
	requestLine(jsonlog.NewHandler(&out, slog.LevelInfo))
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"route": "/v1/begin", "status": 201.0, "outcome": "acquired", "duration_us": 1234.0, "tenant": "acme"} {
		if m[k] != v {
			t.Errorf("%s = %#v, want %#v in %s", k, m[k], v, out.String())
		}
	}
}
