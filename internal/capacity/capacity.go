// SPDX-License-Identifier: Apache-2.0

// Package capacity is idemsvc's capacity model (docs/capacity.md): from a
// begin rate, a retention and an answer size, the bytes of a record, the
// Redis memory, the masters and the idemsvc instances, with bodies kept as
// sent (before compression), compressed, and by reference in a blob store.
// Every constant is a figure measured on idemsvc; docs/capacity.md says
// how. idemctl capacity prints its table.
package capacity

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strings"
	"text/tabwriter"
	"time"
)

// Measured figures (docs/capacity.md, "Where the figures come from").
const (
	// RecordFixedBytes is what Redis spends on a record besides its string's
	// allocation: the key, the value's object and the dictionary entry that
	// MEMORY USAGE counts (136 B), and the expiry's entry and the hash
	// buckets of the two dictionaries that it does not (used_memory grows
	// by 77 B more per record: BenchmarkRecordOverhead).
	RecordFixedBytes = 136 + 77
	// HeadBytes is a typical record's string without the body: the fixed
	// head, an 18-byte key, a 36-byte owner (a UUID), a 64-byte
	// fingerprint (a SHA-256 in hex), and a response with one
	// Content-Type header.
	HeadBytes = 239
	// ReferenceBytes is the body's part of a record that keeps a reference
	// to a blob store (object key, size, SHA-256, encoding). Estimated, not
	// measured: the blob store is not on this branch.
	ReferenceBytes = 200
	// BlobThresholdBytes is IDEMSVC_BLOB_THRESHOLD_BYTES's default: a
	// compressed body over it goes to the blob store.
	BlobThresholdBytes = 64 << 10
	// CompressMinBytes, CompressMaxBytes and compressMinGain are the
	// codec's rule (internal/statemachine/compress.go): a body of 1 KiB up
	// to the stored-response limit (1 MiB) is kept compressed when that
	// saves at least an eighth of it.
	CompressMinBytes = 1024
	CompressMaxBytes = 1 << 20
	compressMinGain  = 8

	// ServiceCycleMicros is idemsvc's CPU for a begin and a complete of a
	// small answer (56 µs a request, make load), RedisCycleMicros Redis's
	// (19 µs a request), on the 2-core machine of docs/performance.md.
	ServiceCycleMicros = 112
	RedisCycleMicros   = 38
	// CompressMicrosPerKiB is the CPU zstd adds to a complete per KiB of
	// answer, and CompressFixedMicros per compressed answer (the encoder's
	// set-up), from BenchmarkBody's complete, zstd beside raw.
	CompressMicrosPerKiB = 2.9
	CompressFixedMicros  = 8
)

// jsonRatios is the size of a JSON answer compressed, over its size, by
// answer size: the mean over seeds 1 to 16 of internal/answer's JSON at
// zstd's fastest level (TestJSONRatio).
var jsonRatios = []struct {
	size  int
	ratio float64
}{
	{1024, 0.489}, {1536, 0.420}, {2048, 0.361}, {4096, 0.296},
	{16 << 10, 0.221}, {64 << 10, 0.201}, {256 << 10, 0.197},
}

// JSONRatio is the measured compressed size over the size of a JSON answer
// of size bytes, interpolated on log(size); 1 under the threshold.
func JSONRatio(size int) float64 {
	if size < jsonRatios[0].size {
		return 1
	}
	for i := 1; i < len(jsonRatios); i++ {
		a, b := jsonRatios[i-1], jsonRatios[i]
		if size <= b.size {
			f := math.Log(float64(size)/float64(a.size)) / math.Log(float64(b.size)/float64(a.size))
			return a.ratio + f*(b.ratio-a.ratio)
		}
	}
	return jsonRatios[len(jsonRatios)-1].ratio
}

// Input is what a deployment has to serve, and what it runs on.
type Input struct {
	Rate        float64       // begins per second, each completed with an answer
	Retention   time.Duration // how long a record is kept
	AnswerBytes int           // body bytes of an answer
	// Compressibility is the answer's compressed size over its size (zstd
	// at its fastest level, as `zstd -1` gives it); 0 for a JSON answer
	// as measured here (JSONRatio).
	Compressibility float64
	MasterBytes     int64   // memory of a Redis master's machine
	MaxmemoryRatio  float64 // maxmemory over MasterBytes (room for forks and fragmentation)
	ReserveBytes    int64   // IDEMSVC_REDIS_RESERVE_BYTES
	RedisCPUShare   float64 // share of a Redis master's one core to use at most
	InstanceCores   float64 // cores of an idemsvc instance
	CPUShare        float64 // share of an instance's cores to use at most
}

