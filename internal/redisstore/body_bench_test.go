// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"crypto/sha256"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// BenchmarkBody measures what a stored JSON answer costs, kept as sent
// (raw, as before compression), zstd-compressed, and by reference to the
// blob store (ref: the record holds the object's key, size and SHA-256),
// at 1 KiB, 16 KiB, 256 KiB and 1 MiB, on a standalone Redis of its own:
//
//   - complete: a Complete of a key begun beforehand (outside the timer);
//   - replay: a Begin of a completed key, which replays its answer, and
//     the reading of its body: a long compressed one (from
//     sm.StreamBodiesFrom) decoded as a replay writes it, through
//     OpenBody and a 4 KiB buffer (ref: the record only; the body comes
//     from the blob store).
//
// Besides runParallel's figures, each reports the CPU this process spent
// per call (cpu-µs/op: user and system, idemsvc's codec and the client),
// and the record's bytes in Redis (MEMORY USAGE, the mean of 16 records:
// redis-B/record) and their ratio to the answer's size (x-body). Completes
// keep their records 10 s, so that a long run does not fill the machine's
// memory. docs/capacity.md quotes them:
//
//	go test -run '^$' -bench BenchmarkBody -benchtime 1000x -count 5 ./internal/redisstore/
func BenchmarkBody(b *testing.B) {
	for _, mode := range []string{"raw", "zstd", "ref"} {
		for _, size := range []int{1 << 10, 16 << 10, 256 << 10, 1 << 20} {
			name := mode + "/" + strconv.Itoa(size>>10) + "KiB"
			if size == 1<<20 {
				size -= 64 // room for its header within the 1 MiB limit
			}
			body := answer.JSON(size, 1)
			from := 0 // the default threshold
			if mode == "raw" {
				from = math.MaxInt
			}
			resp := bodyResponse(body)
			if mode == "ref" {
				resp = refResponse(body)
			}
			b.Run(name+"/complete", func(b *testing.B) { benchComplete(b, from, resp) })
			b.Run(name+"/replay", func(b *testing.B) { benchReplay(b, from, resp) })
		}
	}
}

// refResponse is bodyResponse(body) with its body by reference, under an
// object key as long as idemsvc's: prefix, tenant, expiry day, the record
// key's SHA-256 and the lease token.
func refResponse(body string) sm.Response {
	r := bodyResponse("")
	r.Ref = &sm.BodyRef{Object: "idem/payments/2026-11-29/" + strings.Repeat("9f86d081", 8) + "/AAECAwQFBgcICQoLDA0ODw",
		Size: int64(len(body)), SHA256: sha256.Sum256([]byte(body))}
	return r
}

func bodyResponse(body string) sm.Response {
	return sm.Response{StatusCode: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}
}

// bodyStore is benchStore's store with bodies compressed from from bytes
// (0: the default threshold; math.MaxInt: never, as before compression).
func bodyStore(b *testing.B, from int) (*redisstore.Store, *redis.Client) {
	// A complete of 1 MiB sent as it is takes Redis longer than the
	// default timeout when 16 run at once on a loaded machine.
	return benchStoreWith(b, redisstore.Options{Limits: sm.Limits{CompressBodiesFrom: from}, Timeout: 30 * time.Second})
}

func benchComplete(b *testing.B, from int, resp sm.Response) {
	store, client := bodyStore(b, from)
	tenant := idemtest.Unique("bench")
	tokens := beginKeys(b, store, tenant)
	cpu := startCPU()
	runParallel(b, client, func(i int64) error {
		_, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: "order-" + strconv.FormatInt(i, 10), Token: tokens[i], Response: resp, Retention: 10 * time.Second})
		return err
	})
	b.ReportMetric(cpu.micros()/float64(b.N), "cpu-µs/op")
	reportRecordBytes(b, store, client, resp)
}

