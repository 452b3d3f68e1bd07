// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	answers "github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// testFlush is the stored-bytes flush interval of the tests: shorter than
// the default, so that they wait less for a budget to take effect.
const testFlush = 200 * time.Millisecond

// limitedBackend opens a store and a limiter over one backing store, as an
// idemsvc instance would: each call of open is a new instance (its own
// client and limiter), sharing the records and counts of the others.
type limitedBackend struct {
	name string
	open func(t *testing.T) (statemachine.Store, quota.Limiter)
}

func limitedBackends() []limitedBackend {
	redisInstance := func(t *testing.T, rdb redis.UniversalClient) (statemachine.Store, quota.Limiter) {
		l := quota.NewRedis(rdb, quota.Options{FlushInterval: testFlush})
		t.Cleanup(l.Close)
		return redisstore.New(rdb, redisstore.Options{}), l
	}
	return []limitedBackend{
		{"memory", func(t *testing.T) (statemachine.Store, quota.Limiter) {
			l := quota.NewMemory(quota.Options{FlushInterval: testFlush})
			t.Cleanup(l.Close)
			return statemachine.NewMemoryStore(statemachine.DefaultLimits()), l
		}},
		{"redis", func(t *testing.T) (statemachine.Store, quota.Limiter) {
			return redisInstance(t, redistest.SharedServer(t).Client(t))
		}},
		{"cluster", func(t *testing.T) (statemachine.Store, quota.Limiter) {
			return redisInstance(t, redistest.SharedCluster(t).Client(t))
		}},
		{"sentinel", func(t *testing.T) (statemachine.Store, quota.Limiter) {
			st := redistest.NewSentinel(t)
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: st.MasterName(), SentinelAddrs: st.Addrs(), ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { _ = rdb.Close() })
			return redisInstance(t, rdb)
		}},
	}
}

// limitedTenants is a tenants file of tenants with fresh names (the counts
// of a shared Redis outlive a test), each with its own API key and limits
// given as YAML flow mappings ("" for none).
func limitedTenants(t *testing.T, limits map[string]string) (*auth.Keyring, map[string]string, map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("tenants:\n")
	names, keys := map[string]string{}, map[string]string{}
	for role, l := range limits {
		name, key := idemtest.Unique(role), "sk-"+idemtest.Unique(role)
		names[role], keys[role] = name, key
		fmt.Fprintf(&b, "  - name: %s\n    api_key_sha256: [%q]\n", name, auth.Digest(key))
		if l != "" {
			fmt.Fprintf(&b, "    limits: %s\n", l)
		}
	}
	k, err := auth.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("tenants file: %v\n%s", err, b.String())
	}
	return k, names, keys
}

// labelled reads the value of a labelled metric (0 when absent).
func (e *env) labelled(t *testing.T, name, labels string) float64 {
	t.Helper()
	return idemtest.Metric(t, e.url, name, labels)
}

