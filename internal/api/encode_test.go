// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math/bits"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/idemsvc/idemsvc/clients/go/encodecheck"
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

// sameAnswer reports whether got is the generated answer want except for
// HTML escaping: the same status and Content-Type, a body that holds the
// same JSON value as want's, written as encoding/json writes value with
// SetEscapeHTML(false).
func sameAnswer(t *testing.T, got, want visited, value any) bool {
	t.Helper()
	var plain strings.Builder
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(value); err != nil {
		t.Fatal(err)
	}
	var gotValue, wantValue any
	if err := json.Unmarshal([]byte(want.body), &wantValue); err != nil {
		t.Fatal(err)
	}
	return json.Unmarshal([]byte(got.body), &gotValue) == nil && reflect.DeepEqual(gotValue, wantValue) &&
		got.status == want.status && got.contentType == want.contentType && got.body == plain.String()
}

// keys that JSON must escape or not, as the encoders see them.
var encodeKeys = []string{"k", `{}*?\`, `"quoted"`, "<a&b>", "\x01\u00e9\xff", ""}

// The hand-written 200 to begin writes what the generated response writes
// but for HTML escaping, for completed and failed replays and every shape
// of stored response.
func TestBeginReplayResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	text, base64 := BodyEncodingText, BodyEncodingBase64
	status, zero := 201, 0
	body, empty, binary := `{"id":"ch_1","note":"<b>\u2028 & \\ \t"}`, "", "AAECAwT/"
	reason := "card declined: \"insufficient funds\"\n"
	responses := []StoredResponse{
		{},
		{StatusCode: &status},
		{StatusCode: &zero, Headers: map[string]string{}},
		{Body: &body, BodyEncoding: &text},
		{Body: &empty, BodyEncoding: &text, Headers: map[string]string{"X-Empty": ""}},
		{Body: &binary, BodyEncoding: &base64, StatusCode: &status,
			Headers: map[string]string{"Content-Type": "application/json", "X-Trace": "a\x00b", "Location": "/charges/ch_1", "x-lower": "<>&"}},
		{Headers: map[string]string{"\xff\u00e9": "\u2029"}},
	}
	for _, key := range encodeKeys {
		for _, resp := range responses {
			for _, r := range []BeginReplay{
				{Attempt: 1, Key: key, Status: FinishedStateCompleted, CompletedAt: &at, Response: resp},
				{Attempt: 4, Key: key, Status: FinishedStateFailed, FailedAt: &at, Error: &reason, Response: resp},
				{Attempt: 2, Key: key, Status: FinishedStateFailed, FailedAt: &at, Error: &empty, Response: resp},
			} {
				got := visit(t, func(w *httptest.ResponseRecorder) error { return BeginReplayResponse(r).VisitBeginResponse(w) })
				want := visit(t, func(w *httptest.ResponseRecorder) error { return Begin200JSONResponse(r).VisitBeginResponse(w) })
				if !sameAnswer(t, got, want, r) {
					t.Errorf("key %q, %s:\n got %+v\nwant %+v", key, r.Status, got, want)
				}
			}
		}
	}
}

// The hand-written 201 to begin writes what the generated response writes.
func TestBeginAcquiredResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 7e6, time.UTC))
	for _, key := range encodeKeys {
		for _, r := range []BeginAcquired{
			{Attempt: 1, Key: key, LeaseExpiresAt: at, LeaseToken: "3f2a9c0d5b7e41c8a6d09e2f7b1c4a55", Status: BeginAcquiredStatusAcquired},
			{Attempt: 1 << 40, Key: key, LeaseExpiresAt: at, LeaseToken: "", Recovered: true, Status: BeginAcquiredStatusAcquired},
		} {
			got := visit(t, func(w *httptest.ResponseRecorder) error { return BeginAcquiredResponse(r).VisitBeginResponse(w) })
			want := visit(t, func(w *httptest.ResponseRecorder) error { return Begin201JSONResponse(r).VisitBeginResponse(w) })
			if !sameAnswer(t, got, want, r) {
				t.Errorf("key %q:\n got %+v\nwant %+v", key, got, want)
			}
		}
	}
}

// The hand-written 200 to complete and fail writes what the generated
// responses write.
func TestFinishResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 7e6, time.UTC))
	expires := NewMilliTime(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	yes, no := true, false
	for _, key := range encodeKeys {
		for _, r := range []FinishResult{
			{Attempt: 1, Key: key, CompletedAt: &at, ExpiresAt: expires, Status: FinishedStateCompleted},
			{Attempt: 1 << 40, Key: key, FailedAt: &at, ExpiresAt: expires, Retryable: &no, Status: FinishedStateFailed},
			{Attempt: 3, Key: key, FailedAt: &at, ExpiresAt: expires, Retryable: &yes, Status: FinishedStateFailed},
		} {
			got := visit(t, func(w *httptest.ResponseRecorder) error { return FinishResponse(r).VisitCompleteResponse(w) })
			want := visit(t, func(w *httptest.ResponseRecorder) error { return Complete200JSONResponse(r).VisitCompleteResponse(w) })
			if !sameAnswer(t, got, want, r) {
				t.Errorf("complete, key %q:\n got %+v\nwant %+v", key, got, want)
			}
			got = visit(t, func(w *httptest.ResponseRecorder) error { return FinishResponse(r).VisitFailResponse(w) })
			want = visit(t, func(w *httptest.ResponseRecorder) error { return Fail200JSONResponse(r).VisitFailResponse(w) })
			if !sameAnswer(t, got, want, r) {
				t.Errorf("fail, key %q:\n got %+v\nwant %+v", key, got, want)
			}
		}
	}
}

// specialBytes8 marks the first byte of eight that needs a second look,
// and none before it: every byte value at every position, among plain
// bytes and before every other value (whose borrow must not move the
// mark).
func TestSpecialBytes8(t *testing.T) {
	special := func(c int) bool { return c < 0x20 || c >= 0x80 || c == '"' || c == '\\' }
	for pos := range 8 {
		for c := range 256 {
			for _, after := range []int{'x', 0x00, 0x1f, '"', '\\', 0x80, 0xff} {
				word := []byte("abcdefgh")
				word[pos] = byte(c)
				if pos < 7 {
					word[7] = byte(after)
				}
				want := 8
				for i, b := range word {
					if special(int(b)) {
						want = i
						break
					}
				}
				got := 8
				if m := specialBytes8(le64(string(word))); m != 0 {
					got = bits.TrailingZeros64(m) >> 3
				}
				if got != want {
					t.Errorf("%q: first special byte at %d, want %d", word, got, want)
				}
			}
		}
	}
}

// controlBytes8 and equalBytes8 mark exactly the bytes they name: every
// byte value at every position, beside every other value.
func TestExactBytes8(t *testing.T) {
	for pos := range 8 {
		for c := range 256 {
			for _, other := range []byte{'x', 0x00, 0x1f, 0x20, '"', '\\', 0x7f, 0x80, 0xff} {
				word := []byte{other, other, other, other, other, other, other, other}
				word[pos] = byte(c)
				var control, quote, backslash uint64
				for i, b := range word {
					bit := uint64(0x80) << (8 * i)
					if b < 0x20 {
						control |= bit
					}
					if b == '"' {
						quote |= bit
					}
					if b == '\\' {
						backslash |= bit
					}
				}
				w := le64(string(word))
				if got := controlBytes8(w); got != control {
					t.Errorf("%q: control bytes %#x, want %#x", word, got, control)
				}
				if got := equalBytes8(w, '"'); got != quote {
					t.Errorf("%q: quotes %#x, want %#x", word, got, quote)
				}
				if got := equalBytes8(w, '\\'); got != backslash {
					t.Errorf("%q: backslashes %#x, want %#x", word, got, backslash)
				}
			}
		}
	}
}

// appendString escapes every string as encoding/json does without HTML
// escaping, and JSONStringLen says how long that is.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `"\`, "\b\f\n\r\t\x00\x1f\x7f", "<a&b>", "\u00e9\u2028\u2029\U0001F600",
		"\xff", "\xed\xa0\x80", "a\xc3", "\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var plain strings.Builder
		enc := json.NewEncoder(&plain)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSuffix(plain.String(), "\n")
		if got := appendString([]byte("x"), s); string(got) != "x"+want {
			t.Errorf("appendString(%q) = %s, want %s", s, got[1:], want)
		}
		if n := JSONStringLen(s); n != len(want) {
			t.Errorf("JSONStringLen(%q) = %d, want %d", s, n, len(want))
		}
	})
}

