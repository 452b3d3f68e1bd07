package api

import (
	"encoding/json"
	"strconv"
)

// MarshalJSON encodes the most frequent answer, an acquired lease, without
// reflection; it writes what encoding/json would.
func (r Begin201JSONResponse) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 192+len(r.Key))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, r.Attempt, 10)
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"lease_expires_at":`...)
	t, _ := r.LeaseExpiresAt.MarshalJSON() // MilliTime never fails
	b = append(b, t...)
	b = append(b, `,"lease_token":`...)
	b = appendString(b, r.LeaseToken)
	b = append(b, `,"recovered":`...)
	b = strconv.AppendBool(b, r.Recovered)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	return append(b, '}'), nil
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
