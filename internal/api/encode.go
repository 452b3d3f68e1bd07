// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Two answers carry a stored response, up to 1 MiB by default and more if
// configured: a replay (200 to begin) and a status with its response. They
// are written by hand, as a stream: a large one in chunks of streamChunk
// bytes, so that a client that does not read holds at most one chunk of
// idemsvc's memory (TestBoundedMemory measures it; a library encodes a
// string whole). The JSON is the generated responses' (encode_test.go
// checks it against them) except that <, > and & are not escaped for HTML,
// as encoding/json/v2 does not by default: an HTML body stored by a proxy
// replays up to six times shorter. Measured for a replay of 1 KiB
// (BenchmarkReplayEncode), this encoder also takes 2.4 µs where
// encoding/json and encoding/json/v2 take 3.4 µs. The answers of every
// cycle are written by hand too, for their rate: the 201 of an acquired
// begin and the 200 of complete and fail. Every other answer is encoded
// by the generated code.

// BeginReplayResponse is the 200 answer to a begin on a finished key.
type BeginReplayResponse BeginReplay

// VisitBeginResponse writes what Begin200JSONResponse writes. A large
// stored body is escaped and written in chunks of about streamChunk
// bytes, so that the answer is never held whole in memory: escaping can
// make a body six times longer, and a client that reads slowly would
// hold that much for as long as it takes.
func (r BeginReplayResponse) VisitBeginResponse(w http.ResponseWriter) error {
	return r.WriteWithBody(w, nil)
}

// WriteWithBody writes the replay as VisitBeginResponse does, with body
// (when not nil) as its response's body: read and written as it is read,
// never held whole. A body that fails to read ends the answer there,
// unfinished, with an error that wraps ErrBodyRead.
func (r BeginReplayResponse) WriteWithBody(w http.ResponseWriter, body *BodyStream) error {
	size := 256 + len(r.Key)
	if body != nil {
		size += streamBuffer
	}
	if r.Error != nil {
		size += len(*r.Error)
	}
	if r.Response.Body != nil {
		size += len(*r.Response.Body) + len(*r.Response.Body)/8 // room for some escapes
	}
	for name, value := range r.Response.Headers {
		size += 6 + len(name) + len(value)
	}
	s := jsonStream{b: make([]byte, 0, min(size, streamBuffer))}
	if size > streamChunk {
		s.w = w
		w.Header()["Content-Type"] = jsonContentType
		w.WriteHeader(http.StatusOK)
	}
	s.b = append(s.b, `{"attempt":`...)
	s.b = strconv.AppendInt(s.b, r.Attempt, 10)
	if r.CompletedAt != nil {
		s.b = append(s.b, `,"completed_at":`...)
		s.b = r.CompletedAt.AppendJSON(s.b)
	}
	if r.Error != nil {
		s.b = append(s.b, `,"error":`...)
		s.string(*r.Error)
	}
	if r.FailedAt != nil {
		s.b = append(s.b, `,"failed_at":`...)
		s.b = r.FailedAt.AppendJSON(s.b)
	}
	s.b = append(s.b, `,"key":`...)
	s.string(r.Key)
	s.b = append(s.b, `,"response":`...)
	r.Response.streamJSON(&s, body)
	s.b = append(s.b, `,"status":`...)
	s.string(string(r.Status))
	if s.w == nil {
		return writeJSON(w, http.StatusOK, s.b)
	}
	s.b = append(s.b, '}', '\n')
	s.flush()
	return s.err
}

// BeginAcquiredResponse is the 201 answer to a begin that acquired the
// key: the hottest answer there is, written by hand as the generated
// Begin201JSONResponse writes it but for HTML escaping (encode_test.go
// checks it), without encoding/json's reflection (BenchmarkAcquiredEncode).
type BeginAcquiredResponse BeginAcquired