// writeSizes is a recorder that notes the size of each write.
type writeSizes struct {
	*httptest.ResponseRecorder
	largest int
}

func (w *writeSizes) Write(b []byte) (int, error) {
	w.largest = max(w.largest, len(b))
	return w.ResponseRecorder.Write(b)
}

// A large replay is written in chunks of bounded size, and the chunks make
// what the generated response writes but for HTML escaping, also where multi-byte characters,
// invalid UTF-8 and escapes straddle the pieces the body is escaped in.
func TestBeginReplayResponseStreamsLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	text := BodyEncodingText
	status := 200
	reason := "declined"
	var bodies []string
	for _, piece := range []string{"<", "\x01", "\u00e9", "\u20ac", "\U0001F600", "\u2028", "\xff", "\xe2\x80", "\xf0\x9f\x98"} {
		for offset := range 4 {
			bodies = append(bodies, strings.Repeat("a", streamSegment-offset)+strings.Repeat(piece, 10*streamSegment/len(piece)))
		}
	}
	bodies = append(bodies, strings.Repeat("<a\u00e9&\"\\\t\xff\U0001F600b", 1<<16))
	for _, body := range bodies {
		for _, r := range []BeginReplay{
			{Attempt: 1, Key: "k", Status: FinishedStateCompleted, CompletedAt: &at,
				Response: StoredResponse{Body: &body, BodyEncoding: &text}},
			{Attempt: 2, Key: "<k>", Status: FinishedStateFailed, FailedAt: &at, Error: &reason,
				Response: StoredResponse{Body: &body, BodyEncoding: &text, StatusCode: &status,
					Headers: map[string]string{"Content-Type": "text/html", "X-Big": body[:len(body)/2]}}},
			{Attempt: 3, Key: "k", Status: FinishedStateCompleted, CompletedAt: &at,
				Response: StoredResponse{Headers: map[string]string{"X-Big": body, "X-Small": "<>"}}},
		} {
			w := &writeSizes{ResponseRecorder: httptest.NewRecorder()}
			if err := BeginReplayResponse(r).VisitBeginResponse(w); err != nil {
				t.Fatal(err)
			}
			got := visited{w.Code, w.Header().Get("Content-Type"), w.Body.String()}
			want := visit(t, func(w *httptest.ResponseRecorder) error { return Begin200JSONResponse(r).VisitBeginResponse(w) })
			if !sameAnswer(t, got, want, r) {
				t.Errorf("body of %d bytes starting %q: the streamed answer differs from the generated one", len(body), body[:8])
			}
			if w.largest > streamBuffer {
				t.Errorf("a write of %d bytes, want at most %d", w.largest, streamBuffer)
			}
		}
	}
}

