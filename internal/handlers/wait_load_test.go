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

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redistest"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// TestWaitersLoadRedisBoundedly parks 1,000 waiting begins on 10 keys in
// progress and counts the commands Redis runs meanwhile: one status read
// per waited key per poll interval, not per waiter. Then it completes the
// keys and checks that every waiter gets the completed response.
func TestWaitersLoadRedisBoundedly(t *testing.T) {
	const (
		keys     = 10
		waiters  = 1000
		interval = 25 * time.Millisecond
		window   = time.Second
	)
	srv := redistest.NewServer(t)
	rdb := srv.Client(t)
	e := start(t, handlers.Config{
		Store:            statemachine.NewRedisStore(srv.Client(t), statemachine.RedisOptions{}),
		WaitPollInterval: interval,
	})
	e.http.Transport.(*http.Transport).MaxConnsPerHost = 0
	e.http.Transport.(*http.Transport).MaxIdleConnsPerHost = waiters
	c := e.as(t, "")
	tokens := make([]string, keys)
	for i := range tokens {
		tokens[i] = c.acquire(idem.BeginRequest{Key: fmt.Sprintf("wait-load-%d", i)}).LeaseToken
	}

	var answered, completed atomic.Int64
	failed := make(chan error, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			wait := int64(20_000)
			r, err := c.c.BeginWithResponse(bg, idem.BeginRequest{Key: fmt.Sprintf("wait-load-%d", i%keys), WaitMs: &wait})
			if err != nil {
				failed <- err
				return
			}
			answered.Add(1)
			if r.StatusCode() == http.StatusOK && r.JSON200 != nil && r.JSON200.Status == idem.FinishedStateCompleted {
				completed.Add(1)
			}
		})
	}
	metrics := func() string {
		resp, body := e.raw(t, http.MethodGet, "/metrics", "", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("metrics: %d", resp.StatusCode)
		}
		return string(body)
	}
	waitFor(t, metrics, waiters, failed)

	before := scriptCalls(t, rdb)
	time.Sleep(window)
	during := scriptCalls(t, rdb) - before
	// At most one status read per key per interval, with room for a tick
	// of scheduling slack each; a poll per waiter would be 100 times more.
	limit := int64(keys) * (int64(window/interval) + 2)
	t.Logf("%d waiters on %d keys: Redis ran %d scripts in %v (limit %d)", waiters, keys, during, window, limit)
	if during > limit {
		t.Errorf("Redis ran %d scripts in %v for %d waiters on %d keys, over %d", during, window, waiters, keys, limit)
	}

	start := time.Now()
	for i, tok := range tokens {
		c.mustComplete(idem.CompleteRequest{Key: fmt.Sprintf("wait-load-%d", i), LeaseToken: tok})
	}
	wg.Wait()
	t.Logf("all %d waiters answered %v after the completions", waiters, time.Since(start).Round(time.Millisecond))
	if answered.Load() != waiters || completed.Load() != waiters {
		t.Errorf("%d of %d waiters answered, %d with the completed response", answered.Load(), waiters, completed.Load())
	}
}

// waitFor waits until the idemsvc_waiters gauge shows n.
// A waiter's request that failed, sent on failed, ends the wait.
func waitFor(t *testing.T, metrics func() string, n int, failed <-chan error) {
	t.Helper()
	want := fmt.Sprintf("idemsvc_waiters %d\n", n)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-failed:
			t.Fatalf("a waiter's begin failed: %v", err)
		default:
		}
		m := metrics()
		if strings.Contains(m, want) {
			return
		}
		if time.Now().After(deadline) {
			i := strings.Index(m, "\nidemsvc_waiters ") + 1
			t.Fatalf("waiting for %d waiters; the gauge says %s", n, m[i:i+strings.IndexByte(m[i:], '\n')])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWaiterLatency measures how soon a waiter answers after the
// completion it waits for: within a poll interval and a round trip.
func TestWaiterLatency(t *testing.T) {
	e := start(t, handlers.Config{
		Store: statemachine.NewRedisStore(redistest.SharedServer(t).Client(t), statemachine.RedisOptions{}),
	})
	c := e.as(t, "")
	metrics := func() string {
		_, body := e.raw(t, http.MethodGet, "/metrics", "", nil)
		return string(body)
	}
	var latencies []time.Duration
	for i := range 20 {
		key := fmt.Sprintf("wait-latency-%d-%d", time.Now().UnixNano(), i)
		tok := c.acquire(idem.BeginRequest{Key: key}).LeaseToken
		answered := make(chan time.Time, 1)
		go func() {
			wait := int64(10_000)
			r, err := c.c.BeginWithResponse(bg, idem.BeginRequest{Key: key, WaitMs: &wait})
			if err != nil || r.StatusCode() != http.StatusOK {
				t.Errorf("waiter: %v %v", r.Status(), err)
			}
			answered <- time.Now()
		}()
		waitFor(t, metrics, 1, nil)
		c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: tok})
		completed := time.Now()
		latencies = append(latencies, (<-answered).Sub(completed))
	}
	slices.Sort(latencies)
	t.Logf("waiter answered after the completion's reply: median %v, max %v (poll interval %v)",
		latencies[len(latencies)/2].Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond),
		handlers.DefaultWaitPollInterval)
}

// scriptCalls is the number of scripts Redis has run: every transition
// and status read is one.
func scriptCalls(t *testing.T, rdb *redis.Client) int64 {
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
