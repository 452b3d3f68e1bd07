// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestWaitersLoadRedisBoundedly parks 1,000 waiting begins on 1,000
// distinct keys in progress and counts the commands a Redis dedicated to
// the test runs meanwhile: the contract allows no command per waiter while
// nothing changes, and a fallback read per waited key at most once a
// second. Then it completes the keys and checks that every waiter gets the
// completed response.
func TestWaitersLoadRedisBoundedly(t *testing.T) {
	const (
		keys   = 1000
		window = 5 * time.Second
	)
	srv := redistest.NewPrivateServer(t) // counted: no other test's traffic on it
	rdb := srv.Client(t)
	// A store timeout long enough for 1,000 begins at once on a busy
	// machine, none of them refused as overload: the test counts commands,
	// not latency.
	store := redisstore.New(srv.Client(t), redisstore.Options{Timeout: time.Minute, MaxInFlight: keys})
	// Waits long enough for every waiter to park on a slow machine.
	e := start(t, handlers.Config{Store: store, MaxWait: 10 * time.Minute})
	e.http.Transport.(*http.Transport).MaxConnsPerHost = 0
	e.http.Transport.(*http.Transport).MaxIdleConnsPerHost = keys
	c := e.as(t, "")
	prefix := idemtest.Unique("wait-load")
	names := make([]string, keys)
	tokens := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		res, err := store.Begin(t.Context(), handlers.DefaultTenant, statemachine.BeginRequest{Key: names[i], Lease: 10 * time.Minute})
		must(t, err)
		tokens[i] = res.Lease.Token
	}

	var completed atomic.Int64
	failed := make(chan error, keys)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			r, err := c.c.BeginWithResponse(bg, idem.BeginRequest{Key: name, WaitMs: ptr[int64](600_000)})
			switch {
			case err != nil:
				failed <- err
			case r.StatusCode() != http.StatusOK || r.JSON200 == nil || r.JSON200.Status != idem.FinishedStateCompleted:
				failed <- fmt.Errorf("waiter's answer: %d %s", r.StatusCode(), r.Body)
			default:
				completed.Add(1)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Minute)
	for e.metricValue(t, "idemsvc_waiters") != keys {
		select {
		case err := <-failed:
			t.Fatalf("a waiter: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d waiters; %v wait", keys, e.metricValue(t, "idemsvc_waiters"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Past the read each key's watch makes as it comes into force: the
	// count reaches keys once most are in force (early keys may have made
	// their first fallback read meanwhile), and a fallback interval later
	// every watch has long been in force, and only fallback reads remain.
	idemtest.Eventually(t, time.Minute, "every watch in force", func() bool {
		return e.metricValue(t, "idemsvc_wait_polls_total") >= keys
	})
	time.Sleep(handlers.DefaultWaitFallbackInterval)

	scripts := scriptCalls(t, rdb)
	before := commandsProcessed(t, rdb)
	time.Sleep(window)
	// Every command counts, those that scripts run too; not the INFOs.
	during := commandsProcessed(t, rdb) - before - 1
	scripts = scriptCalls(t, rdb) - scripts
	limit := int64(keys * window / time.Second)
	t.Logf("%d waiters on %d keys: in %v Redis ran %d commands (%.0f/s; the test allows %d/s), of which %d scripts (%.0f/s)",
		keys, keys, window, during, float64(during)/window.Seconds(), keys, scripts, float64(scripts)/window.Seconds())
	if during > limit {
		t.Errorf("Redis ran %d commands in %v for %d waiters on %d keys, over %d", during, window, keys, keys, limit)
	}

	start := time.Now()
	for i, name := range names {
		_, err := store.Complete(t.Context(), handlers.DefaultTenant, statemachine.CompleteRequest{Key: name, Token: tokens[i]})
		must(t, err)
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Errorf("a waiter: %v", err)
	}
	t.Logf("all %d waiters answered %v after the completions began", keys, time.Since(start).Round(time.Millisecond))
	if completed.Load() != keys {
		t.Errorf("%d of %d waiters got the completed response", completed.Load(), keys)
	}
}

// scriptCalls is the number of scripts Redis has run (EVALSHA and EVAL):
// every transition and status read is one.
func scriptCalls(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\r\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(line, cmd+"calls="); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				total += n
			}
		}
	}
	return total
}

// commandsProcessed is Redis's count of the commands it ran.
func commandsProcessed(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(t.Context(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no total_commands_processed in INFO stats")
	return 0
}

// TestWaiterLatency measures how soon a waiter answers after the
// completion it waits for, on each store. The contract says 10 ms at the
// 99th percentile, median 2 ms, on a service that is not saturated; the
// test allows a median of 5 ms and a 99th percentile of 50 ms, because it
// runs with the race detector on machines shared with other tests.
// BenchmarkWaiterLatency measures it precisely.
func TestWaiterLatency(t *testing.T) {
	for _, b := range idemtest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			e := start(t, handlers.Config{Store: b.Open(t), WaitFallbackInterval: time.Minute})
			latencies := waiterLatencies(t, e, 100)
			// The 99th of 100 samples, the 100th being the slowest.
			median, p99 := latencies[len(latencies)/2], latencies[len(latencies)*99/100-1]
			t.Logf("waiter answered after the completion's reply: median %v, p99 %v, slowest %v", median, p99, latencies[len(latencies)-5:])
			if median > 5*time.Millisecond || p99 > 50*time.Millisecond {
				t.Errorf("waiter latency: median %v (limit 5ms), p99 %v (limit 50ms)", median, p99)
			}
		})
	}
}

// waiterLatencies parks one waiter at a time on a key in progress,
// completes the key and returns, sorted, the times from the completion's
// answer to the waiter's.
func waiterLatencies(tb testing.TB, e *env, n int) []time.Duration {
	tb.Helper()
	c, err := idem.NewClientWithResponses(e.url, idem.WithHTTPClient(e.http))
	if err != nil {
		tb.Fatal(err)
	}
	prefix := idemtest.Unique("wait-latency")
	latencies := make([]time.Duration, 0, n)
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		r, err := c.BeginWithResponse(tb.Context(), idem.BeginRequest{Key: key})
		if err != nil || r.JSON201 == nil {
			tb.Fatalf("begin: %v", err)
		}
		// The waiter reports to this goroutine, which alone fails the test.
		type answer struct {
			at     time.Time
			status int
			err    error
		}
		answered := make(chan answer, 1)
		go func() {
			r, err := c.BeginWithResponse(bg, idem.BeginRequest{Key: key, WaitMs: ptr[int64](10_000)})
			a := answer{at: time.Now(), err: err}
			if r != nil {
				a.status = r.StatusCode()
			}
			answered <- a
		}()
		for waiting(tb, e) != 1 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(2 * time.Millisecond) // let the watch come into force
		done, err := c.CompleteWithResponse(tb.Context(), idem.CompleteRequest{Key: key, LeaseToken: r.JSON201.LeaseToken})
		completed := time.Now()
		a := <-answered
		if err != nil || done.StatusCode() != http.StatusOK {
			tb.Fatalf("complete: %v %s", err, done.Body)
		}
		if a.err != nil || a.status != http.StatusOK {
			tb.Fatalf("waiter: %d %v", a.status, a.err)
		}
		latencies = append(latencies, a.at.Sub(completed))
	}
	slices.Sort(latencies)
	return latencies
}

// waiting reads the idemsvc_waiters gauge of e.
func waiting(tb testing.TB, e *env) float64 {
	tb.Helper()
	return idemtest.Metric(tb, e.url, "idemsvc_waiters", "")
}