// Defaults returns an Input with the deployment defaults of
// docs/capacity.md and no workload.
func Defaults() Input {
	return Input{MasterBytes: 64 << 30, MaxmemoryRatio: 0.75, ReserveBytes: 64 << 20,
		RedisCPUShare: 0.5, InstanceCores: 2, CPUShare: 0.6}
}

// Check reports the first field out of range.
func (in Input) Check() error {
	switch {
	case in.Rate <= 0 || math.IsInf(in.Rate, 0) || math.IsNaN(in.Rate):
		return errors.New("--rate: must be a positive number of begins per second")
	case in.Retention < time.Second:
		return errors.New("--retention: must be at least 1s")
	case in.AnswerBytes < 0 || in.AnswerBytes > 64<<20:
		return errors.New("--answer-bytes: must be 0 to 67108864")
	case in.Compressibility < 0 || in.Compressibility > 1.1 || math.IsNaN(in.Compressibility):
		return errors.New("--compressibility: must be a ratio over 0 and at most 1.1 (compressed size over size), or json")
	case in.MasterBytes < 1<<20:
		return errors.New("--master-bytes: must be at least 1 MiB")
	case in.MaxmemoryRatio <= 0 || in.MaxmemoryRatio > 1:
		return errors.New("--maxmemory-ratio: must be over 0 and at most 1")
	case in.ReserveBytes < 0 || float64(in.ReserveBytes) >= float64(in.MasterBytes)*in.MaxmemoryRatio:
		return errors.New("--reserve-bytes: must be 0 or more and under maxmemory")
	case in.RedisCPUShare <= 0 || in.RedisCPUShare > 1 || in.CPUShare <= 0 || in.CPUShare > 1:
		return errors.New("--redis-cpu-share and --cpu-share: must be over 0 and at most 1")
	case in.InstanceCores <= 0:
		return errors.New("--instance-cores: must be positive")
	}
	return nil
}

// Row is one way of storing the answers.
type Row struct {
	Name          string
	Estimated     bool    // from an estimate, not a measurement
	StoredBytes   int     // the body as the record holds it
	RecordBytes   int     // Redis memory per record
	Records       float64 // records within the retention
	RedisBytes    float64 // Redis memory for them all
	Masters       int     // Redis masters, by memory and by CPU
	ServiceCores  float64 // idemsvc's cores
	Instances     int     // idemsvc instances
	VersusAsSent  float64 // RedisBytes over the as-sent row's
	Applies       bool    // idemsvc stores this answer this way
	MastersByMem  int
	MastersByCPU  int
	CompressMicro float64 // CPU per complete added by compression
}

// Result is the model's answer: the rows as sent (before compression),
// compressed, and by reference.
type Result struct {
	Input Input
	Ratio float64 // the compressibility used
	Rows  []Row
}

// Model computes the table for in, which must pass Check.
func Model(in Input) Result {
	ratio := in.Compressibility
	if ratio == 0 {
		ratio = JSONRatio(in.AnswerBytes)
	}
	compressed := in.AnswerBytes
	c := int(math.Ceil(float64(in.AnswerBytes) * ratio))
	if in.AnswerBytes >= CompressMinBytes && in.AnswerBytes <= CompressMaxBytes && c <= in.AnswerBytes-in.AnswerBytes/compressMinGain {
		compressed = c
	}
	compressMicros := 0.0
	if compressed < in.AnswerBytes {
		compressMicros = CompressFixedMicros + CompressMicrosPerKiB*float64(in.AnswerBytes)/1024
	}
	res := Result{Input: in, Ratio: ratio}
	res.Rows = []Row{
		in.row("as sent (before compression)", in.AnswerBytes, 0, false, true),
		in.row("compressed (zstd)", compressed, compressMicros, false, compressed < in.AnswerBytes),
		in.row("by reference (blob store)", ReferenceBytes, compressMicros, true, c > BlobThresholdBytes),
	}
	for i := range res.Rows {
		res.Rows[i].VersusAsSent = res.Rows[i].RedisBytes / res.Rows[0].RedisBytes
	}
	return res
}