// VisitBeginResponse writes what Begin201JSONResponse writes.
func (r BeginAcquiredResponse) VisitBeginResponse(w http.ResponseWriter) error {
	b := make([]byte, 0, 160+len(r.Key))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, r.Attempt, 10)
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"lease_expires_at":`...)
	b = r.LeaseExpiresAt.AppendJSON(b)
	b = append(b, `,"lease_token":`...)
	b = appendString(b, r.LeaseToken)
	b = append(b, `,"recovered":`...)
	b = strconv.AppendBool(b, r.Recovered)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	return writeJSON(w, http.StatusCreated, b)
}

// FinishResponse is the 200 answer to complete and to fail, one per
// cycle: written by hand, as the generated Complete200JSONResponse and
// Fail200JSONResponse write it but for HTML escaping (encode_test.go
// checks it), without encoding/json's reflection (BenchmarkFinishEncode).
type FinishResponse FinishResult

// VisitCompleteResponse writes what Complete200JSONResponse writes.
func (r FinishResponse) VisitCompleteResponse(w http.ResponseWriter) error { return r.write(w) }

// VisitFailResponse writes what Fail200JSONResponse writes.
func (r FinishResponse) VisitFailResponse(w http.ResponseWriter) error { return r.write(w) }

// VisitCompleteStreamResponse writes a streamed complete's answer, as a complete's.
func (r FinishResponse) VisitCompleteStreamResponse(w http.ResponseWriter) error { return r.write(w) }

func (r FinishResponse) write(w http.ResponseWriter) error {
	b := make([]byte, 0, 192+len(r.Key))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, r.Attempt, 10)
	if r.CompletedAt != nil {
		b = append(b, `,"completed_at":`...)
		b = r.CompletedAt.AppendJSON(b)
	}
	b = append(b, `,"expires_at":`...)
	b = r.ExpiresAt.AppendJSON(b)
	if r.FailedAt != nil {
		b = append(b, `,"failed_at":`...)
		b = r.FailedAt.AppendJSON(b)
	}
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	if r.Retryable != nil {
		b = append(b, `,"retryable":`...)
		b = strconv.AppendBool(b, *r.Retryable)
	}
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	return writeJSON(w, http.StatusOK, b)
}

// StatusResponse is the 200 answer to status.
type StatusResponse StatusRecord

// VisitGetStatusResponse writes what GetStatus200JSONResponse writes. Its
// stored response, when asked for, is streamed as a replay's is.
func (r StatusResponse) VisitGetStatusResponse(w http.ResponseWriter) error {
	return r.WriteWithBody(w, nil)
}

// WriteWithBody writes the status as VisitGetStatusResponse does, with
// body (when not nil) as its response's body, as
// BeginReplayResponse.WriteWithBody does.
func (r StatusResponse) WriteWithBody(w http.ResponseWriter, body *BodyStream) error {
	size := 512 + len(r.Key) + len(r.Tenant)
	if body != nil {
		size += streamBuffer
	}
	for _, v := range []*string{r.Error, r.Fingerprint, r.Owner} {
		if v != nil {
			size += len(*v)
		}
	}
	if r.Response != nil {
		if r.Response.Body != nil {
			size += len(*r.Response.Body) + len(*r.Response.Body)/8
		}
		for name, value := range r.Response.Headers {
			size += 6 + len(name) + len(value)
		}
	}
	s := jsonStream{b: make([]byte, 0, min(size, streamBuffer))}
	if size > streamChunk {
		s.w = w
		w.Header()["Content-Type"] = jsonContentType
		w.WriteHeader(http.StatusOK)
	}
	s.b = append(s.b, `{"attempt":`...)
	s.b = strconv.AppendInt(s.b, r.Attempt, 10)
	s.b = append(s.b, `,"created_at":`...)
	s.b = r.CreatedAt.AppendJSON(s.b)
	if r.Error != nil {
		s.b = append(s.b, `,"error":`...)
		s.string(*r.Error)
	}
	s.b = append(s.b, `,"expires_at":`...)
	s.b = r.ExpiresAt.AppendJSON(s.b)
	if r.Fingerprint != nil {
		s.b = append(s.b, `,"fingerprint":`...)
		s.string(*r.Fingerprint)
	}
	s.b = append(s.b, `,"key":`...)
	s.string(r.Key)
	if r.LeaseExpired != nil {
		s.b = append(s.b, `,"lease_expired":`...)
		s.b = strconv.AppendBool(s.b, *r.LeaseExpired)
	}
	if r.LeaseExpiresAt != nil {
		s.b = append(s.b, `,"lease_expires_at":`...)
		s.b = r.LeaseExpiresAt.AppendJSON(s.b)
	}
	if r.Owner != nil {
		s.b = append(s.b, `,"owner":`...)
		s.string(*r.Owner)
	}
	if r.Response != nil {
		s.b = append(s.b, `,"response":`...)
		r.Response.streamJSON(&s, body)
	}
	if r.Retryable != nil {
		s.b = append(s.b, `,"retryable":`...)
		s.b = strconv.AppendBool(s.b, *r.Retryable)
	}
	s.b = append(s.b, `,"state":`...)
	s.string(string(r.State))
	s.b = append(s.b, `,"tenant":`...)
	s.string(r.Tenant)
	s.b = append(s.b, `,"updated_at":`...)
	s.b = r.UpdatedAt.AppendJSON(s.b)
	if s.w == nil {
		return writeJSON(w, http.StatusOK, s.b)
	}
	s.b = append(s.b, '}', '\n')
	s.flush()
	return s.err
}

// Sizes of a streamed answer: it is written whenever streamChunk bytes
// are buffered, and a string is escaped streamSegment bytes at a time,
// which escaping makes at most six times longer, so the buffer never
// grows past streamBuffer.
const (
	streamChunk   = 32 << 10
	streamSegment = 4 << 10
	streamBuffer  = streamChunk + 6*streamSegment + 1<<10
)

// jsonStream is an answer being encoded into b. With w set, b is written
// to w whenever it holds streamChunk bytes; after a failed write the rest
// of the answer is skipped and err says why.
type jsonStream struct {
	w   io.Writer
	b   []byte
	err error
}

// string appends v as a JSON string, as appendString does, streamSegment
// bytes of v at a time.
func (s *jsonStream) string(v string) {
	s.b = append(s.b, '"')
	for len(v) > 0 && s.err == nil {
		n := segment(v, streamSegment)
		s.b = appendEscaped(s.b, v[:n])
		v = v[n:]
		if s.w != nil && len(s.b) >= streamChunk {
			s.flush()
		}
	}
	s.b = append(s.b, '"')
}

// flush writes what is buffered.
func (s *jsonStream) flush() {
	if s.err == nil && len(s.b) > 0 {
		_, s.err = s.w.Write(s.b)
	}
	s.b = s.b[:0]
}

// segment is the length of a prefix of v of about n bytes that does not
// end inside a UTF-8 sequence, so that escaping v in such pieces writes
// what escaping it whole writes.
func segment(v string, n int) int {
	if len(v) <= n {
		return len(v)
	}
	// A sequence is one leading byte and up to three continuation bytes:
	// cut before a leading byte, or within a run of four continuation
	// bytes, which no sequence spans.
	for i := n; i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(v[i]) {
			return i
		}
	}
	return n
}

// BodyStream is a stored body written into an answer as it is read (a
// body kept compressed, decoded as it goes): its bytes as sent, encoded
// in the answer as text (escaped) or base64.
type BodyStream struct {
	R      io.Reader
	Base64 bool
}

// ErrBodyRead: a streamed body failed to read, and its answer was left
// unfinished.
var ErrBodyRead = errors.New("api: a streamed body failed to read")

// stream appends b's bytes as a JSON string, streamSegment bytes at a
// time, as string appends a string.
func (s *jsonStream) stream(b *BodyStream) {
	s.b = append(s.b, '"')
	buf := make([]byte, streamSegment)
	carry := 0 // bytes of buf kept for the next round: a cut UTF-8 sequence, or base64's remainder
	for s.err == nil {
		n, err := io.ReadFull(b.R, buf[carry:])
		n += carry
		end := err == io.EOF || err == io.ErrUnexpectedEOF
		if err != nil && !end {
			s.err = fmt.Errorf("%w: %w", ErrBodyRead, err)
			return
		}
		k := n
		switch {
		case end:
		case b.Base64:
			k -= n % 3
		default:
			k = segment(unsafe.String(unsafe.SliceData(buf), n), n-1)
		}
		if b.Base64 {
			s.b = base64.StdEncoding.AppendEncode(s.b, buf[:k])
		} else {
			s.b = appendEscaped(s.b, unsafe.String(unsafe.SliceData(buf), k))
		}
		carry = copy(buf, buf[k:n])
		if len(s.b) >= streamChunk {
			s.flush()
		}
		if end {
			break
		}
	}
	s.b = append(s.b, '"')
}

// streamJSON appends r as encoding/json does: members in field order, the
// empty ones left out, headers sorted by name; with body, that is its body.
func (r *StoredResponse) streamJSON(s *jsonStream, body *BodyStream) {
	next := byte('{') // what comes before the next member
	member := func(name string) {
		s.b = append(s.b, next, '"')
		s.b = append(s.b, name...)
		s.b = append(s.b, '"', ':')
		next = ','
	}
	switch {
	case body != nil:
		member("body")
		s.stream(body)
	case r.Body != nil:
		member("body")
		s.string(*r.Body)
	}
	if r.BodyEncoding != nil {
		member("body_encoding")
		s.string(string(*r.BodyEncoding))
	}
	if r.BodyRef != nil {
		member("body_ref")
		s.b = append(s.b, `{"sha256":`...)
		s.string(r.BodyRef.Sha256)
		s.b = append(s.b, `,"size_bytes":`...)
		s.b = strconv.AppendInt(s.b, r.BodyRef.SizeBytes, 10)
		s.b = append(s.b, `,"url":`...)
		s.string(r.BodyRef.Url)
		s.b = append(s.b, '}')
	}
	if len(r.Headers) > 0 {
		member("headers")
		s.b = append(s.b, '{')
		for i, name := range slices.Sorted(maps.Keys(r.Headers)) {
			if i > 0 {
				s.b = append(s.b, ',')
			}
			s.string(name)
			s.b = append(s.b, ':')
			s.string(r.Headers[name])
		}
		s.b = append(s.b, '}')
	}
	if r.StatusCode != nil {
		member("status_code")
		s.b = strconv.AppendInt(s.b, int64(*r.StatusCode), 10)
	}
	if next == '{' {
		s.b = append(s.b, '{')
	}
	s.b = append(s.b, '}')
}

// jsonContentType is shared by every hand-written answer; net/http only
// reads it.
var jsonContentType = []string{"application/json"}

// writeJSON ends the object in b as json.Encoder ends a value, with a
// newline, and writes it with status.
func writeJSON(w http.ResponseWriter, status int, b []byte) error {
	b = append(b, '}', '\n')
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, err := w.Write(b)
	return err
}

// appendString appends s as a JSON string, escaped as encoding/json escapes
// it with SetEscapeHTML(false): quotes, backslashes and control characters;
// invalid UTF-8 as \ufffd; U+2028 and U+2029.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// JSONStringLen is the length of s as appendString writes it. Eight bytes
// at a time while they are ASCII and no control character: then only
// quotes and backslashes, counted exactly, add a byte each.
func JSONStringLen(s string) int {
	const tops = 0x8080808080808080
	n := 2 + len(s)
	for i := 0; i < len(s); {
		if i+8 <= len(s) {
			w := le64(s[i:])
			if specialBytes8(w) == 0 { // plain text
				i += 8
				continue
			}
			if (w|controlBytes8(w))&tops == 0 {
				n += bits.OnesCount64(equalBytes8(w, '"') | equalBytes8(w, '\\'))
				i += 8
				continue
			}
		}
		if c := s[i]; c < utf8.RuneSelf {
			switch c {
			case '"', '\\', '\b', '\f', '\n', '\r', '\t':
				n++
			default:
				if c < 0x20 {
					n += 5
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			n += 6 - size
		}
		i += size
	}
	return n
}

// controlBytes8 has the top bit set of each byte of w below 0x20, and of
// no other (no carry crosses bytes: 0x7f + 0x60 < 0x100).
func controlBytes8(w uint64) uint64 {
	const low7, tops = 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	return ^((w&low7 + 0x6060606060606060) | w) & tops
}

// equalBytes8 has the top bit set of each byte of w equal to c, and of no
// other.
func equalBytes8(w uint64, c byte) uint64 {
	const ones, low7, tops = 0x0101010101010101, 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	x := w ^ ones*uint64(c)
	return ^((x&low7 + low7) | x) & tops
}

// nextSpecial is the index of the first byte of s from i on that JSON does
// not take as it is (a control character, a quote or a backslash) or that
// starts a character beyond ASCII; len(s) if there is none. It looks at
// eight bytes at a time: stored bodies are mostly plain text, and a JSON
// answer has a quote every few bytes, which it finds without a look at
// each byte before it (4 to 6 times fewer instructions per KiB than a
// byte at a time: BenchmarkEscape).
func nextSpecial(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		if m := specialBytes8(le64(s[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

// specialBytes8 has the top bit of each byte of w set that is a control
// character, a quote, a backslash or beyond ASCII, and of no byte below
// the first such one: the lowest set bit marks the first byte that needs
// a second look. Each test is the classic "has a byte less than n",
// (w - n per byte) &^ w, whose top bit is set for a byte below n and,
// through the borrow, possibly for bytes above it, never below (a byte of
// w XOR quote less than 1 is a quote).
func specialBytes8(w uint64) uint64 {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	control := (w - ones*0x20) &^ w
	quote := (w ^ ones*'"' - ones) &^ (w ^ ones*'"')
	backslash := (w ^ ones*'\\' - ones) &^ (w ^ ones*'\\')
	return (control | quote | backslash | w) & tops
}

// le64 is the first eight bytes of s as a little-endian word: one load,
// after one bounds check.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// appendEscaped appends s escaped as appendString escapes it, without the
// quotes.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0 // s[start:i] is yet to be copied
	for i := nextSpecial(s, 0); i < len(s); i = nextSpecial(s, i) {
		if c := s[i]; c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			switch r {
			case utf8.RuneError:
				b = append(b, `\ufffd`...)
			default:
				b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			}
			start = i + size
		}
		i += size
	}
	return append(b, s[start:]...)
}
