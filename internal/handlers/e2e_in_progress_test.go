// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// in_progress bounds the leases a tenant holds at once: a begin that would
// acquire past it gets 429 rate-limited, while replays, 409 answers and the
// held attempts' completes go on; a lease stops counting once completed,
// failed or expired, and an extended one counts on.
func TestE2EInProgressLimit(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			keyring, _, keys := limitedTenants(t, map[string]string{"held": "{in_progress: 2}", "free": ""})
			store, limiter := b.open(t)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
			c := e.as(t, keys["held"])
			full := inProgressProbe(t, c)

			done := idemtest.Unique("done")
			l := c.acquire(idem.BeginRequest{Key: done})
			c.mustComplete(idem.CompleteRequest{Key: done, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("stored")}})
			a := full.acquireSoon(idemtest.Unique("a"), 60_000)
			short := full.acquireSoon(idemtest.Unique("short"), 300)
			if full.try(idemtest.Unique("c"), 60_000) != nil {
				t.Fatal("a third lease acquired under in_progress 2")
			}
			// Full: replays, 409 answers and other tenants are served.
			if r := c.begin(idem.BeginRequest{Key: done}); r.StatusCode() != http.StatusOK || *r.JSON200.Response.Body != "stored" {
				t.Fatalf("replay while full: %d %s", r.StatusCode(), r.Body)
			}
			if r := c.begin(idem.BeginRequest{Key: a.Key}); r.StatusCode() != http.StatusConflict {
				t.Fatalf("begin of a key in progress while full: %d %s, want 409", r.StatusCode(), r.Body)
			}
			e.as(t, keys["free"]).acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
			// The short lease is extended far past its first end, and the
			// long one completed (its token in upper case, as the API
			// allows): the complete frees a place.
			if r := c.extend(idem.ExtendRequest{Key: short.Key, LeaseToken: short.LeaseToken, LeaseMs: ptr[int64](60_000)}); r.StatusCode() != http.StatusOK {
				t.Fatalf("extend: %d %s", r.StatusCode(), r.Body)
			}
			c.mustComplete(idem.CompleteRequest{Key: a.Key, LeaseToken: strings.ToUpper(a.LeaseToken)})
			failed := full.acquireSoon(idemtest.Unique("failed"), 60_000)
			// A retryable fail frees a place too; the lease acquired then
			// is never completed and expires after 100 ms.
			c.mustFail(idem.FailRequest{Key: failed.Key, LeaseToken: failed.LeaseToken, Retryable: ptr(true)})
			full.acquireSoon(idemtest.Unique("expiring"), 100)
			if full.try(idemtest.Unique("c"), 60_000) != nil {
				t.Fatal("a lease acquired while the extended and the expiring ones count")
			}
			// The expired lease stops counting (after its margin of 5 s);
			// the extended one, whose first end is long past, still counts.
			full.acquireSoonWithin(idemtest.Unique("after"), 60_000, 10*time.Second)
			if full.try(idemtest.Unique("c"), 60_000) != nil {
				t.Fatal("the extended lease stopped counting at its first end")
			}
		})
	}
}

// The leases of a tenant are counted across the instances sharing a Redis.
func TestE2EInProgressAcrossInstances(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends()[1:3] { // one node, Cluster
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			keyring, _, keys := limitedTenants(t, map[string]string{"held": "{in_progress: 3}"})
			var probes []*inProgress
			for range 3 {
				store, limiter := b.open(t)
				e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
				probes = append(probes, inProgressProbe(t, e.as(t, keys["held"])))
			}
			var held []*idem.BeginAcquired
			for _, p := range probes {
				held = append(held, p.acquireSoon(idemtest.Unique("k"), 60_000))
			}
			for i, p := range probes {
				if p.try(idemtest.Unique("over"), 60_000) != nil {
					t.Fatalf("instance %d acquired a fourth lease under in_progress 3", i)
				}
			}
			// A lease completed on another instance than its begin's frees a place.
			probes[1].c.mustComplete(idem.CompleteRequest{Key: held[0].Key, LeaseToken: held[0].LeaseToken})
			probes[2].acquireSoon(idemtest.Unique("k"), 60_000)
		})
	}
}

