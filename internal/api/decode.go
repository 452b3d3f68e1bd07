// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The request bodies decode strictly, with encoding/json/v2's semantics
// (github.com/go-json-experiment/json is its upstream, kept by the Go
// team; Go 1.26 builds encoding/json/v2 itself only with GOEXPERIMENT):
// member names match exactly, unknown and repeated members are errors,
// invalid UTF-8 and lone surrogates are errors rather than U+FFFD, and so
// is a null where a string must be (a header value, say). A body that is
// not one JSON object is an error too. Every error is a
// *statemachine.InvalidError naming the field at fault.

// Body is a request body read in full, which decodeBody decodes without
// copying it.
type Body struct {
	*bytes.Reader
	b []byte
}

// NewBody returns b as a request body.
func NewBody(b []byte) *Body { return &Body{Reader: bytes.NewReader(b), b: b} }

// Close implements io.Closer.
func (*Body) Close() error { return nil }

// decodeBody decodes r's JSON body into v strictly; the generated handlers
// call it for every operation that takes a body.
func decodeBody(r *http.Request, v any) error {
	if b, ok := r.Body.(*Body); ok {
		return decodeStrict(b.b, v)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return &statemachine.InvalidError{Reason: "could not be read in full"}
	}
	return decodeStrict(data, v)
}

// strict is the decoding of every request body.
var strict = json.JoinOptions(
	json.RejectUnknownMembers(true),
	json.WithUnmarshalers(json.UnmarshalFromFunc(func(dec *jsontext.Decoder, s *string) error {
		// A string that may not be absent may not be null either; an
		// optional one (*string) is absent when null, before this runs.
		if dec.PeekKind() == 'n' {
			return &json.SemanticError{JSONKind: 'n', GoType: reflect.TypeFor[string]()}
		}
		return errors.ErrUnsupported // decode it as usual
	})),
)

// DecodeItem decodes one item of a batch, the JSON object b, into v as
// the body of its single call would be decoded.
func DecodeItem(b []byte, v any) error { return decodeStrict(b, v) }

// DecodeItemKind decodes the members of v from the JSON object b, ignoring
// the others: a batch item's kind, before the item is decoded as its
// kind's body.
func DecodeItemKind(b []byte, v any) error {
	if rest := bytes.TrimLeft(b, " \t\r\n"); len(rest) == 0 || rest[0] != '{' {
		return &statemachine.InvalidError{Reason: "must be a JSON object"}
	}
	if err := json.Unmarshal(b, v, strict, json.RejectUnknownMembers(false)); err != nil {
		return fieldError(b, err)
	}
	return nil
}

// decodeStrict decodes the JSON object b into v.
func decodeStrict(b []byte, v any) error {
	if rest := bytes.TrimLeft(b, " \t\r\n"); len(rest) == 0 || rest[0] != '{' {
		return &statemachine.InvalidError{Reason: "must be a JSON object"}
	}
	if err := json.Unmarshal(b, v, strict); err != nil {
		return fieldError(b, err)
	}
	return nil
}

// fieldError says which field of body err is about, and what is wrong
// with it, in the API's terms rather than Go's.
func fieldError(body []byte, err error) error {
	var syntax *jsontext.SyntacticError
	var semantic *json.SemanticError
	switch {
	case errors.As(err, &syntax):
		field := fieldOf(syntax.JSONPointer)
		switch {
		case errors.Is(syntax.Err, jsontext.ErrDuplicateName):
			return &statemachine.InvalidError{Field: field, Reason: "appears more than once"}
		case jsontext.Value(body).IsValid(jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true)):
			// Valid JSON but for its text: invalid UTF-8 or a lone
			// surrogate escape, which would not replay byte for byte.
			return &statemachine.InvalidError{Field: field, Reason: "is not valid UTF-8 (a binary body goes as base64)"}
		}
		return &statemachine.InvalidError{Reason: "is not valid JSON"}
	case errors.As(err, &semantic):
		field := fieldOf(semantic.JSONPointer)
		switch {
		case errors.Is(semantic.Err, json.ErrUnknownName):
			return &statemachine.InvalidError{Field: field, Reason: "is not a known field"}
		case errors.Is(semantic.Err, strconv.ErrRange):
			return &statemachine.InvalidError{Field: field, Reason: "is out of range"}
		}
		return &statemachine.InvalidError{Field: field, Reason: "must be " + jsonKind(semantic.GoType)}
	}
	return &statemachine.InvalidError{Reason: "is not valid JSON"}
}

// fieldOf is the API's name of the field a JSON pointer points into:
// "/response/headers/X-A" is "response.headers", as a header's name is a
// key of the headers map, not a field.
func fieldOf(p jsontext.Pointer) string {
	var names []string
	for name := range p.Tokens() {
		names = append(names, name)
		if name == "headers" {
			break
		}
	}
	return strings.Join(names, ".")
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "of another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "of another type"
}