// Each limit answers 429 with its problem and Retry-After, at begin only;
// complete and replays are never refused.
func TestE2ETenantLimits(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			keyring, names, keys := limitedTenants(t, map[string]string{
				"rate":    "{begins_per_s: 1, burst: 3}",
				"bytes":   "{stored_bytes: 1000}",
				"waiters": "{waiters: 1}",
				"free":    "",
			})
			store, limiter := b.open(t)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})

			t.Run("rate", func(t *testing.T) {
				c := e.as(t, keys["rate"])
				lease := c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
				c.begin(idem.BeginRequest{Key: idemtest.Unique("k")})
				c.begin(idem.BeginRequest{Key: lease.Key}) // an in-progress answer counts too
				r := c.begin(idem.BeginRequest{Key: idemtest.Unique("k")})
				p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusTooManyRequests, "rate-limited")
				requireRetryAfter(t, r.HTTPResponse, 1, 1)
				if r.Headers429 == nil || r.Headers429.RetryAfter != 1 {
					t.Errorf("Retry-After not parsed by the client: %+v", r.Headers429)
				}
				if !strings.Contains(p.Detail, "begins_per_s 1") {
					t.Errorf("detail %q does not name the limit", p.Detail)
				}
				// Complete is never refused, even at once after the refusal.
				c.mustComplete(idem.CompleteRequest{Key: lease.Key, LeaseToken: lease.LeaseToken,
					Response: &idem.StoredResponse{Body: ptr("done")}})
				// Another tenant is not affected.
				e.as(t, keys["free"]).acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
				// A second later the rate allows one more.
				time.Sleep(1100 * time.Millisecond)
				c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})

				if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="begins_per_s",tenant="`+names["rate"]+`"`); got != 1 {
					t.Errorf("rejections metric = %v, want 1", got)
				}
				if got := e.labelled(t, "idemsvc_begins_total", `outcome="rate-limited",tenant="`+names["rate"]+`"`); got != 1 {
					t.Errorf("begins metric (rate-limited) = %v, want 1", got)
				}
				if got := e.labelled(t, "idemsvc_begins_total", `outcome="acquired",tenant="`+names["rate"]+`"`); got != 3 {
					t.Errorf("begins metric (acquired) = %v, want 3", got)
				}
			})

			t.Run("stored bytes", func(t *testing.T) {
				c := e.as(t, keys["bytes"])
				body := strings.Repeat("x", 590)
				headers := map[string]string{"Content-Type": "text/plain"} // 22 bytes
				held := c.acquire(idem.BeginRequest{Key: idemtest.Unique("held")})
				done := make([]string, 2)
				for i := range done {
					l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("done")})
					c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken,
						Response: &idem.StoredResponse{Body: &body, Headers: headers}})
					done[i] = l.Key
				}
				idemtest.Eventually(t, 5*time.Second, "stored bytes counted", func() bool {
					return e.labelled(t, "idemsvc_stored_bytes", `tenant="`+names["bytes"]+`"`) == 2*(590+22)
				})
				var r *idem.BeginResponse
				refused := idemtest.Unique("new")
				idemtest.Eventually(t, 5*time.Second, "quota-exceeded", func() bool {
					r = c.begin(idem.BeginRequest{Key: refused})
					if r.StatusCode() == http.StatusCreated { // not known over yet: let it go
						c.mustFail(idem.FailRequest{Key: refused, LeaseToken: r.JSON201.LeaseToken})
						refused = idemtest.Unique("new")
					}
					return r.StatusCode() == http.StatusTooManyRequests
				})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusTooManyRequests, "quota-exceeded")
				requireRetryAfter(t, r.HTTPResponse, 1, 3600)
				c.requireAbsent(refused) // a refused begin leaves nothing
				// Replays are still served, byte for byte.
				for _, key := range done {
					rr := c.begin(idem.BeginRequest{Key: key})
					if rr.StatusCode() != http.StatusOK || rr.JSON200 == nil || *rr.JSON200.Response.Body != body {
						t.Fatalf("replay over budget: got %d %s", rr.StatusCode(), rr.Body)
					}
				}
				// An attempt begun before is still stored, and its key then replays.
				c.mustComplete(idem.CompleteRequest{Key: held.Key, LeaseToken: held.LeaseToken,
					Response: &idem.StoredResponse{Body: ptr("late")}})
				if rr := c.begin(idem.BeginRequest{Key: held.Key}); rr.StatusCode() != http.StatusOK {
					t.Fatalf("replay of the late complete: %d %s", rr.StatusCode(), rr.Body)
				}
				// Other tenants are not affected.
				e.as(t, keys["free"]).acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
				if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="stored_bytes",tenant="`+names["bytes"]+`"`); got < 1 {
					t.Errorf("rejections metric = %v, want at least 1", got)
				}
			})

			t.Run("an unlimited tenant's bytes are counted", func(t *testing.T) {
				c := e.as(t, keys["free"])
				l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
				c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, RetentionS: ptr[int64](1),
					Response: &idem.StoredResponse{Body: ptr("12345")}})
				idemtest.Eventually(t, 5*time.Second, "unlimited tenant's bytes counted", func() bool {
					return e.labelled(t, "idemsvc_stored_bytes", `tenant="`+names["free"]+`"`) >= 5
				})
			})

			t.Run("waiters", func(t *testing.T) {
				c := e.as(t, keys["waiters"])
				l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("w")})
				first := make(chan *idem.BeginResponse, 1)
				go func() {
					r, err := c.c.BeginWithResponse(bg, idem.BeginRequest{Key: l.Key, WaitMs: ptr[int64](10_000)})
					if err != nil {
						t.Errorf("waiter: %v", err)
					}
					first <- r
				}()
				idemtest.Eventually(t, 5*time.Second, "one waiter", func() bool { return e.metricValue(t, "idemsvc_waiters") >= 1 })
				r := c.begin(idem.BeginRequest{Key: l.Key, WaitMs: ptr[int64](10_000)})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusTooManyRequests, "rate-limited")
				requireRetryAfter(t, r.HTTPResponse, 1, 60)
				// A begin that does not wait is not a waiter.
				r = c.begin(idem.BeginRequest{Key: l.Key})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
				c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("w")}})
				select {
				case r := <-first:
					if r == nil || r.StatusCode() != http.StatusOK {
						t.Fatalf("the waiter: %v", r)
					}
				case <-time.After(15 * time.Second):
					t.Fatal("the waiter did not answer")
				}
				// Its wait is over, so another may wait.
				l2 := c.acquire(idem.BeginRequest{Key: idemtest.Unique("w")})
				go func() {
					time.Sleep(300 * time.Millisecond)
					c.mustComplete(idem.CompleteRequest{Key: l2.Key, LeaseToken: l2.LeaseToken})
				}()
				if r := c.begin(idem.BeginRequest{Key: l2.Key, WaitMs: ptr[int64](10_000)}); r.StatusCode() != http.StatusOK {
					t.Fatalf("the next waiter: %d %s", r.StatusCode(), r.Body)
				}
			})
		})
	}
}

