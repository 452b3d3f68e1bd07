package api

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The most frequent answers are written by hand: an acquired lease (201 to
// begin), a replayed outcome (200 to begin) and a finished attempt (200 to
// complete and fail). The generated responses encode by reflection into a
// buffer that encoding/json then validates and compacts; these write the
// same bytes, status and Content-Type in one pass, which encode_test.go
// checks against the generated responses.

// BeginAcquiredResponse is the 201 answer to a begin that acquired the key.
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

// BeginReplayResponse is the 200 answer to a begin on a finished key.
type BeginReplayResponse BeginReplay

// VisitBeginResponse writes what Begin200JSONResponse writes.
func (r BeginReplayResponse) VisitBeginResponse(w http.ResponseWriter) error {
	size := 256 + len(r.Key)
	if r.Error != nil {
		size += len(*r.Error)
	}
	if r.Response.Body != nil {
		size += len(*r.Response.Body) + len(*r.Response.Body)/8 // room for some escapes
	}
	for name, value := range r.Response.Headers {
		size += 6 + len(name) + len(value)
	}
	b := make([]byte, 0, size)
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, r.Attempt, 10)
	if r.CompletedAt != nil {
		b = append(b, `,"completed_at":`...)
		b = r.CompletedAt.AppendJSON(b)
	}
	if r.Error != nil {
		b = append(b, `,"error":`...)
		b = appendString(b, *r.Error)
	}
	if r.FailedAt != nil {
		b = append(b, `,"failed_at":`...)
		b = r.FailedAt.AppendJSON(b)
	}
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"response":`...)
	b = r.Response.appendJSON(b)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	return writeJSON(w, http.StatusOK, b)
}

// appendJSON appends r as encoding/json does: members in field order, the
// empty ones left out, headers sorted by name.
func (r *StoredResponse) appendJSON(b []byte) []byte {
	open := len(b)
	b = append(b, '{')
	if r.Body != nil {
		b = appendMember(b, open, "body")
		b = appendString(b, *r.Body)
	}
	if r.BodyEncoding != nil {
		b = appendMember(b, open, "body_encoding")
		b = appendString(b, string(*r.BodyEncoding))
	}
	if len(r.Headers) > 0 {
		b = appendMember(b, open, "headers")
		headers := len(b)
		b = append(b, '{')
		for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
			if len(b) > headers+1 {
				b = append(b, ',')
			}
			b = appendString(b, name)
			b = append(b, ':')
			b = appendString(b, r.Headers[name])
		}
		b = append(b, '}')
	}
	if r.StatusCode != nil {
		b = appendMember(b, open, "status_code")
		b = strconv.AppendInt(b, int64(*r.StatusCode), 10)
	}
	return append(b, '}')
}

// appendMember appends a member's name to the object that starts at
// b[open], after a comma unless it is the first.
func appendMember(b []byte, open int, name string) []byte {
	if len(b) > open+1 {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// FinishedResponse is the 200 answer to complete and fail.
type FinishedResponse FinishResult

// VisitCompleteResponse writes what Complete200JSONResponse writes.
func (r FinishedResponse) VisitCompleteResponse(w http.ResponseWriter) error {
	return writeJSON(w, http.StatusOK, r.appendJSON())
}

// VisitFailResponse writes what Fail200JSONResponse writes.
func (r FinishedResponse) VisitFailResponse(w http.ResponseWriter) error {
	return writeJSON(w, http.StatusOK, r.appendJSON())
}

func (r FinishedResponse) appendJSON() []byte {
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
	return b
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
// it: quotes, backslashes and control characters; <, > and & as \u003c,
// \u003e and \u0026; invalid UTF-8 as \ufffd; U+2028 and U+2029.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0 // s[start:i] is yet to be copied
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
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
	b = append(b, s[start:]...)
	return append(b, '"')
}
