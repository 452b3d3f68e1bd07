// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	answers "github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestReaderLeavesOthersTheirShare: a tenant replaying its 1 MiB record
// over 8 connections at once, with IDEMSVC_READS_IN_FLIGHT at 1, never has
// more than one of those records read from Redis and not yet written: a
// replay waits for its tenant's read slot before the GETRANGE that reads
// the response, not after it. When the slot was taken only once the
// response had been read, the 8 replays each read and decoded their 1 MiB
// at once, on every CPU, while one was written; another tenant's begins
// waited behind them (BenchmarkReaderLeavesOthersTheirShare, make
// load-reads: that tenant's begin p99 rose 2.5× to 5.6× on an idle 2-core
// machine). Here every begin of the other tenant is served meanwhile, and
// each refusal of the reader is a 429 counted in
// idemsvc_limit_rejections_total{limit="reads_in_flight"}.
//
// What is counted: a request holds a large read from its GETRANGE of a
// response (seen by a hook on the store's Redis client, by the request's
// context) until its handler returned, after the answer was written. The
// slot is given back as the answer's last bytes are written, a moment
// before the handler returns, so the next read may start within that
// moment (and on a loaded machine, the one after it too): the bound
// asserted is the slot plus those two. Taking the slot after the read
// gave 7.
func TestReaderLeavesOthersTheirShare(t *testing.T) {
	t.Parallel()
	const readers, replays = 8, 10
	rdb := redis.NewClient(&redis.Options{Addr: redistest.NewServer(t).Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	var reading, most atomic.Int64
	rdb.AddHook(largeReads{reading: &reading, most: &most})
	limiter := quota.NewRedis(rdb, quota.Options{FlushInterval: testFlush})
	t.Cleanup(limiter.Close)
	// A read budget that refuses none of the replays: the slots are
	// what is measured.
	keyring, names, keys := limitedTenants(t, map[string]string{"reader": "{read_bytes_per_s: 1073741824}", "other": ""})
	s := idemtest.Serve(t, handlers.Config{Store: redisstore.New(rdb, redisstore.Options{}), Keyring: keyring, Limiter: limiter, ReadsInFlight: 1},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				read := new(atomic.Bool)
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), readMark{}, read)))
				if read.Load() {
					reading.Add(-1)
				}
			})
		})
	e := &env{url: s.URL, svc: s.Service, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * readers}}}
	t.Cleanup(e.http.CloseIdleConnections)
	begin := func(apiKey, key string) (int, []byte) {
		resp, body := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(fmt.Sprintf(`{"key":%q}`, key)), "Authorization", "Bearer "+apiKey)
		return resp.StatusCode, body
	}
	c := e.as(t, keys["reader"])
	l := c.acquire(idem.BeginRequest{Key: "large"})
	// Random hex, which compresses only to half: a body that compresses
	// to a few bytes would be sent whole by the script, with no read of
	// its rest to count.
	body := hex.EncodeToString([]byte(answers.Incompressible((1<<20-64)/2, 1)))
	c.mustComplete(idem.CompleteRequest{Key: "large", LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &body}})

	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			for range replays {
				switch code, got := begin(keys["reader"], "large"); code {
				case http.StatusOK:
					served.Add(1)
					if !strings.Contains(string(got), body) {
						t.Errorf("a replay without its body: %.200s", got)
					}
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("replay: %d %.200s", code, got)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	others := 0
	for waiting := true; waiting; others++ {
		if code, got := begin(keys["other"], idemtest.Unique("other")); code != http.StatusCreated {
			t.Errorf("the other tenant's begin beside the reader: %d %.200s", code, got)
		}
		select {
		case <-done:
			waiting = false
		default:
		}
	}
	t.Logf("the reader: %d replays served, %d refused; the other tenant: %d begins; large reads in flight at most %d", served.Load(), refused.Load(), others, most.Load())
	if served.Load() == 0 {
		t.Fatal("no replay was served")
	}
	if m := most.Load(); m > 3 {
		t.Errorf("the reader had %d large reads in flight at once (read from Redis and not yet written), want at most its 1 slot (and the next two, started as the last bytes are written)", m)
	}
	if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="reads_in_flight",tenant="`+names["reader"]+`"`); got != float64(refused.Load()) {
		t.Errorf("reads_in_flight rejections = %v, want the %d refused", got, refused.Load())
	}
	if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="reads_in_flight",tenant="`+names["other"]+`"`); got != 0 {
		t.Errorf("the other tenant's reads_in_flight rejections = %v, want 0 (and the series at zero)", got)
	}
}

// readMark is the context key of a request whose large reads are counted.
type readMark struct{}

// largeReads counts the requests that read a large response with GETRANGE
// (its rest, past the head the script sent), once each.
type largeReads struct{ reading, most *atomic.Int64 }

func (largeReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (largeReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h largeReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		read, _ := ctx.Value(readMark{}).(*atomic.Bool)
		if read != nil && len(cmds) > 0 && cmds[0].Name() == "getrange" && !read.Swap(true) {
			n := h.reading.Add(1)
			for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
			}
		}
		return next(ctx, cmds)
	}
}