func benchReplay(b *testing.B, from int, resp sm.Response) {
	store, client := bodyStore(b, from)
	tenant := idemtest.Unique("bench")
	const keys = 16
	for i := range keys {
		key := "order-" + strconv.Itoa(i)
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: resp}); err != nil {
			b.Fatal(err)
		}
	}
	res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "order-0", StreamedBody: true})
	if err != nil {
		b.Fatal(err)
	}
	if got := readAll(b, &res.Record.Response); got != resp.Body {
		b.Fatalf("replayed %d bytes, not the %d stored", len(got), len(resp.Body))
	}
	cpu := startCPU()
	runParallel(b, client, func(i int64) error {
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "order-" + strconv.FormatInt(i%keys, 10), StreamedBody: true})
		if err != nil {
			return err
		}
		rc := res.Record.Response.OpenBody()
		defer rc.Close()
		buf := make([]byte, 4<<10)
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, buf)
		if err == nil && n != int64(len(resp.Body)) {
			b.Fatalf("replayed %d bytes, not the %d stored", n, len(resp.Body))
		}
		return err
	})
	b.ReportMetric(cpu.micros()/float64(b.N), "cpu-µs/op")
}

// readAll reads r's body whole.
func readAll(b *testing.B, r *sm.Response) string {
	rc := r.OpenBody()
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		b.Fatal(err)
	}
	return string(got)
}

// reportRecordBytes completes 16 records with resp and reports their mean
// MEMORY USAGE (SAMPLES 0: every byte counted).
func reportRecordBytes(b *testing.B, store sm.Store, client *redis.Client, resp sm.Response) {
	b.Helper()
	tenant := idemtest.Unique("size")
	const n = 16
	var total int64
	for i := range n {
		key := "order-" + strconv.Itoa(i)
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key, Owner: "7f9c2ba4-e88f-4a2c-9d4e-3b1f0c6a8d21"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: resp}); err != nil {
			b.Fatal(err)
		}
		usage, err := client.MemoryUsage(ctx, redisstore.Key(tenant, key), 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		total += usage
	}
	size := resp.BodySize()
	if resp.Ref != nil {
		size = resp.Ref.Size
	}
	b.ReportMetric(float64(total)/n, "redis-B/record")
	b.ReportMetric(float64(total)/n/float64(size), "x-body")
}

// BenchmarkRecordOverhead measures what a record costs Redis beyond what
// MEMORY USAGE counts (the expiry's entry, the dictionaries' buckets):
// used_memory's growth over 100,000 completed records with a 200-byte body,
// per record, beside their mean MEMORY USAGE. docs/capacity.md adds the
// difference to every record.
//
//	go test -run '^$' -bench BenchmarkRecordOverhead -benchtime 1x -count 3 ./internal/redisstore/
func BenchmarkRecordOverhead(b *testing.B) {
	for b.Loop() {
		store, client := benchStore(b)
		const n = 100000
		used := func() int64 {
			info, err := client.Info(ctx, "memory").Result()
			if err != nil {
				b.Fatal(err)
			}
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
					u, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					return u
				}
			}
			b.Fatal("no used_memory")
			return 0
		}
		tenant := idemtest.Unique("size")
		body := answer.Incompressible(200, 1)
		before := used()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchCallers {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
					key := "order-" + strconv.FormatInt(100000+i, 10)
					res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key, Owner: "7f9c2ba4-e88f-4a2c-9d4e-3b1f0c6a8d21",
						Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"})
					if err == nil {
						_, err = store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: bodyResponse(body)})
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		grown := float64(used()-before) / n
		var usage int64
		for i := range 100 {
			u, err := client.MemoryUsage(ctx, redisstore.Key(tenant, "order-"+strconv.Itoa(100000+i)), 0).Result()
			if err != nil {
				b.Fatal(err)
			}
			usage += u
		}
		b.ReportMetric(grown, "used_memory-B/record")
		b.ReportMetric(float64(usage)/100, "redis-B/record")
		b.ReportMetric(grown-float64(usage)/100, "uncounted-B/record")
	}
}

// processCPU is the CPU time this process has spent since startCPU, user
// and system: on a shared machine, a benchmark's own cost, where its wall
// time also counts the time others had the cores.
type processCPU struct{ start time.Duration }

func startCPU() processCPU { return processCPU{cpuTime()} }

func (c processCPU) micros() float64 { return float64(cpuTime()-c.start) / float64(time.Microsecond) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
