package api

import (
	"net/http/httptest"
	"testing"
	"time"
)

// visited is what a response wrote: status, Content-Type and body.
type visited struct {
	status      int
	contentType string
	body        string
}

func visit(t *testing.T, write func(*httptest.ResponseRecorder) error) visited {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := write(rec); err != nil {
		t.Fatal(err)
	}
	return visited{rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()}
}

// keys that JSON must escape or not, as the encoders see them.
var encodeKeys = []string{"k", `{}*?\`, `"quoted"`, "<a&b>", "\x01\u00e9\xff", ""}

// The hand-written 201 to begin writes what the generated response writes.
func TestBeginAcquiredResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	for _, key := range encodeKeys {
		for _, recovered := range []bool{false, true} {
			r := BeginAcquired{Attempt: 12, Key: key, LeaseExpiresAt: at,
				LeaseToken: "3f2a9c0d5b7e41c8a6d09e2f7b1c4a55", Recovered: recovered, Status: BeginAcquiredStatusAcquired}
			got := visit(t, func(w *httptest.ResponseRecorder) error { return BeginAcquiredResponse(r).VisitBeginResponse(w) })
			want := visit(t, func(w *httptest.ResponseRecorder) error { return Begin201JSONResponse(r).VisitBeginResponse(w) })
			if got != want {
				t.Errorf("key %q:\n got %+v\nwant %+v", key, got, want)
			}
		}
	}
}

// The hand-written 200 to complete and fail writes what the generated
// responses write, for a completed and a failed attempt.
func TestFinishedResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	expires := NewMilliTime(at.Add(24 * time.Hour))
	retryable, terminal := true, false
	for _, key := range encodeKeys {
		for _, r := range []FinishResult{
			{Attempt: 1, Key: key, Status: FinishedStateCompleted, CompletedAt: &at, ExpiresAt: expires},
			{Attempt: 3, Key: key, Status: FinishedStateFailed, FailedAt: &at, ExpiresAt: expires, Retryable: &retryable},
			{Attempt: 2, Key: key, Status: FinishedStateFailed, FailedAt: &at, ExpiresAt: expires, Retryable: &terminal},
		} {
			got := visit(t, func(w *httptest.ResponseRecorder) error { return FinishedResponse(r).VisitCompleteResponse(w) })
			want := visit(t, func(w *httptest.ResponseRecorder) error { return Complete200JSONResponse(r).VisitCompleteResponse(w) })
			if got != want {
				t.Errorf("complete, key %q, %s:\n got %+v\nwant %+v", key, r.Status, got, want)
			}
			got = visit(t, func(w *httptest.ResponseRecorder) error { return FinishedResponse(r).VisitFailResponse(w) })
			want = visit(t, func(w *httptest.ResponseRecorder) error { return Fail200JSONResponse(r).VisitFailResponse(w) })
			if got != want {
				t.Errorf("fail, key %q, %s:\n got %+v\nwant %+v", key, r.Status, got, want)
			}
		}
	}
}
