package api

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The most frequent answers are written by hand: an acquired lease (201 to
// begin) and a finished attempt (200 to complete and fail). The generated
// responses encode by reflection into a buffer that encoding/json then
// validates and compacts; these write the same bytes, status and
// Content-Type in one pass, which encode_test.go checks against the
// generated responses.

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

// appendString appends s as a JSON string. Strings of plain printable ASCII
// are copied; anything else goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