// flood describes a flooding tenant: it begins at twice its rate, and
// completes every begin it acquires with a body big enough that, without
// its limits, it would fill Redis.
type flood struct {
	rate   int   // begins per second the tenant is allowed; it tries twice as many
	body   int   // bytes of each response
	budget int   // its stored_bytes
	bytes  int64 // what it tries to store in all
}

// run floods through c until it has tried to store f.bytes (however long
// that takes on a busy machine; at most 2 minutes) and returns the bytes it
// tried to store and stored, and how many of its completes failed.
func (f flood) run(c *idem.ClientWithResponses) (tried, stored, failed int64) {
	// Random bytes, as base64: a body compression cannot shrink, so that
	// each one takes its size in Redis.
	body, enc := base64.StdEncoding.EncodeToString([]byte(answers.Incompressible(f.body, 1))), idem.BodyEncodingBase64
	var triedN, storedN, failedN atomic.Int64
	begins := int(f.bytes/int64(f.body)) + 1
	openLoop(2*f.rate, 2*time.Minute, begins, func() {
		triedN.Add(int64(f.body))
		r, err := c.BeginWithResponse(bg, idem.BeginRequest{Key: idemtest.Unique("flood")})
		if err != nil || r.JSON201 == nil {
			return // refused: 429
		}
		cr, err := c.CompleteWithResponse(bg, idem.CompleteRequest{Key: r.JSON201.Key,
			LeaseToken: r.JSON201.LeaseToken, Response: &idem.StoredResponse{Body: &body, BodyEncoding: &enc}})
		if err != nil || cr.StatusCode() != http.StatusOK {
			failedN.Add(1)
			return
		}
		storedN.Add(int64(f.body))
	})
	return triedN.Load(), storedN.Load(), failedN.Load()
}

// openLoop calls op rate times a second for d or n calls, whichever ends
// first, each call on a goroutine of its own, so that the rate holds
// however long a call takes (up to 256 in flight), and returns once every
// call is done.
func openLoop(rate int, d time.Duration, n int, op func()) {
	var wg sync.WaitGroup
	inFlight := make(chan struct{}, 256)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for deadline := time.Now().Add(d); n > 0 && time.Now().Before(deadline); n-- {
		<-tick.C
		inFlight <- struct{}{}
		wg.Go(func() {
			defer func() { <-inFlight }()
			op()
		})
	}
	wg.Wait()
}

