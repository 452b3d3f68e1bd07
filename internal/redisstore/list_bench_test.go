// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// BenchmarkList100k lists 100,000 completed records of one tenant (1 KiB
// responses) on a standalone Redis that also holds 100,000 of another
// tenant's, a page of 1,000 at a time, and measures what a listing costs
// live traffic: begins per second from 16 callers alone, then while
// listings run back to back.
//
//	go test -run '^$' -bench BenchmarkList100k -benchtime 1x ./internal/redisstore/
func BenchmarkList100k(b *testing.B) {
	const n = 100_000
	store, client := benchStore(b)
	tenant := idemtest.Unique("t")
	body := string(make([]byte, 1024))
	parallel := func(count int, op func(i int)) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for i := int(next.Add(1)); i <= count; i = int(next.Add(1)) {
					op(i)
				}
			})
		}
		wg.Wait()
	}
	for _, t := range []string{tenant, idemtest.Unique("other")} {
		parallel(n, func(i int) {
			key := fmt.Sprintf("k-%d", i)
			res, err := store.Begin(ctx, t, sm.BeginRequest{Key: key})
			if err == nil {
				_, err = store.Complete(ctx, t, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: sm.Response{Body: body}})
			}
			if err != nil {
				b.Fatal(err)
			}
		})
	}
	listIn := func(state sm.State) int {
		req := sm.ListRequest{State: state, Limit: sm.MaxListLimit}
		count := 0
		for {
			page, err := store.List(ctx, tenant, req)
			if err != nil {
				b.Fatal(err)
			}
			count += len(page.Records)
			if page.NextCursor == "" {
				return count
			}
			req.Cursor = page.NextCursor
		}
	}
	listAll := func() int { return listIn(sm.StateCompleted) }
	live := func(d time.Duration, stop <-chan struct{}) float64 {
		var done atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		live := idemtest.Unique("live")
		for w := range 16 {
			wg.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					if _, err := store.Begin(ctx, live, sm.BeginRequest{Key: fmt.Sprintf("%d-%d", w, i)}); err == nil {
						done.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return float64(done.Load()) / d.Seconds()
	}

	cpu := func() float64 {
		info, err := client.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var sys, user float64
		fmt.Sscanf(infoField(info, "used_cpu_sys"), "%g", &sys)
		fmt.Sscanf(infoField(info, "used_cpu_user"), "%g", &user)
		return sys + user
	}
	before := cpu()
	b.ResetTimer()
	for range b.N {
		if got := listAll(); got < n {
			b.Fatalf("listed %d of %d", got, n)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/listing")
	b.ReportMetric((cpu()-before)*1000/float64(b.N), "redis-cpu-ms/listing")
	// A listing that finds nothing (no record in progress) costs the scan alone.
	before, start := cpu(), time.Now()
	listIn(sm.StateInProgress)
	b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/empty-listing")
	b.ReportMetric((cpu()-before)*1000, "redis-cpu-ms/empty-listing")

	client.ConfigResetStat(ctx)
	alone := live(3*time.Second, nil)
	stop := make(chan struct{})
	var listings atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			listAll()
			listings.Add(1)
		}
	})
	listing := live(3*time.Second, stop)
	close(stop)
	wg.Wait()
	b.ReportMetric(alone, "live-begins/s")
	b.ReportMetric(listing, "live-begins/s-listing")
	b.ReportMetric(listing/alone*100, "%live-kept")
}