// inProgress begins keys of a tenant with an in_progress limit.
type inProgress struct {
	t *testing.T
	c *caller
}

func inProgressProbe(t *testing.T, c *caller) *inProgress { return &inProgress{t, c} }

// try begins key and returns its lease, or nil when it is refused for
// in_progress (checking the refusal: 429 rate-limited naming the limit,
// Retry-After 1, nothing stored).
func (p *inProgress) try(key string, leaseMs int64) *idem.BeginAcquired {
	p.t.Helper()
	r := p.c.begin(idem.BeginRequest{Key: key, LeaseMs: &leaseMs})
	switch r.StatusCode() {
	case http.StatusCreated:
		return r.JSON201
	case http.StatusTooManyRequests:
		prob := requireProblem(p.t, r.HTTPResponse, r.Body, http.StatusTooManyRequests, "rate-limited")
		requireRetryAfter(p.t, r.HTTPResponse, 1, 1)
		if !strings.Contains(prob.Detail, "in_progress") {
			p.t.Errorf("detail %q does not name the limit", prob.Detail)
		}
		p.c.requireAbsent(key)
		return nil
	}
	p.t.Fatalf("begin %s: %d %s", key, r.StatusCode(), r.Body)
	return nil
}

// acquireSoon acquires key once the leases that ended before count no
// more: their end reaches the count with the next flush.
func (p *inProgress) acquireSoon(key string, leaseMs int64) *idem.BeginAcquired {
	p.t.Helper()
	return p.acquireSoonWithin(key, leaseMs, 5*time.Second)
}

func (p *inProgress) acquireSoonWithin(key string, leaseMs int64, d time.Duration) *idem.BeginAcquired {
	p.t.Helper()
	var l *idem.BeginAcquired
	idemtest.Eventually(p.t, d, "a place under in_progress", func() bool {
		l = p.try(key, leaseMs)
		return l != nil
	})
	return l
}

// While Redis hangs, a begin of a tenant with limits (rate and in_progress,
// each a Redis call before the store's) fails with 503 within one store
// timeout, not one per call (2 to 3 s before they shared it).
func TestE2ELimitedBeginOneTimeout(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	srv := redistest.NewServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	limiter := quota.NewRedis(rdb, quota.Options{FlushInterval: testFlush, Timeout: timeout})
	t.Cleanup(limiter.Close)
	store := redisstore.New(rdb, redisstore.Options{Timeout: timeout})
	keyring, _, keys := limitedTenants(t, map[string]string{"limited": "{begins_per_s: 1000, in_progress: 10}"})
	e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter, StoreTimeout: timeout})
	c := e.as(t, keys["limited"])
	c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")}) // scripts loaded, connections open

	resume := srv.Pause(t)
	t.Cleanup(resume)
	for range 2 {
		start := time.Now()
		r := c.begin(idem.BeginRequest{Key: idemtest.Unique("k")})
		took := time.Since(start)
		requireProblem(t, r.HTTPResponse, r.Body, http.StatusServiceUnavailable, "store-unavailable")
		t.Logf("503 after %v (store timeout %v)", took.Round(time.Millisecond), timeout)
		if took > timeout*3/2 {
			t.Errorf("a limited begin took %v to fail while Redis hangs, want within one store timeout (%v) and a margin", took, timeout)
		}
	}
}

