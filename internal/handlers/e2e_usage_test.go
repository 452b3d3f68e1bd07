// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// GET /v1/usage: a tenant key sees its own tenant, an admin every tenant
// or the one it names; the figures follow what the tenants did.
func TestE2EUsage(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends()[:3] { // memory, redis, cluster
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			limited, free, admin := idemtest.Unique("limited"), idemtest.Unique("free"), idemtest.Unique("ops")
			keys := map[string]string{limited: "sk-" + idemtest.Unique("l"), free: "sk-" + idemtest.Unique("f"), admin: "sk-" + idemtest.Unique("a")}
			yaml := fmt.Sprintf("tenants:\n"+
				"  - name: %s\n    api_key_sha256: [%q]\n    limits: {begins_per_s: 1, burst: 2, stored_bytes: 100000, waiters: 3, in_progress: 5}\n"+
				"  - name: %s\n    api_key_sha256: [%q]\n"+
				"  - name: %s\n    admin: true\n    api_key_sha256: [%q]\n",
				limited, auth.Digest(keys[limited]), free, auth.Digest(keys[free]), admin, auth.Digest(keys[admin]))
			keyring, err := auth.Parse([]byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			store, limiter := b.open(t)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
			sdk := func(key string, opts ...idem.Option) *idem.Client {
				c, err := idem.New(e.url, append([]idem.Option{idem.WithAPIKey(key)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			ctx := context.Background()

			// The limited tenant: two begins acquire (its burst), the third is
			// refused for the rate; one completes with 1,000 bytes.
			c := e.as(t, keys[limited])
			l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
			c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
			if r := c.begin(idem.BeginRequest{Key: idemtest.Unique("k")}); r.StatusCode() != http.StatusTooManyRequests {
				t.Fatalf("third begin: %d %s", r.StatusCode(), r.Body)
			}
			c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken,
				Response: &idem.StoredResponse{Body: ptr(strings.Repeat("x", 1000))}})

			var own []idem.TenantUsage
			idemtest.Eventually(t, 5*time.Second, "stored bytes in usage", func() bool {
				own, err = sdk(keys[limited]).Usage(ctx)
				return err == nil && len(own) == 1 && own[0].StoredBytes == 1000
			})
			u := own[0]
			if u.Tenant != limited {
				t.Fatalf("tenant key sees %q, want its own %q", u.Tenant, limited)
			}
			if u.Rejections.BeginsPerS != 1 || u.Rejections.StoredBytes != 0 {
				t.Errorf("rejections = %+v, want one for begins_per_s", u.Rejections)
			}
			if u.InProgress != 1 { // one lease acquired and not completed
				t.Errorf("in_progress = %d, want 1", u.InProgress)
			}
			if u.Waiters != 0 {
				t.Errorf("waiters = %d, want 0", u.Waiters)
			}
			lim := u.Limits
			if lim.BeginsPerS == nil || *lim.BeginsPerS != 1 || lim.Burst == nil || *lim.Burst != 2 || lim.StoredBytes == nil || *lim.StoredBytes != 100000 ||
				lim.Waiters == nil || *lim.Waiters != 3 || lim.InProgress == nil || *lim.InProgress != 5 || lim.ReadBytesPerS != nil {
				t.Errorf("limits = %+v", lim)
			}

			// A tenant key may not read another tenant's usage.
			if _, err := sdk(keys[free], idem.WithTenant(limited)).Usage(ctx); !errors.Is(err, idem.ErrForbidden) {
				t.Errorf("tenant key naming another tenant: %v, want forbidden", err)
			}
			// The free tenant sees itself, without limits.
			got, err := sdk(keys[free]).Usage(ctx)
			if err != nil || len(got) != 1 || got[0].Tenant != free || got[0].Limits != (idem.TenantLimits{}) {
				t.Errorf("free tenant: %+v, %v", got, err)
			}

			// The admin sees every tenant, sorted, or the one it names.
			all, err := sdk(keys[admin]).Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, u := range all {
				names = append(names, u.Tenant)
			}
			want := keyring.Tenants()
			if fmt.Sprint(names) != fmt.Sprint(want) {
				t.Errorf("admin sees %v, want %v", names, want)
			}
			one, err := sdk(keys[admin], idem.WithTenant(limited)).Usage(ctx)
			if err != nil || len(one) != 1 || one[0].Tenant != limited || one[0].StoredBytes != 1000 {
				t.Errorf("admin naming %s: %+v, %v", limited, one, err)
			}
			if _, err := sdk(keys[admin], idem.WithTenant("nobody")).Usage(ctx); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("admin naming an unknown tenant: %v, want not found", err)
			}
			// Without a key: 401.
			if _, err := sdk("wrong").Usage(ctx); !errors.Is(err, idem.ErrUnauthorized) {
				t.Errorf("wrong key: %v, want unauthorized", err)
			}
		})
	}
}

// Begins per second is the mean of the last full minute: 30 begins in the
// seconds before make 0.5 a second.
func TestE2EUsageBeginRate(t *testing.T) {
	t.Parallel()
	e := start(t, handlers.Config{Store: idemtest.Backends()[0].Open(t)})
	c := e.as(t, "")
	for range 30 {
		c.acquire(idem.BeginRequest{Key: idemtest.Unique("k")})
	}
	// A batch's items count one by one, as the limiter charges them.
	items := make([]idem.BeginParams, 30)
	for i := range items {
		items[i] = idem.BeginParams{Key: idemtest.Unique("b")}
	}
	if _, err := e.sdk(t, "").BeginBatch(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second))) // the begins' second is over
	r, err := c.c.GetUsageWithResponse(context.Background(), nil)
	if err != nil || r.JSON200 == nil {
		t.Fatalf("usage: %v %s", err, r.Body)
	}
	if got := r.JSON200.Tenants; len(got) != 1 || got[0].Tenant != handlers.DefaultTenant || got[0].BeginsPerS != 1 {
		t.Errorf("usage = %+v, want tenant default at 1 begin/s (60 in a minute)", got)
	}
}

// With the store's Redis gone, usage still answers: the tenant is marked
// store_unavailable, its figures from this instance still given.
func TestE2EUsageStoreDown(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	rdb := srv.Client(t)
	l := quota.NewRedis(rdb, quota.Options{Timeout: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	e := start(t, handlers.Config{Store: redisstore.New(rdb, redisstore.Options{}), Limiter: l})
	srv.Stop(t)
	r, err := e.as(t, "").c.GetUsageWithResponse(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.JSON200 == nil {
		t.Fatalf("usage: %d %s", r.StatusCode(), r.Body)
	}
	got := r.JSON200.Tenants
	if len(got) != 1 || got[0].Tenant != handlers.DefaultTenant || got[0].StoreUnavailable == nil || !*got[0].StoreUnavailable {
		t.Errorf("usage = %+v, want tenant default marked store_unavailable", got)
	}
}
