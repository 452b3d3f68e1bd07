package api

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
)

// replayOf is a typical replay: a 1 KiB JSON body and three headers.
func replayOf() BeginReplay {
	body := `{"id":"ch_1","amount":1000,"currency":"eur","note":"` + strings.Repeat("x", 960) + `"}`
	code := 201
	enc := BodyEncodingText
	at := NewMilliTime(time.Now())
	return BeginReplay{Attempt: 1, Key: "order-42/charge", CompletedAt: &at, Status: FinishedStateCompleted,
		Response: StoredResponse{StatusCode: &code, Body: &body, BodyEncoding: &enc,
			Headers: map[string]string{"Content-Type": "application/json", "Location": "/charges/ch_1", "ETag": `"abc"`}}}
}

func BenchmarkReplayEncode(b *testing.B) {
	r := replayOf()
	b.Run("hand-written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = BeginReplayResponse(r).VisitBeginResponse(httptest.NewRecorder())
		}
	})
	b.Run("encoding-json-v2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w := httptest.NewRecorder()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			_ = json.MarshalWrite(w, r, json.Deterministic(true))
		}
	})
	b.Run("encoding-json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Begin200JSONResponse(r).VisitBeginResponse(httptest.NewRecorder())
		}
	})
}

func BenchmarkAcquiredEncode(b *testing.B) {
	r := BeginAcquired{Attempt: 1, Key: "order-42/charge", LeaseExpiresAt: NewMilliTime(time.Now()),
		LeaseToken: "3f2a9c0d5b7e41c8a6d09e2f7b1c4a55", Status: BeginAcquiredStatusAcquired}
	b.Run("hand-written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = BeginAcquiredResponse(r).VisitBeginResponse(httptest.NewRecorder())
		}
	})
	b.Run("encoding-json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Begin201JSONResponse(r).VisitBeginResponse(httptest.NewRecorder())
		}
	})
}

func BenchmarkFinishEncode(b *testing.B) {
	at := NewMilliTime(time.Now())
	r := FinishResult{Attempt: 1, Key: "order-42/charge", CompletedAt: &at, ExpiresAt: at, Status: FinishedStateCompleted}
	b.Run("hand-written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = FinishResponse(r).VisitCompleteResponse(httptest.NewRecorder())
		}
	})
	b.Run("encoding-json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Complete200JSONResponse(r).VisitCompleteResponse(httptest.NewRecorder())
		}
	})
}
