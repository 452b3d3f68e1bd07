// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"reflect"
	"strings"
	"testing"
)

// A response whose body is in the blob store keeps its reference, and an
// inline one stays as it was.
func TestResponseRefRoundTrip(t *testing.T) {
	ref := &BodyRef{Object: "p/acme/2026-11-28/ab/cd", Size: 40 << 20, Encoding: "", SHA256: [32]byte{1, 2, 3, 31: 9}}
	for _, r := range []Response{
		{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"}, Ref: ref},
		{Ref: &BodyRef{Object: "o", Size: 0, Encoding: "zstd"}},
		{StatusCode: 200, Body: "inline", Base64: true},
		{StatusCode: 200, Body: strings.Repeat(`{"a":1},`, 4096)}, // compressed
		{Ref: &BodyRef{Object: "o", Size: 5}, Base64: true},
	} {
		got, err := decodeResponse(EncodeResponse(&r, 1), 1<<20, false)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("%+v came back as %+v, %v", r, got, err)
		}
	}
	for _, raw := range []string{"\x08\x00\xc8\x00\x00\x00\x00short", "\x08\x00\xc8\x00\x00\x00\x00" + string(make([]byte, 41))} {
		if _, err := decodeResponse(raw, 1<<20, false); err == nil {
			t.Errorf("%q decoded", raw)
		}
	}
}