// A tenant flooding at twice its rate with big responses cannot make
// another tenant's calls fail or its records disappear, on a Redis with
// maxmemory and noeviction small enough that the flood, unlimited, would
// fill it.
//
// Not parallel: it loads the machine, and needs its pace to be kept.
func TestE2EFloodingTenantIsolation(t *testing.T) {
	f := flood{rate: 20, body: 64 << 10, budget: 1 << 20}
	for _, tt := range []struct {
		name string
		open func(t *testing.T) (redis.UniversalClient, int64) // and the maxmemory of all masters together
	}{
		{"memory", nil},
		{"redis", func(t *testing.T) (redis.UniversalClient, int64) {
			srv := redistest.NewPrivateServer(t) // its maxmemory changes
			rdb := srv.Client(t)
			const maxmemory = 10 << 20
			setMaxmemory(t, rdb, maxmemory)
			return rdb, maxmemory
		}},
		{"cluster", func(t *testing.T) (redis.UniversalClient, int64) {
			c := redistest.NewClusterWith(t, redistest.ClusterOptions{Private: true}) // its maxmemory changes
			const perMaster = 6 << 20
			masters := 0
			for _, n := range c.Nodes() {
				setMaxmemory(t, n.Client(t), perMaster)
				if n.IsMaster() {
					masters++
				}
			}
			return c.Client(t), int64(masters) * perMaster
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keyring, names, keys := limitedTenants(t, map[string]string{
				"flood":  fmt.Sprintf("{begins_per_s: %d, burst: %d, stored_bytes: %d}", f.rate, f.rate, f.budget),
				"victim": "{begins_per_s: 1000, stored_bytes: 1048576}",
			})
			var store statemachine.Store
			var limiter quota.Limiter
			maxmemory := int64(10 << 20) // for the memory store, only the flood's size
			if tt.open == nil {
				store, limiter = statemachine.NewMemoryStore(statemachine.DefaultLimits()), quota.NewMemory(quota.Options{})
			} else {
				var rdb redis.UniversalClient
				rdb, maxmemory = tt.open(t)
				store, limiter = redisstore.New(rdb, redisstore.Options{}), quota.NewRedis(rdb, quota.Options{})
			}
			f := f
			f.bytes = maxmemory * 3 / 2
			t.Cleanup(limiter.Close)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
			victim := e.as(t, keys["victim"])

			// The victim's records from before the flood.
			before := map[string]string{}
			for i := range 20 {
				l := victim.acquire(idem.BeginRequest{Key: idemtest.Unique("before")})
				body := fmt.Sprintf("before-%d", i)
				victim.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &body}})
				before[l.Key] = body
			}

			done := make(chan struct{})
			var tried, storedBytes, failed int64
			go func() {
				defer close(done)
				tried, storedBytes, failed = f.run(e.client(t, keys["flood"]))
			}()
			// The victim works on through the flood: every call succeeds.
			during := map[string]string{}
			for running := true; running; {
				select {
				case <-done:
					running = false
				case <-time.After(50 * time.Millisecond):
				}
				l := victim.acquire(idem.BeginRequest{Key: idemtest.Unique("during")})
				body := "during-" + l.Key
				victim.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &body}})
				during[l.Key] = body
				for key, want := range before {
					r := victim.begin(idem.BeginRequest{Key: key})
					if r.StatusCode() != http.StatusOK || *r.JSON200.Response.Body != want {
						t.Fatalf("victim's replay of %s during the flood: %d %s", key, r.StatusCode(), r.Body)
					}
					break // one per round
				}
			}
			for key, want := range before {
				if got := victim.record(key); got.Response == nil || *got.Response.Body != want {
					t.Errorf("victim's record %s after the flood: %+v", key, got)
				}
			}
			for key, want := range during {
				if got := victim.record(key); got.Response == nil || *got.Response.Body != want {
					t.Errorf("victim's record %s after the flood: %+v", key, got)
				}
			}
			if failed > 0 {
				t.Errorf("%d of the flood's completes failed", failed)
			}
			if tried <= maxmemory {
				t.Fatalf("the flood tried %d bytes: not enough to fill %d bytes of Redis without limits", tried, maxmemory)
			}
			// What the flood stored: its budget, plus what it stored while
			// the instance did not know yet (a flush interval and a bit).
			if slack := int64(3 * f.rate * f.body); storedBytes > int64(f.budget)+slack {
				t.Errorf("the flood stored %d bytes; budget %d + slack %d", storedBytes, f.budget, slack)
			}
			if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="begins_per_s",tenant="`+names["flood"]+`"`); got == 0 {
				t.Errorf("the flood was never over its rate")
			}
			if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="stored_bytes",tenant="`+names["flood"]+`"`); got == 0 {
				t.Errorf("the flood was never over its budget")
			}
			t.Logf("flood: tried %d bytes, stored %d (budget %d, maxmemory %d); victim: %d records during", tried, storedBytes, f.budget, maxmemory, len(during))
		})
	}
}

