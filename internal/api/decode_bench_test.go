// SPDX-License-Identifier: Apache-2.0

package api

import "testing"

// What one request body costs to decode, as the generated handlers decode
// it (decodeBody).
func BenchmarkDecode(b *testing.B) {
	for name, body := range map[string]string{
		"begin":         `{"key":"order-42/charge","owner":"3f2a9c0d5b7e41c8","lease_ms":30000}`,
		"complete-1KiB": `{"key":"order-42/charge","lease_token":"3f2a9c0d5b7e41c8a6d09e2f7b1c4a55","response":{"status_code":201,"headers":{"Content-Type":"application/json","Location":"/charges/ch_1"},"body":"` + string(make([]byte, 0)) + `{\"id\":\"ch_1\",\"note\":\"` + repeat("x", 960) + `\"}"}}`,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			data := []byte(body)
			for b.Loop() {
				var r CompleteRequest
				var q BeginRequest
				var err error
				if name == "begin" {
					err = decodeStrict(data, &q)
				} else {
					err = decodeStrict(data, &r)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func repeat(s string, n int) string {
	out := make([]byte, 0, n*len(s))
	for range n {
		out = append(out, s...)
	}
	return string(out)
}
