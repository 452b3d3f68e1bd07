// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

var (
	benchBinaryOnce sync.Once
	benchBinary     string
)

// BenchmarkBatch is a queue consumer's cost per message: a begin and a
// complete per item, as single calls or as batches of 1, 10 and 100,
// through the Go SDK, to an idemsvc binary of its own on one Redis node,
// by one caller at a time on loopback. It reports the wall time per item
// (ns/item), idemsvc's CPU per item (cpu-ns/item, from the process's
// utime and stime: without the caller's) and, for batches, the caller's
// wait per begin batch (us/begin-batch).
//
//	go test -run '^$' -bench BenchmarkBatch -benchtime 3000x -count 3 ./cmd/idemsvc
func BenchmarkBatch(b *testing.B) {
	benchBinaryOnce.Do(func() { benchBinary = idemsvcBinary(b) })
	p := startBinary(b, benchBinary, []string{
		"IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(b).Addr(), "IDEMSVC_INSECURE_NO_AUTH=true",
	})
	c, err := idem.New("http://" + p.addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := fmt.Sprintf("bench-%d-", time.Now().UnixNano())
	var seq int
	key := func() string { seq++; return run + strconv.Itoa(seq) }
	for _, size := range []int{0, 1, 10, 100} {
		name := "single"
		if size > 0 {
			name = fmt.Sprintf("batch=%d", size)
		}
		b.Run(name, func(b *testing.B) {
			var batchWait time.Duration
			batches := 0
			cpu0 := cpuTime(b, p.cmd.Process.Pid)
			b.ResetTimer()
			if size == 0 {
				for range b.N {
					r, err := c.Begin(ctx, idem.BeginParams{Key: key()})
					if err != nil || r.Lease == nil {
						b.Fatalf("begin: %v", err)
					}
					if _, err := c.Complete(ctx, r.Lease.Key, r.Lease.LeaseToken, idem.Response{Body: []byte("ok")}, 0); err != nil {
						b.Fatalf("complete: %v", err)
					}
				}
			} else {
				begins := make([]idem.BeginParams, size)
				finishes := make([]idem.FinishParams, size)
				for done := 0; done < b.N; done += size {
					for i := range begins {
						begins[i] = idem.BeginParams{Key: key()}
					}
					start := time.Now()
					res, err := c.BeginBatch(ctx, begins)
					batchWait += time.Since(start)
					batches++
					if err != nil {
						b.Fatalf("begin batch: %v", err)
					}
					for i, r := range res {
						if r.Lease == nil {
							b.Fatalf("begin batch item %d: %v", i, r.Err)
						}
						finishes[i] = idem.FinishParams{Key: r.Lease.Key, Token: r.Lease.LeaseToken, Response: idem.Response{Body: []byte("ok")}}
					}
					fin, err := c.FinishBatch(ctx, finishes)
					if err != nil || fin[0].Err != nil {
						b.Fatalf("finish batch: %v %+v", err, fin)
					}
				}
			}
			b.StopTimer()
			items := b.N
			if size > 0 {
				items = (b.N + size - 1) / size * size
				b.ReportMetric(float64(batchWait.Microseconds())/float64(batches), "us/begin-batch")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(items), "ns/item")
			b.ReportMetric(float64(cpuTime(b, p.cmd.Process.Pid)-cpu0)/float64(items), "cpu-ns/item")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// cpuTime is the user and system CPU time pid has used, in nanoseconds
// (proc(5): utime and stime, in clock ticks of 10 ms on Linux).
func cpuTime(tb testing.TB, pid int) int64 {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	// After the command: state is field 3, utime 14 and stime 15.
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("%s: %v %v", stat, err1, err2)
	}
	const tick = int64(10 * time.Millisecond)
	return (utime + stime) * tick
}
