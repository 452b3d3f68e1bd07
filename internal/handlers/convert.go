// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"encoding/base64"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// toResponse decodes a response to store.
func toResponse(r *api.StoredResponse) (statemachine.Response, error) {
	var out statemachine.Response
	if r == nil {
		return out, nil
	}
	if r.StatusCode != nil {
		out.StatusCode = *r.StatusCode
		if out.StatusCode == 0 { // zero means "none" to the store
			return out, statemachine.ErrStatusCode
		}
	}
	out.Headers = r.Headers
	encoding := api.BodyEncodingText
	if r.BodyEncoding != nil {
		encoding = *r.BodyEncoding
	}
	switch encoding {
	case api.BodyEncodingText:
		if r.Body != nil {
			out.Body = *r.Body
		}
	case api.BodyEncodingBase64:
		out.Base64 = true
		if r.Body != nil {
			b, err := base64.StdEncoding.DecodeString(*r.Body)
			if err != nil {
				return out, badField("response.body", "is not valid base64")
			}
			out.Body = string(b)
		}
	default:
		return out, badField("response.body_encoding", `must be "text" or "base64"`)
	}
	return out, nil
}

// apiState is the API's name of a record's state.
func apiState(s statemachine.State) api.State {
	switch s {
	case statemachine.StateInProgress:
		return api.StateInProgress
	case statemachine.StateCompleted:
		return api.StateCompleted
	case statemachine.StateFailed:
		return api.StateFailed
	}
	return api.State(s.String()) // a corrupt record's: "State(n)"
}

// stateOf is the state the API names s, or 0 (which a store refuses as
// no state) for a name it does not know.
func stateOf(s api.State) statemachine.State {
	switch s {
	case api.StateInProgress:
		return statemachine.StateInProgress
	case api.StateCompleted:
		return statemachine.StateCompleted
	case api.StateFailed:
		return statemachine.StateFailed
	}
	return 0
}

// fromResponse encodes a stored response as it was given.
func fromResponse(r statemachine.Response) api.StoredResponse {
	var out api.StoredResponse
	if r.StatusCode != 0 {
		code := r.StatusCode
		out.StatusCode = &code
	}
	out.Headers = r.Headers
	if r.Body == "" && r.Zstd != "" { // written as it is decoded (streamedBody)
		encoding := api.BodyEncodingText
		if r.Base64 {
			encoding = api.BodyEncodingBase64
		}
		out.BodyEncoding = &encoding
	} else if len(r.Body) > 0 || r.Base64 {
		var body string
		encoding := api.BodyEncodingText
		if r.Base64 {
			encoding = api.BodyEncodingBase64
			body = base64.StdEncoding.EncodeToString([]byte(r.Body))
		} else {
			body = r.Body
		}
		out.Body = &body
		out.BodyEncoding = &encoding
	}
	return out
}

// optional returns a pointer to v, or nil for the zero value.
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// millis is t for the API; nil for the zero time.
func millis(t time.Time) *api.MilliTime {
	if t.IsZero() {
		return nil
	}
	m := api.NewMilliTime(t)
	return &m
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}
