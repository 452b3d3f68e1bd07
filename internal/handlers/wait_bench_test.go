// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// BenchmarkWaiterLatency measures, on each store, the time from the answer
// to a complete to the answer of the begin waiting for it: 200 waiters one
// after the other per run (run it with -benchtime 1x). It reports the
// median and the 99th percentile in ms.
func BenchmarkWaiterLatency(b *testing.B) {
	for _, be := range idemtest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			e := start(b, handlers.Config{Store: be.Open(b), MaxWait: time.Minute})
			for b.Loop() {
				l := waiterLatencies(b, e, 200)
				b.ReportMetric(float64(l[len(l)/2])/1e6, "p50-ms")
				b.ReportMetric(float64(l[len(l)*99/100])/1e6, "p99-ms")
				b.ReportMetric(float64(l[len(l)-1])/1e6, "max-ms")
			}
		})
	}
}

// BenchmarkIdleWaiters parks 1,000 waiters on 1,000 distinct keys in
// progress and reports the commands and scripts per second that Redis
// (every node of a Cluster) runs while nothing changes, over 5 s, on a
// Redis dedicated to it (run it with -benchtime 1x).
func BenchmarkIdleWaiters(b *testing.B) {
	b.Run("redis", func(b *testing.B) {
		srv := redistest.NewPrivateServer(b) // its commands are counted
		idleWaiters(b, srv.Client(b), []*redis.Client{srv.Client(b)})
	})
	b.Run("cluster", func(b *testing.B) {
		cl := redistest.NewCluster(b)
		cl.WaitHealthy(b)
		var nodes []*redis.Client
		for _, n := range cl.Nodes() {
			nodes = append(nodes, n.Client(b))
		}
		idleWaiters(b, cl.Client(b), nodes)
	})
}

func idleWaiters(b *testing.B, client redis.UniversalClient, nodes []*redis.Client) {
	const keys, window = 1000, 5 * time.Second
	// As many scripts in flight as there are waiters, so that the begins
	// arriving at once are all admitted (DefaultMaxInFlight sheds most of
	// them with 503, and the loop below then never saw them all wait):
	// this measures idle waiters, not admission.
	store := redisstore.New(client, redisstore.Options{Timeout: time.Minute, MaxInFlight: keys})
	e := start(b, handlers.Config{Store: store, MaxWait: 10 * time.Minute})
	e.http.Transport.(*http.Transport).MaxConnsPerHost = 0
	e.http.Transport.(*http.Transport).MaxIdleConnsPerHost = keys
	c, err := idem.NewClientWithResponses(e.url, idem.WithHTTPClient(e.http))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		prefix := idemtest.Unique("idle")
		tokens := make([]string, keys)
		for i := range keys {
			res, err := store.Begin(b.Context(), handlers.DefaultTenant, statemachine.BeginRequest{Key: fmt.Sprintf("%s-%d", prefix, i), Lease: 10 * time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			tokens[i] = res.Lease.Token
		}
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				res, err := c.BeginWithResponse(bg, idem.BeginRequest{Key: fmt.Sprintf("%s-%d", prefix, i), WaitMs: ptr[int64](600_000)})
				if err == nil && res.StatusCode() != http.StatusOK {
					err = fmt.Errorf("%d %s", res.StatusCode(), res.Body)
				}
				if err != nil {
					b.Errorf("a waiting begin: %v", err)
				}
			})
		}
		for waiting(b, e) != keys {
			if b.Failed() { // a begin that ended early will never wait
				b.FailNow()
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // past the subscriptions and the reads that follow them
		commands, scripts := nodeCounts(b, nodes)
		time.Sleep(window)
		commands2, scripts2 := nodeCounts(b, nodes)
		// Less the INFOs of the first count.
		b.ReportMetric(float64(commands2-commands-int64(2*len(nodes)))/window.Seconds(), "commands/s")
		b.ReportMetric(float64(scripts2-scripts)/window.Seconds(), "scripts/s")
		for i := range keys {
			_, err := store.Complete(b.Context(), handlers.DefaultTenant, statemachine.CompleteRequest{Key: fmt.Sprintf("%s-%d", prefix, i), Token: tokens[i]})
			if err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
	}
}

// nodeCounts sums total_commands_processed and the script calls over nodes.
func nodeCounts(b *testing.B, nodes []*redis.Client) (commands, scripts int64) {
	for _, n := range nodes {
		commands += commandsProcessed(b, n)
		scripts += scriptCalls(b, n)
	}
	return commands, scripts
}
