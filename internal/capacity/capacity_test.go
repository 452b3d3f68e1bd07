// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"math"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/idemsvc/idemsvc/internal/answer"
)

// TestSizeClass holds SizeClass to jemalloc's classes around the sizes
// that BenchmarkBody measured.
func TestSizeClass(t *testing.T) {
	for n, want := range map[int]int{1: 8, 9: 16, 128: 128, 129: 160, 443: 448, 680: 768, 1192: 1280, 2293: 2560,
		3946: 4096, 16558: 20480, 20480: 20480, 262318: 327680} {
		if got := SizeClass(n); got != want {
			t.Errorf("SizeClass(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestRecordBytes: a record with a 200-byte body costs what
// BenchmarkRecordOverhead measured Redis's used_memory to grow by (661 B).
func TestRecordBytes(t *testing.T) {
	if got := RecordBytes(200); got != 661 {
		t.Errorf("RecordBytes(200) = %d, want the 661 measured", got)
	}
}

// TestJSONRatio: the table is what zstd's fastest level makes of
// answer.JSON, the mean of 16 answers, and interpolates between its sizes.
func TestJSONRatio(t *testing.T) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithLowerEncoderMem(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range jsonRatios {
		var sum float64
		for seed := range uint64(16) {
			sum += float64(len(enc.EncodeAll([]byte(answer.JSON(p.size, seed+1)), nil))) / float64(p.size)
		}
		if got := sum / 16; math.Abs(got-p.ratio) > 0.002 {
			t.Errorf("JSON of %d bytes compresses to %.3f of its size, the table says %.3f", p.size, got, p.ratio)
		}
	}
	if r := JSONRatio(3000); r >= 0.361 || r <= 0.296 {
		t.Errorf("JSONRatio(3000) = %.3f, want between 2 KiB's and 4 KiB's", r)
	}
	if JSONRatio(1023) != 1 || JSONRatio(1<<30) != 0.197 {
		t.Error("JSONRatio outside the table")
	}
}

// TestModel: the worked example's figures, worked out by hand from the
// measured constants.
func TestModel(t *testing.T) {
	in := Defaults()
	in.Rate, in.Retention, in.AnswerBytes = 10000, 24*time.Hour, 2048
	res := Model(in)
	raw, zstd, ref := res.Rows[0], res.Rows[1], res.Rows[2]
	usable := 64<<30*0.75 - 64<<20
	if raw.Records != 864e6 || raw.RecordBytes != 213+2560 || raw.Masters != int(math.Ceil(864e6*2773/usable)) {
		t.Errorf("as sent: %+v", raw)
	}
	if zstd.StoredBytes != 740 || zstd.RecordBytes != 213+1024 || !zstd.Applies || zstd.VersusAsSent >= 0.5 {
		t.Errorf("compressed: %+v", zstd)
	}
	if ref.Applies || !ref.Estimated || ref.RecordBytes != 661 {
		t.Errorf("by reference: %+v", ref)
	}
	// An incompressible answer is stored as sent; a large one by reference.
	in.Compressibility = 1
	if r := Model(in).Rows[1]; r.Applies || r.StoredBytes != 2048 {
		t.Errorf("incompressible: %+v", r)
	}
	in.AnswerBytes, in.Compressibility = 1<<20, 0
	if r := Model(in).Rows[2]; !r.Applies {
		t.Errorf("a 1 MiB JSON answer is not by reference: %+v", r)
	}
}