// However many tenants an admin names (here without a tenants file), the
// metric series by tenant stay bounded: past quota.MaxTenantLabels tenants
// they are counted under the tenant label "other". With and without a
// limiter, in memory and on Redis.
func TestE2ETenantSeriesBounded(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name string
		open func(t *testing.T) (statemachine.Store, quota.Limiter)
	}{
		{"no limiter", func(*testing.T) (statemachine.Store, quota.Limiter) {
			return statemachine.NewMemoryStore(statemachine.DefaultLimits()), nil
		}},
		{"memory", limitedBackends()[0].open},
		{"redis", limitedBackends()[1].open},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			store, limiter := m.open(t)
			cfg := handlers.Config{Store: store}
			if limiter != nil {
				cfg.Limiter = limiter
			}
			e := start(t, cfg)
			c := e.as(t, "")
			const tenants = quota.MaxTenantLabels + 200
			prefix := idemtest.Unique("s")
			for i := range tenants {
				tenant := fmt.Sprintf("%s-%d", prefix, i)
				l := c.acquire(idem.BeginRequest{Key: "k", Tenant: &tenant})
				c.mustComplete(idem.CompleteRequest{Key: "k", LeaseToken: l.LeaseToken, Tenant: &tenant, Response: &idem.StoredResponse{Body: ptr("x")}})
			}
			time.Sleep(3 * testFlush) // the stored bytes' gauges
			labels := map[string]map[string]bool{}
			resp, body := e.raw(t, http.MethodGet, "/metrics", "", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/metrics: %d", resp.StatusCode)
			}
			for line := range strings.Lines(string(body)) {
				_, rest, ok := strings.Cut(line, `tenant="`)
				if !ok || strings.HasPrefix(line, "#") {
					continue
				}
				name, _, _ := strings.Cut(line, "{")
				value, _, _ := strings.Cut(rest, `"`)
				if labels[name] == nil {
					labels[name] = map[string]bool{}
				}
				labels[name][value] = true
			}
			if len(labels["idemsvc_begins_total"]) == 0 {
				t.Fatal("no idemsvc_begins_total series")
			}
			for name, values := range labels {
				t.Logf("%s: %d tenant labels", name, len(values))
				if len(values) > quota.MaxTenantLabels+1 {
					t.Errorf("%s has %d tenant labels after %d tenants, want at most %d and %q", name, len(values), tenants, quota.MaxTenantLabels, quota.OtherTenant)
				}
				if name != "idemsvc_stored_bytes" && !values[quota.OtherTenant] {
					t.Errorf("%s has no %q series", name, quota.OtherTenant)
				}
			}
		})
	}
}

// The case: a tenant within its rate takes leases by the dozen and
// then completes each with 1 MiB. With in_progress the bytes it stores
// exceed stored_bytes by at most in_progress × the largest response; the
// same flood without in_progress stores several times its budget.
func TestE2EInProgressBoundsStoredBytes(t *testing.T) {
	t.Parallel()
	const budget, leases, rounds = 4 << 20, 3, 4
	body := strings.Repeat("x", 1<<20-64)
	keyring, _, keys := limitedTenants(t, map[string]string{
		"bounded":   fmt.Sprintf("{stored_bytes: %d, in_progress: %d}", budget, leases),
		"unbounded": fmt.Sprintf("{stored_bytes: %d}", budget),
	})
	store, limiter := limitedBackends()[0].open(t) // memory: the bound is the handlers' and the limiter's
	e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
	flood := func(tenant string) int64 {
		c := e.as(t, keys[tenant])
		var stored int64
		for range rounds {
			var held []*idem.BeginAcquired
			for range 20 {
				if r := c.begin(idem.BeginRequest{Key: idemtest.Unique("k")}); r.StatusCode() == http.StatusCreated {
					held = append(held, r.JSON201)
				}
			}
			for _, l := range held {
				c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &body}})
				stored += int64(len(body))
			}
			time.Sleep(2 * testFlush) // the completes' ends reach the count
		}
		return stored
	}
	if got, bound := flood("bounded"), int64(budget+leases*len(body)); got > bound {
		t.Errorf("with in_progress %d: %d bytes stored over a budget of %d, want at most %d", leases, got, budget, bound)
	}
	if got := flood("unbounded"); got < 2*budget {
		t.Errorf("without in_progress the flood stored %d bytes, want well over the budget of %d (the premise)", got, budget)
	}
}
