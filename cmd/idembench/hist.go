// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math/bits"
	"time"
)

// histogram counts durations in log-linear buckets, HDR style: exact below
// 128 ns, and above that 128 buckets per power of two, so a percentile is
// off by less than 1%. Recording is an index computation and an increment;
// the bucket array grows only with the largest value seen.
type histogram struct {
	counts []uint64
	n      uint64
	max    time.Duration
}

const subBits = 7 // 1<<subBits buckets per power of two

func bucketOf(v time.Duration) int {
	if v < 1<<subBits {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	return (shift+1)<<subBits + int(uint64(v)>>shift) - 1<<subBits
}

// valueOf returns the middle of bucket i.
func valueOf(i int) time.Duration {
	if i < 1<<subBits {
		return time.Duration(i)
	}
	shift := i>>subBits - 1
	low := uint64(i&(1<<subBits-1)+1<<subBits) << shift
	return time.Duration(low + (1<<shift)/2)
}

func (h *histogram) record(d time.Duration) {
	i := bucketOf(d)
	if i >= len(h.counts) {
		h.counts = append(h.counts, make([]uint64, i+1-len(h.counts)+64)...)
	}
	h.counts[i]++
	h.n++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	if len(o.counts) > len(h.counts) {
		h.counts = append(h.counts, make([]uint64, len(o.counts)-len(h.counts))...)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the value below which a fraction q of the samples fall.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return min(valueOf(i), h.max)
		}
	}
	return h.max
}
