// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"net/http/httptest"
	"strconv"
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

// benchWrite measures one way of writing an answer, as its own sub-benchmark.
func benchWrite(b *testing.B, name string, write func(http.ResponseWriter) error) {
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = write(httptest.NewRecorder())
		}
	})
}

func BenchmarkReplayEncode(b *testing.B) {
	r := replayOf()
	benchWrite(b, "hand-written", BeginReplayResponse(r).VisitBeginResponse)
	benchWrite(b, "encoding-json-v2", func(w http.ResponseWriter) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		return json.MarshalWrite(w, r, json.Deterministic(true))
	})
	benchWrite(b, "encoding-json-v1", Begin200JSONResponse(r).VisitBeginResponse)
}

func BenchmarkAcquiredEncode(b *testing.B) {
	r := BeginAcquired{Attempt: 1, Key: "order-42/charge", LeaseExpiresAt: NewMilliTime(time.Now()),
		LeaseToken: "3f2a9c0d5b7e41c8a6d09e2f7b1c4a55", Status: BeginAcquiredStatusAcquired}
	benchWrite(b, "hand-written", BeginAcquiredResponse(r).VisitBeginResponse)
	benchWrite(b, "encoding-json-v1", Begin201JSONResponse(r).VisitBeginResponse)
}

func BenchmarkFinishEncode(b *testing.B) {
	at := NewMilliTime(time.Now())
	r := FinishResult{Attempt: 1, Key: "order-42/charge", CompletedAt: &at, ExpiresAt: at, Status: FinishedStateCompleted}
	benchWrite(b, "hand-written", FinishResponse(r).VisitCompleteResponse)
	benchWrite(b, "encoding-json-v1", Complete200JSONResponse(r).VisitCompleteResponse)
}

// jsonBody is a JSON answer of about n bytes, as an API returns them:
// short members, so quotes come every few bytes.
func jsonBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < n-2; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"it_` + strconv.Itoa(i) + `","amount":1000,"currency":"eur","paid":true,"note":"caf\u00e9"}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

// BenchmarkEscape escapes stored bodies as a replay writes them: a JSON
// answer, dense with quotes, and plain text.
func BenchmarkEscape(b *testing.B) {
	for _, c := range []struct {
		name string
		body string
	}{{"json-1KiB", jsonBody(1 << 10)}, {"json-16KiB", jsonBody(16 << 10)}, {"text-16KiB", strings.Repeat("lorem ipsum ", 16<<10/12)}} {
		buf := make([]byte, 0, 2*len(c.body))
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				buf = appendEscaped(buf[:0], c.body)
			}
		})
		b.Run("len-"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				_ = JSONStringLen(c.body)
			}
		})
	}
}