func (in Input) row(name string, stored int, compressMicros float64, estimated, applies bool) Row {
	r := Row{Name: name, Estimated: estimated, StoredBytes: stored, Applies: applies, CompressMicro: compressMicros}
	r.RecordBytes = RecordBytes(stored)
	r.Records = in.Rate * in.Retention.Seconds()
	r.RedisBytes = r.Records * float64(r.RecordBytes)
	usable := float64(in.MasterBytes)*in.MaxmemoryRatio - float64(in.ReserveBytes)
	r.MastersByMem = int(math.Ceil(r.RedisBytes / usable))
	r.MastersByCPU = int(math.Ceil(in.Rate * RedisCycleMicros / 1e6 / in.RedisCPUShare))
	r.Masters = max(r.MastersByMem, r.MastersByCPU, 1)
	r.ServiceCores = in.Rate * (ServiceCycleMicros + compressMicros) / 1e6
	r.Instances = max(2, int(math.Ceil(r.ServiceCores/(in.InstanceCores*in.CPUShare)))) // two at least: one may fail
	return r
}

// RecordBytes is the Redis memory of a completed record whose body takes
// stored bytes in it: the string's allocation, in jemalloc's size class,
// and the fixed cost of a key.
func RecordBytes(stored int) int {
	n := HeadBytes + stored
	switch { // the sds header and its terminating NUL
	case n < 1<<8:
		n += 3 + 1
	case n < 1<<16:
		n += 5 + 1
	default:
		n += 9 + 1
	}
	return RecordFixedBytes + SizeClass(n)
}

// SizeClass is the allocation jemalloc (Redis's allocator) makes for n
// bytes: 8, multiples of 16 to 128, then four classes in each doubling.
func SizeClass(n int) int {
	switch {
	case n <= 8:
		return 8
	case n <= 128:
		return (n + 15) &^ 15
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1)
	step := 1 << (k - 2)
	return (n + step - 1) &^ (step - 1)
}

// Print writes the table of res to w.
func (res Result) Print(w io.Writer) error {
	in := res.Input
	var b strings.Builder
	fmt.Fprintf(&b, "%s begins/s, retention %s, answers of %s (compressed: %.3f of their size%s)\n",
		group(in.Rate), durationString(in.Retention), bytesString(float64(in.AnswerBytes)), res.Ratio, map[bool]string{true: ", JSON as measured", false: ""}[in.Compressibility == 0])
	fmt.Fprintf(&b, "records kept: %s; masters of %s with maxmemory %.0f%% less a %s reserve; instances of %g cores at %.0f%%\n\n",
		group(res.Rows[0].Records), bytesString(float64(in.MasterBytes)), 100*in.MaxmemoryRatio, bytesString(float64(in.ReserveBytes)), in.InstanceCores, 100*in.CPUShare)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "body stored as\tbody bytes in the record\tbytes per record\tRedis memory\tvs as sent\tmasters (memory, CPU)\tidemsvc cores\tidemsvc instances\t")
	for _, r := range res.Rows {
		name := r.Name
		if r.Estimated {
			name += " *"
		}
		if !r.Applies {
			name += " -"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%.2fx\t%d (%d, %d)\t%.2f\t%d\t\n", name, r.StoredBytes, r.RecordBytes,
			bytesString(r.RedisBytes), r.VersusAsSent, r.Masters, r.MastersByMem, r.MastersByCPU, r.ServiceCores, r.Instances)
	}
	tw.Flush()
	b.WriteString("\n* estimated: a reference of about 200 bytes in place of the body\n")
	b.WriteString("- not how idemsvc stores this answer: ")
	b.WriteString("it compresses bodies of 1 KiB to 1 MiB that shrink by an eighth, and sends bodies whose compressed size is over 64 KiB to a blob store when one is configured\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// durationString prints d without its zero minutes and seconds: 24h, 90m.
func durationString(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// bytesString prints n bytes in binary units, to three figures.
func bytesString(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 || n >= 100 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	if n >= 10 {
		return fmt.Sprintf("%.1f %s", n, units[i])
	}
	return fmt.Sprintf("%.2f %s", n, units[i])
}

// group prints n rounded, with thousands separated by commas.
func group(n float64) string {
	s := fmt.Sprintf("%.0f", n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
