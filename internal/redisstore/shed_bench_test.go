// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// BenchmarkBurst sends 1,000 begins on new keys at once to an idle
// idemsvc on one Redis, over connections opened beforehand, with the
// default slots, and reports how long the burst took to drain (the last
// answer, and the median) and how many were refused. Run it with
// -benchtime 1x -count 3 and take the medians.
func BenchmarkBurst(b *testing.B) {
	const n = 1000
	svc, store := burstService(b)
	conns := dialAll(b, svc.URL, n)
	var last, median, refused []float64
	round := 0
	for b.Loop() {
		idemtest.Eventually(b, time.Minute, "idle", func() bool { return store.InFlight() == 0 && store.Queued() == 0 })
		round++
		answers := sendAll(b, conns, func(i int) string { return fmt.Sprintf(`{"key":"bench-burst-%d-%d"}`, round, i) })
		took := make([]time.Duration, 0, n)
		bad := 0
		for _, a := range answers {
			took = append(took, a.took)
			if a.status != http.StatusCreated {
				bad++
			}
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		last = append(last, ms(took[n-1]))
		median = append(median, ms(took[n/2]))
		refused = append(refused, float64(bad))
	}
	b.ReportMetric(medianOf(last), "drain-ms")
	b.ReportMetric(medianOf(median), "median-ms")
	b.ReportMetric(medianOf(refused), "refused")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkOverload measures shedding where the store is what is
// overloaded: Redis answers 50 ms late (a hook on the client, as a slow
// network would) and 16 scripts run at a time, so idemsvc serves about 320
// begins a second while the machine's CPU has room to spare (on 2 cores a
// storm at three times idemsvc's CPU-bound rate overloads the load
// generator and the kernel before the store: that is the connection cap's
// business, not the store's). It runs begins on new keys in a closed loop
// (16 callers, one per slot, 2 s), then an open-loop storm at three times that rate for
// 3 s on keep-alive connections, and reports the begins acquired per
// second under the storm as a share of the closed loop's (overload-ratio),
// and how fast the rest are refused once the queue stands (refusal-p50-ms,
// refusal-p99-ms, from the storm's second half). Run it with -benchtime 1x
// -count 3 and take the medians.
func BenchmarkOverload(b *testing.B) {
	srv := redistest.NewServer(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 16 + 32})
	b.Cleanup(func() { client.Close() })
	client.AddHook(slowRedis(50 * time.Millisecond))
	store := redisstore.New(client, redisstore.Options{MaxInFlight: 16, Timeout: 30 * time.Second})
	svc := idemtest.Serve(b, handlers.Config{Store: store})
	round := 0
	for b.Loop() {
		round++
		closed := closedLoop(b, svc.URL, fmt.Sprint("closed-", round), 16, 2*time.Second)
		rate := 3 * closed
		const storm = 3 * time.Second
		var (
			mu       sync.Mutex
			refusals []time.Duration
			acquired atomic.Int64
			wg       sync.WaitGroup
		)
		tr := &http.Transport{MaxIdleConnsPerHost: 2000, MaxConnsPerHost: 2000}
		hc := &http.Client{Transport: tr, Timeout: time.Minute}
		begun := time.Now()
		for n := 0; time.Since(begun) < storm; time.Sleep(time.Millisecond) {
			for owed := int(time.Since(begun).Seconds() * rate); n < owed; n++ {
				body := fmt.Sprintf(`{"key":"storm-%d-%d"}`, round, n)
				late := time.Since(begun) > storm/2
				wg.Go(func() {
					start := time.Now()
					resp, err := hc.Post(svc.URL+"/v1/begin", "application/json", strings.NewReader(body))
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					took := time.Since(start)
					switch resp.StatusCode {
					case http.StatusCreated:
						acquired.Add(1)
					case http.StatusServiceUnavailable:
						if late {
							mu.Lock()
							refusals = append(refusals, took)
							mu.Unlock()
						}
					}
				})
			}
		}
		wg.Wait()
		elapsed := time.Since(begun)
		tr.CloseIdleConnections()
		sort.Slice(refusals, func(i, j int) bool { return refusals[i] < refusals[j] })
		under := float64(acquired.Load()) / elapsed.Seconds()
		b.ReportMetric(closed, "closed-begins/s")
		b.ReportMetric(under, "storm-begins/s")
		b.ReportMetric(under/closed, "overload-ratio")
		b.ReportMetric(ms(percentile(refusals, 50)), "refusal-p50-ms")
		b.ReportMetric(ms(percentile(refusals, 99)), "refusal-p99-ms")
		b.ReportMetric(0, "ns/op")
	}
}

// closedLoop runs begins on new keys from callers callers, each on a
// keep-alive connection of its own, for d, and returns the begins per
// second acquired.
func closedLoop(tb testing.TB, base, prefix string, callers int, d time.Duration) float64 {
	tb.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: callers, MaxConnsPerHost: callers}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var done atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for c := range callers {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				resp, err := hc.Post(base+"/v1/begin", "application/json",
					strings.NewReader(fmt.Sprintf(`{"key":"%s-%d-%d"}`, prefix, c, i)))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func medianOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