// A body given as a stream (WriteWithBody), read in pieces of any size,
// writes what the same body given whole writes: text escaped across every
// cut of a UTF-8 sequence, base64 across every cut of three bytes; writes
// stay within streamBuffer; and a body that fails to read leaves the
// answer unfinished, with ErrBodyRead.
func TestBodyStreamWritesAsWhole(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	var bodies []string
	for _, piece := range []string{"<", "\x01", "\u00e9", "\u20ac", "\U0001F600", "\u2028", "\xff", "\xe2\x80", "\xf0\x9f\x98"} {
		for offset := range 4 {
			bodies = append(bodies, strings.Repeat("a", streamSegment-offset)+strings.Repeat(piece, 10*streamSegment/len(piece)))
		}
	}
	bodies = append(bodies, strings.Repeat("<a\u00e9&\"\\\t\xff\U0001F600b", 1<<14), "", "x", "ab")
	for _, body := range bodies {
		for _, b64 := range []bool{false, true} {
			encoding, sent := BodyEncodingText, body
			if b64 {
				encoding, sent = BodyEncodingBase64, base64.StdEncoding.EncodeToString([]byte(body))
			}
			r := BeginReplay{Attempt: 1, Key: "k", Status: FinishedStateCompleted, CompletedAt: &at,
				Response: StoredResponse{BodyEncoding: &encoding, Headers: map[string]string{"Content-Type": "text/html"}}}
			whole := r
			whole.Response.Body = &sent
			want := httptest.NewRecorder()
			if err := BeginReplayResponse(whole).WriteWithBody(&writeSizes{ResponseRecorder: want}, nil); err != nil {
				t.Fatal(err)
			}
			for _, read := range []func(io.Reader) io.Reader{iotest.OneByteReader, iotest.HalfReader, func(r io.Reader) io.Reader { return r }} {
				w := &writeSizes{ResponseRecorder: httptest.NewRecorder()}
				if err := BeginReplayResponse(r).WriteWithBody(w, &BodyStream{R: read(strings.NewReader(body)), Base64: b64}); err != nil {
					t.Fatal(err)
				}
				if w.Body.String() != want.Body.String() || w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
					t.Fatalf("body of %d bytes (base64 %v): the streamed answer differs from the whole one", len(body), b64)
				}
				if w.largest > streamBuffer {
					t.Errorf("a write of %d bytes, want at most %d", w.largest, streamBuffer)
				}
			}
		}
	}
	long := strings.Repeat("a", 200<<10)
	w := httptest.NewRecorder()
	err := BeginReplayResponse{Attempt: 1, Key: "k", Status: FinishedStateCompleted}.WriteWithBody(w,
		&BodyStream{R: iotest.TimeoutReader(strings.NewReader(long))})
	if !errors.Is(err, ErrBodyRead) || strings.HasSuffix(w.Body.String(), "}\n") {
		t.Errorf("a body that fails to read: %v, the answer ends %q", err, w.Body.String()[max(0, w.Body.Len()-8):])
	}
}

