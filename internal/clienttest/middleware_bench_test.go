// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

// BenchmarkMiddleware is one idempotent request through idem.Middleware
// with the SDK's defaults (a begin and a complete on an idemsvc served in
// process, over the memory store), the application's side called directly:
// its figures are the middleware's and the SDK's, plus idemsvc's, which
// share the process. Compare revisions side by side.
func BenchmarkMiddleware(b *testing.B) {
	svc := startIdemsvc(b, nil)
	h := idem.Middleware(newClient(b, svc.URL, idem.WithAPIKey("sk_bench")), idem.MiddlewareOptions{})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"pay_1","status":"ok"}`))
		}))
	for _, bc := range []struct {
		name    string
		headers []string
	}{
		{"raw", nil},
		// The canonical form of the JSON body, and the digest of the caller's credentials.
		{"json-authorization", []string{"Content-Type", "application/json", "Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			prefix := "bench-" + bc.name + strconv.Itoa(b.N) + "-"
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":100,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3"}`))
				req.Header.Set("Idempotency-Key", `"`+prefix+strconv.Itoa(i)+`"`)
				for j := 0; j+1 < len(bc.headers); j += 2 {
					req.Header.Set(bc.headers[j], bc.headers[j+1])
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("%d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
