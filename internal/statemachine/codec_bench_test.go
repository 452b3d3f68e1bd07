// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"encoding/base64"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/answer"
)

// BenchmarkResponseCodec measures the codec alone, without Redis: the CPU
// and allocations of encoding a response for a complete and decoding it
// for a replay, for JSON answers, random bytes and random bytes in base64
// (a token or ciphertext sent as text), kept raw and compressed. With
// random bytes the zstd encoder's attempt is the only cost: the body is
// kept raw.
//
//	go test -run '^$' -bench BenchmarkResponseCodec -count 3 ./internal/statemachine/
func BenchmarkResponseCodec(b *testing.B) {
	kinds := []struct {
		name string
		body func(n int) string
	}{
		{"json", func(n int) string { return answer.JSON(n, 1) }},
		{"random", func(n int) string { return answer.Incompressible(n, 1) }},
		{"base64", func(n int) string { return base64.StdEncoding.EncodeToString([]byte(answer.Incompressible(n*3/4, 1))) }},
	}
	for _, k := range kinds {
		for _, size := range []int{1 << 10, 16 << 10, 256 << 10} {
			for _, mode := range []string{"raw", "zstd"} {
				r := Response{StatusCode: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: k.body(size)}
				name := k.name + "/" + itoaKiB(size) + "/" + mode
				threshold := compressMinBytes
				if mode == "raw" {
					threshold = math.MaxInt
				}
				b.Run(name+"/encode", func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(size))
					var n int
					start := cpuTime()
					for b.Loop() {
						n = len(EncodeResponse(&r, threshold))
					}
					b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
					b.ReportMetric(float64(n)/float64(size), "x-body")
				})
				b.Run(name+"/decode", func(b *testing.B) {
					form := EncodeResponse(&r, threshold)
					b.ReportAllocs()
					b.SetBytes(int64(size))
					start := cpuTime()
					for b.Loop() {
						if got, err := decodeResponse(form, 1<<20, false); err != nil || len(got.Body) != size {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

func itoaKiB(n int) string {
	switch n {
	case 1 << 10:
		return "1KiB"
	case 16 << 10:
		return "16KiB"
	}
	return "256KiB"
}

// cpuTime is the CPU time this process has spent, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
