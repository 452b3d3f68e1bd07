// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// The benchmarks run 64 callers (RunParallel with parallelism 32 on two
// cores, see benchCallers) against a standalone Redis of their own, and
// report throughput and Redis's own time per script call next to the usual
// ns/op and allocs/op. benchmarks/redis-baseline.sh runs the same scripts
// through redis-benchmark for comparison.

const benchCallers = 64

func benchStore(b *testing.B) (*redisstore.Store, *redis.Client) {
	return benchStoreWith(b, redisstore.Options{})
}

// benchStoreWith is benchStore with opts.
func benchStoreWith(b *testing.B, opts redisstore.Options) (*redisstore.Store, *redis.Client) {
	srv := redistest.NewServer(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: benchCallers})
	b.Cleanup(func() { client.Close() })
	return redisstore.New(client, opts), client
}

// runParallel runs op from benchCallers goroutines and reports ops/s and
// the Redis time per script call.
func runParallel(b *testing.B, client *redis.Client, op func(i int64) error) {
	var next atomic.Int64
	b.SetParallelism(max(1, benchCallers/runtimeProcs()))
	client.ConfigResetStat(ctx)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(next.Add(1) - 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(scriptMicros(b, client), "redis-µs/call")
}

// scriptMicros reads INFO commandstats: the mean µs of an EVALSHA.
func scriptMicros(b *testing.B, client *redis.Client) float64 {
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for field := range strings.SplitSeq(strings.TrimSpace(rest), ",") {
				if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
					f, _ := strconv.ParseFloat(v, 64)
					return f
				}
			}
		}
	}
	return 0
}

func BenchmarkBeginNewKey(b *testing.B) {
	store, client := benchStore(b)
	tenant := idemtest.Unique("bench")
	runParallel(b, client, func(i int64) error {
		_, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "order-" + strconv.FormatInt(i, 10)})
		return err
	})
}

func BenchmarkBeginCompletedKey(b *testing.B) {
	store, client := benchStore(b)
	tenant, key := idemtest.Unique("bench"), "order-1"
	res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
	if err != nil {
		b.Fatal(err)
	}
	resp := sm.Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: strings.Repeat("x", 1024)}
	if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: resp}); err != nil {
		b.Fatal(err)
	}
	runParallel(b, client, func(int64) error {
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
		if err == nil && len(res.Record.Response.Body) != 1024 {
			b.Fatalf("replayed %d bytes, want 1024", len(res.Record.Response.Body))
		}
		return err
	})
}

// beginKeys begins the keys order-0 to order-(b.N-1) of tenant, from
// benchCallers goroutines, and returns their lease tokens.
func beginKeys(b *testing.B, store *redisstore.Store, tenant string) []string {
	tokens := make([]string, b.N)
	var prepared atomic.Int64
	var wg sync.WaitGroup
	for range benchCallers {
		wg.Go(func() {
			for i := prepared.Add(1) - 1; i < int64(b.N); i = prepared.Add(1) - 1 {
				res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "order-" + strconv.FormatInt(i, 10)})
				if err != nil {
					b.Error(err)
					return
				}
				tokens[i] = res.Lease.Token
			}
		})
	}
	wg.Wait()
	return tokens
}

func BenchmarkComplete(b *testing.B) {
	store, client := benchStore(b)
	tenant := idemtest.Unique("bench")
	tokens := beginKeys(b, store, tenant)
	resp := sm.Response{StatusCode: 201, Body: `{"id":"ch_1","amount":1200}`}
	runParallel(b, client, func(i int64) error {
		_, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: "order-" + strconv.FormatInt(i, 10), Token: tokens[i], Response: resp})
		return err
	})
}

func BenchmarkMemoryBeginNewKey(b *testing.B) {
	store := sm.NewMemoryStore(sm.Limits{})
	tenant := idemtest.Unique("bench")
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "order-" + strconv.FormatInt(next.Add(1), 10)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