// The hand-written 200 to status writes what the generated response writes
// but for HTML escaping, for every state, with and without a stored
// response, small or streamed.
func TestStatusResponseWritesLikeGenerated(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	later := NewMilliTime(at.Add(time.Hour))
	yes, no := true, false
	owner, fingerprint, reason := "req-<1>", "sha256:&ab", "declined \"hard\"\n"
	text := BodyEncodingText
	status := 201
	small := `{"id":"<ch_1>"}`
	large := strings.Repeat("<a\u00e9&\"\\\t\xff\U0001F600\u2028b", 1<<13)
	for _, key := range encodeKeys {
		for _, r := range []StatusRecord{
			{Attempt: 1, Key: key, Tenant: "t", State: StateInProgress, CreatedAt: at, UpdatedAt: at, ExpiresAt: later,
				LeaseExpiresAt: &later, LeaseExpired: &no, Owner: &owner, Fingerprint: &fingerprint},
			{Attempt: 2, Key: key, Tenant: "payments", State: StateCompleted, CreatedAt: at, UpdatedAt: later, ExpiresAt: later},
			{Attempt: 2, Key: key, Tenant: "payments", State: StateCompleted, CreatedAt: at, UpdatedAt: later, ExpiresAt: later,
				Response: &StoredResponse{Body: &small, BodyEncoding: &text, StatusCode: &status, Headers: map[string]string{"A": "<>"}}},
			{Attempt: 3, Key: key, Tenant: "payments", State: StateFailed, CreatedAt: at, UpdatedAt: later, ExpiresAt: later,
				Retryable: &yes, Error: &reason, Response: &StoredResponse{}},
			{Attempt: 4, Key: key, Tenant: "payments", State: StateFailed, CreatedAt: at, UpdatedAt: later, ExpiresAt: later,
				Retryable: &no, Error: &reason, Owner: &owner, Response: &StoredResponse{Body: &large, BodyEncoding: &text,
					Headers: map[string]string{"X-Big": large[:len(large)/2]}}},
		} {
			w := &writeSizes{ResponseRecorder: httptest.NewRecorder()}
			if err := StatusResponse(r).VisitGetStatusResponse(w); err != nil {
				t.Fatal(err)
			}
			got := visited{w.Code, w.Header().Get("Content-Type"), w.Body.String()}
			want := visit(t, func(w *httptest.ResponseRecorder) error { return GetStatus200JSONResponse(r).VisitGetStatusResponse(w) })
			if !sameAnswer(t, got, want, r) {
				t.Errorf("key %q, %s, attempt %d:\n got %.300s\nwant %.300s", key, r.State, r.Attempt, got.body, want.body)
			}
			if w.largest > streamBuffer {
				t.Errorf("a write of %d bytes, want at most %d", w.largest, streamBuffer)
			}
		}
	}
}

// TestAnswersCarryEveryField: each hand-written answer holds every field
// of its generated response type, set by reflection, so that a field
// added to api/openapi.yaml cannot be left out of encode.go while the
// examples above, which hold today's fields, still pass.
func TestAnswersCarryEveryField(t *testing.T) {
	written := func(write func(*httptest.ResponseRecorder) error) []byte {
		return []byte(visit(t, write).body)
	}
	replay := encodecheck.Filled[BeginReplay](t)
	encodecheck.Check(t, replay, written(func(w *httptest.ResponseRecorder) error { return BeginReplayResponse(replay).VisitBeginResponse(w) }))
	acquired := encodecheck.Filled[BeginAcquired](t)
	encodecheck.Check(t, acquired, written(func(w *httptest.ResponseRecorder) error { return BeginAcquiredResponse(acquired).VisitBeginResponse(w) }))
	finish := encodecheck.Filled[FinishResult](t)
	encodecheck.Check(t, finish, written(func(w *httptest.ResponseRecorder) error { return FinishResponse(finish).VisitCompleteResponse(w) }))
	encodecheck.Check(t, finish, written(func(w *httptest.ResponseRecorder) error { return FinishResponse(finish).VisitFailResponse(w) }))
	status := encodecheck.Filled[StatusRecord](t)
	encodecheck.Check(t, status, written(func(w *httptest.ResponseRecorder) error { return StatusResponse(status).VisitGetStatusResponse(w) }))
}
