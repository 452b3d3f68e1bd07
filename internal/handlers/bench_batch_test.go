// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// BenchmarkHTTPBeginBatchRedis is a begin batch of 100 new keys through
// the Go SDK, over loopback HTTP to the service in process, on a
// standalone Redis: the caller's wait per batch, with the SDK's and the
// service's CPU and allocations in one profile
// (-cpuprofile, -memprofile).
func BenchmarkHTTPBeginBatchRedis(b *testing.B) {
	rdb := redistest.SharedServer(b).Client(b)
	srv := httptest.NewServer(benchService(b, redisstore.New(rdb, redisstore.Options{})))
	defer srv.Close()
	c, err := idem.New(srv.URL, idem.WithAPIKey("bench-key"), idem.WithHTTP(srv.Client()))
	if err != nil {
		b.Fatal(err)
	}
	prefix := fmt.Sprintf("batch-%d-%d-", time.Now().UnixNano(), benchRun.Add(1))
	items := make([]idem.BeginParams, 100)
	n := 0
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for i := range items {
			n++
			items[i] = idem.BeginParams{Key: prefix + strconv.Itoa(n)}
		}
		res, err := c.BeginBatch(ctx, items)
		if err != nil || res[99].Lease == nil {
			b.Fatalf("begin batch: %v %+v", err, res[99])
		}
	}
}
