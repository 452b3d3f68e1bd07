// SPDX-License-Identifier: Apache-2.0

// Package answer makes the response bodies that tests, benchmarks and
// idembench store: JSON answers that compress as real ones do, and
// incompressible bodies. It imports nothing of idemsvc, so that every
// package's tests may use it, and it is not a test kit (internal/testkit):
// idembench links it.
package answer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// JSON returns a JSON API answer of exactly size bytes (at least
// 64), the same for the same size and seed: a page of orders as a payments
// API returns them, with random identifiers, e-mail addresses, amounts and
// times, so that it compresses as real answers do rather than as repeated
// text does. The compression figures of docs/capacity.md are measured on it.
func JSON(size int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0x1de))
	var b strings.Builder
	b.Grow(size + 1024)
	b.WriteString(`{"object":"list","data":[`)
	first, names := true, []string{"ana", "ben", "chloe", "dmitri", "eva", "farid", "grace", "hiro", "ines", "jonas"}
	start := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	for b.Len() < size {
		if !first {
			b.WriteByte(',')
		}
		first = false
		name := names[rng.IntN(len(names))]
		fmt.Fprintf(&b, `{"id":"ord_%s","customer":{"id":"cus_%s","email":"%s.%s@example.com"},`+
			`"amount":%d,"currency":"%s","status":"%s","created_at":"%s","items":[`,
			ident(rng, 16), ident(rng, 12), name, ident(rng, 4), 100+rng.IntN(99900),
			[]string{"EUR", "USD", "GBP"}[rng.IntN(3)], []string{"paid", "pending", "refunded"}[rng.IntN(3)],
			start.Add(time.Duration(rng.IntN(86400))*time.Second).Format(time.RFC3339))
		for i := range 1 + rng.IntN(3) {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"sku":"SKU-%05d","quantity":%d,"unit_amount":%d}`, rng.IntN(100000), 1+rng.IntN(5), 100+rng.IntN(9900))
		}
		fmt.Fprintf(&b, `],"metadata":{"channel":"%s","attempt":%d}}`, []string{"web", "ios", "android", "pos"}[rng.IntN(4)], 1+rng.IntN(3))
	}
	// Cut to size where an order ends, and fill the rest with a note of
	// words, so that the answer stays valid JSON of exactly size bytes.
	s := b.String()
	const open, tail = `],"note":"`, `"}`
	if size < 64 {
		panic(fmt.Sprintf("answer: a JSON answer of %d bytes is too small", size))
	}
	end := strings.LastIndex(s[:size-len(open)-len(tail)], `}}`) + 2
	if end < 2 {
		end = len(`{"object":"list","data":[`) // no whole order fits
	}
	b.Reset()
	b.WriteString(s[:end])
	b.WriteString(open)
	for n := size - b.Len() - len(tail); n > 0; {
		w := words[rng.IntN(len(words))] + " "
		w = w[:min(len(w), n)]
		b.WriteString(w)
		n -= len(w)
	}
	b.WriteString(tail)
	return b.String()
}

var words = strings.Fields(`the order was paid by card and shipped from the warehouse in two parcels
	customer asked for delivery after six pm refund issued for one item damaged in transit
	invoice sent by e-mail loyalty points added to the account gift wrapping requested`)

const identChars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func ident(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = identChars[rng.IntN(len(identChars))]
	}
	return string(b)
}

// Incompressible returns size random bytes, the same for the same seed: a
// body that idemsvc stores as sent, for tests of what a record costs when
// compression cannot help (an image, ciphertext).
func Incompressible(size int, seed uint64) string {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	b := make([]byte, size)
	rand.NewChaCha8(s).Read(b)
	return string(b)
}
