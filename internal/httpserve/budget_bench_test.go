// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"bytes"
	"context"
	"testing"
)

// BenchmarkReadBody is a begin's body read under the budget: the take,
// the read and the give.
func BenchmarkReadBody(b *testing.B) {
	budget := NewBudget(256<<20, 2, true, nil, "bench")
	body := []byte(`{"key":"order-42/charge","fingerprint":"sha256:9f86d081884c7d659a2feaa0c55ad015","lease_ms":30000}`)
	ctx := context.Background()
	r := bytes.NewReader(body)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(body)
		_, taken, err := budget.ReadBody(ctx, r, int64(len(body)), 2<<20, Claim{Tenant: "acme"})
		if err != nil {
			b.Fatal(err)
		}
		budget.Give(taken, Claim{Tenant: "acme"})
	}
}
