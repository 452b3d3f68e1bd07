// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
// (ns/item), idemsvc's CPU per item (cpu-ns/item: its threads' time, as
// the scheduler counts it) and, for batches, the caller's wait per begin
// batch (us/begin-batch), with the wait's parts: Redis's time per item
// (redis-us/item, from INFO commandstats: the time Redis spent running
// commands, one after another) and the caller's CPU per item
// (caller-cpu-ns/item: the SDK's, this process's threads' time).
//
//	go test -run '^$' -bench BenchmarkBatch -benchtime 3000x -count 3 ./cmd/idemsvc
func BenchmarkBatch(b *testing.B) {
	benchBinaryOnce.Do(func() { benchBinary = idemsvcBinary(b) })
	redis := redistest.SharedServer(b)
	p := startBinary(b, benchBinary, []string{
		"IDEMSVC_REDIS_URL=redis://" + redis.Addr(), "IDEMSVC_INSECURE_NO_AUTH=true",
	})
	rdb := redis.Client(b)
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
			cpu0, self0, redis0 := cpuTime(b, p.cmd.Process.Pid), cpuTime(b, os.Getpid()), redisUsec(b, rdb)
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
			b.ReportMetric(float64(cpuTime(b, os.Getpid())-self0)/float64(items), "caller-cpu-ns/item")
			b.ReportMetric(float64(redisUsec(b, rdb)-redis0)/float64(items), "redis-us/item")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// redisUsec is the time Redis spent running commands so far, in
// microseconds: the sum of INFO commandstats' usec.
func redisUsec(tb testing.TB, rdb *redis.Client) int64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sum int64
	for line := range strings.Lines(info) {
		// cmdstat_evalsha:calls=3,usec=30,usec_per_call=10.00,...
		_, stats, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		_, usec, _ := strings.Cut(stats, ",usec=")
		usec, _, _ = strings.Cut(usec, ",")
		n, err := strconv.ParseInt(usec, 10, 64)
		if err != nil {
			tb.Fatalf("%q: %v", line, err)
		}
		sum += n
	}
	return sum
}

// cpuTime is the CPU time pid's threads have used, in nanoseconds: the
// sum of their /proc/<pid>/task/<tid>/schedstat's first field, which the
// scheduler keeps to the nanosecond (utime and stime in /proc/<pid>/stat
// count 10 ms ticks, too coarse for a batch's share). A Go process's
// threads last as long as it does.
func cpuTime(tb testing.TB, pid int) int64 {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		tb.Fatalf("threads of %d: %v", pid, err)
	}
	var sum int64
	for _, task := range tasks {
		stat, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that ended meanwhile
		}
		ns, _, _ := strings.Cut(string(stat), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			tb.Fatalf("%s: %q: %v", task, stat, err)
		}
		sum += n
	}
	return sum
}
