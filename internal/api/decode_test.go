// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		field string // the field the error names; "-" for success
	}{
		{"all fields", `{"key":"k","fingerprint":"f","owner":"o","lease_ms":100,"retention_s":1,"wait_ms":0,"tenant":"t"}`, "-"},
		{"nulls are absent", `{"key":"k","owner":null}`, "-"},
		{"unknown field", `{"key":"k","color":"red"}`, "color"},
		{"field names are case sensitive", `{"Key":"k"}`, "Key"},
		{"repeated field", `{"key":"a","key":"b"}`, "key"},
		{"wrong type", `{"key":"k","lease_ms":"100"}`, "lease_ms"},
		{"fraction", `{"key":"k","lease_ms":1.5}`, "lease_ms"},
		{"overflow", `{"key":"k","lease_ms":1e30}`, "lease_ms"},
		{"array", `[]`, ""},
		{"null", `null`, ""},
		{"string", `"k"`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r BeginRequest
			err := decodeStrict([]byte(tt.body), &r)
			if tt.field == "-" {
				if err != nil {
					t.Fatalf("decode %s: %v", tt.body, err)
				}
				return
			}
			var fe *statemachine.InvalidError
			if !errors.As(err, &fe) {
				t.Fatalf("decode %s: got %v, want a *statemachine.InvalidError", tt.body, err)
			}
			if fe.Field != tt.field {
				t.Errorf("decode %s: field %q, want %q (%v)", tt.body, fe.Field, tt.field, err)
			}
		})
	}
}

func TestDecodeNestedResponse(t *testing.T) {
	tests := []struct {
		body, field string
	}{
		{`{"key":"k","lease_token":"t","response":{"headers":{"A":1}}}`, "response.headers"},
		{`{"key":"k","lease_token":"t","response":{"status":200}}`, "response.status"},
		{`{"key":"k","lease_token":"t","response":[]}`, "response"},
		{`{"key":"k","lease_token":"t","response":{"status_code":"200"}}`, "response.status_code"},
	}
	for _, tt := range tests {
		var r CompleteRequest
		err := decodeStrict([]byte(tt.body), &r)
		var fe *statemachine.InvalidError
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("decode %s: got %v, want a *statemachine.InvalidError for %q", tt.body, err, tt.field)
		}
	}
	var r CompleteRequest
	body := `{"key":"k","lease_token":"t","response":{"status_code":201,"headers":{"A":"b"},"body":"x","body_encoding":"base64"}}`
	if err := decodeStrict([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if *r.Response.StatusCode != 201 || r.Response.Headers["A"] != "b" || *r.Response.Body != "x" || *r.Response.BodyEncoding != BodyEncodingBase64 {
		t.Errorf("decoded %+v", r.Response)
	}
}

// FuzzDecode checks the strict decoding: it never panics, fails only with a
// *statemachine.InvalidError, accept only valid JSON objects whose
// members are all fields of the type, and what they accept re-encodes to
// the same value. testdata/fuzz holds the corpus.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"key":"order-1","fingerprint":"sha256:ab","owner":"req-1","lease_ms":30000,"retention_s":86400,"wait_ms":100}`,
		`{"key":"k","lease_token":"3f2a9c0d5b7e41c8a6d09e2f7b1c4a55","response":{"status_code":201,"headers":{"Content-Type":"application/json"},"body":"{}","body_encoding":"text"},"retention_s":60}`,
		`{"key":"k","lease_token":"t","retryable":false,"error":"declined","response":{"body":"AAE=","body_encoding":"base64"},"tenant":"ops"}`,
		`{"key":"k","lease_token":"t","lease_ms":1000}`,
		`{"key":"{}*?\\","KEY":"x"}`,
		`{"key":"a","key":"b"}`,
		`{"response":{"headers":{"a":null}}}`,
		`{"key":"\u00e9\ud800"}`,
		`{"lease_ms":-0,"wait_ms":9223372036854775808}`,
		`{`, `}`, `[`, `null`, `1`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkStrict[BeginRequest](t, data)
		checkStrict[CompleteRequest](t, data)
		checkStrict[FailRequest](t, data)
		checkStrict[ExtendRequest](t, data)
	})
}

func checkStrict[T any](t *testing.T, data []byte) {
	var strict T
	err := decodeStrict(data, &strict)
	if err != nil {
		var fe *statemachine.InvalidError
		if !errors.As(err, &fe) {
			t.Fatalf("%T: %q: error %v (%T) is not a *statemachine.InvalidError", strict, data, err, err)
		}
		return
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		t.Fatalf("%T: %q: accepted, but it is not a JSON object: %v", strict, data, err)
	}
	fields := jsonFields(reflect.TypeFor[T]())
	for name := range members {
		if !fields[name] {
			t.Fatalf("%T: %q: accepted the unknown member %q", strict, data, name)
		}
	}
	again, err := json.Marshal(strict)
	if err != nil {
		t.Fatalf("%T: re-encode %+v: %v", strict, strict, err)
	}
	var decoded T
	if err := json.Unmarshal(again, &decoded); err != nil {
		t.Fatalf("%T: %s: decoding its own encoding: %v", strict, again, err)
	}
	// Compared as JSON: an empty map and an absent one encode alike.
	if twice, err := json.Marshal(decoded); err != nil || !bytes.Equal(again, twice) {
		t.Fatalf("%T: %q encodes as %s, which round-trips to %s (%v)", strict, data, again, twice, err)
	}
}

// jsonFields is the set of JSON member names of a struct type.
func jsonFields(t reflect.Type) map[string]bool {
	names := make(map[string]bool)
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names[name] = true
	}
	return names
}

// What encoding/json would accept by changing it is refused: invalid UTF-8,
// a lone surrogate, a null header value; a surrogate pair and an escaped
// backslash before "ud800" are fine.
func TestStrictStrings(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"body":"\ud83d\ude00"}`:    true,
		`{"body":"a\\ud800"}`:        true,
		`{"body":"\u00e9"}`:          true,
		`{"body":"\ud800"}`:          false,
		`{"body":"\udc00x"}`:         false,
		`{"body":"\ud800\u0041"}`:    false,
		"{\"body\":\"caf\xe9\"}":     false,
		`{"headers":{"A":"b"}}`:      true,
		`{"headers":{"A":null}}`:     false,
		`{"headers":{"A":"\ud800"}}`: false,
	} {
		var r CompleteRequest
		if err := decodeStrict([]byte(`{"key":"k","lease_token":"t","response":`+body+`}`), &r); (err == nil) != ok {
			t.Errorf("%q: %v; want accepted %v", body, err, ok)
		}
	}
}