// The premise of TestE2EFloodingTenantIsolation: without limits, the same
// flood fills the same Redis, and then the other tenant's calls fail.
func TestE2EFloodWithoutLimitsFillsRedis(t *testing.T) {
	f := flood{rate: 20, body: 64 << 10}
	keyring, _, keys := limitedTenants(t, map[string]string{"flood": "", "victim": ""})
	rdb := redistest.NewPrivateServer(t).Client(t) // it is filled
	const maxmemory = 10 << 20
	setMaxmemory(t, rdb, maxmemory)
	f.bytes = maxmemory * 3 / 2
	limiter := quota.NewRedis(rdb, quota.Options{})
	t.Cleanup(limiter.Close)
	e := start(t, handlers.Config{Store: redisstore.New(rdb, redisstore.Options{}),
		Keyring: keyring, Limiter: limiter})
	tried, stored, failed := f.run(e.client(t, keys["flood"]))
	t.Logf("unlimited flood: tried %d bytes, stored %d, %d completes failed", tried, stored, failed)
	if failed == 0 {
		t.Fatalf("the unlimited flood stored %d bytes in a Redis of %d without a failure", stored, maxmemory)
	}
	victim := e.as(t, keys["victim"])
	// 64 KiB that compression cannot shrink, as the flood's.
	body, enc := base64.StdEncoding.EncodeToString([]byte(answers.Incompressible(64<<10, 2))), idem.BodyEncodingBase64
	r := victim.begin(idem.BeginRequest{Key: idemtest.Unique("victim")})
	if r.JSON201 != nil {
		if c := victim.complete(idem.CompleteRequest{Key: r.JSON201.Key, LeaseToken: r.JSON201.LeaseToken,
			Response: &idem.StoredResponse{Body: &body, BodyEncoding: &enc}}); c.StatusCode() == http.StatusOK {
			t.Fatalf("the victim's calls still succeed on a full Redis")
		}
	}
}

func setMaxmemory(t *testing.T, rdb *redis.Client, bytes int64) {
	t.Helper()
	for _, kv := range [][2]string{{"maxmemory", strconv.FormatInt(bytes, 10)}, {"maxmemory-policy", "noeviction"}} {
		if err := rdb.ConfigSet(bg, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s: %v", kv[0], err)
		}
	}
}

// Three idemsvc instances sharing one Redis hold a tenant to its rate: at
// twice its rate for 10 s, no more than 110% of begins_per_s × 10 s + burst
// are accepted. Not parallel: it needs its pace to be kept.
func TestE2ERateHoldsAcrossInstances(t *testing.T) {
	const rate, burst = 100, 20
	const window = 10 * time.Second
	keyring, _, keys := limitedTenants(t, map[string]string{
		"tenant": fmt.Sprintf("{begins_per_s: %d, burst: %d}", rate, burst),
	})
	srv := redistest.SharedServer(t)
	var clients []*idem.ClientWithResponses
	for range 3 {
		rdb := srv.Client(t)
		limiter := quota.NewRedis(rdb, quota.Options{})
		t.Cleanup(limiter.Close)
		e := start(t, handlers.Config{Store: redisstore.New(rdb, redisstore.Options{}),
			Keyring: keyring, Limiter: limiter})
		clients = append(clients, e.client(t, keys["tenant"]))
	}
	// Every begin replays one completed key: cheap, and it counts.
	first := clients[0]
	r, err := first.BeginWithResponse(bg, idem.BeginRequest{Key: "k"})
	must(t, err)
	if r.JSON201 == nil {
		t.Fatalf("begin: %d %s", r.StatusCode(), r.Body)
	}
	cr, err := first.CompleteWithResponse(bg, idem.CompleteRequest{Key: "k", LeaseToken: r.JSON201.LeaseToken})
	must(t, err)
	if cr.StatusCode() != http.StatusOK {
		t.Fatalf("complete: %d %s", cr.StatusCode(), cr.Body)
	}
	time.Sleep(time.Second) // the burst back

	var accepted, refused, other, n atomic.Int64
	start := time.Now()
	openLoop(2*rate, window, math.MaxInt, func() {
		c := clients[n.Add(1)%int64(len(clients))] // round robin over the instances
		r, err := c.BeginWithResponse(bg, idem.BeginRequest{Key: "k"})
		switch {
		case err != nil:
			other.Add(1)
		case r.StatusCode() == http.StatusOK:
			accepted.Add(1)
		case r.StatusCode() == http.StatusTooManyRequests:
			refused.Add(1)
		default:
			other.Add(1)
		}
	})
	elapsed := time.Since(start)
	bound := int64(1.1*rate*elapsed.Seconds()) + burst
	t.Logf("in %v: %d accepted, %d refused, %d other; bound %d", elapsed, accepted.Load(), refused.Load(), other.Load(), bound)
	if other.Load() != 0 {
		t.Errorf("%d begins neither replayed nor refused", other.Load())
	}
	if accepted.Load() > bound {
		t.Errorf("%d accepted, over the bound %d", accepted.Load(), bound)
	}
	// Sanity: the tenant was over its rate and was still served at about it.
	if refused.Load() == 0 || accepted.Load() < rate*int64(window/time.Second)/2 {
		t.Errorf("%d accepted, %d refused: want refusals and at least half the rate accepted", accepted.Load(), refused.Load())
	}
}
