// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// Replays and statuses with the response count against the tenant's read
// budget (read_bytes_per_s): over it they get 429 rate-limited until it is
// paid back, while begins that acquire, statuses without the response and
// other tenants' reads go on.
func TestE2EReadBudget(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends()[:3] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			keyring, names, keys := limitedTenants(t, map[string]string{"reader": "{read_bytes_per_s: 2048}", "other": ""})
			store, limiter := b.open(t)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
			body := strings.Repeat("r", 1500)
			stored := func(c *caller) string {
				key := idemtest.Unique("read")
				l := c.acquire(idem.BeginRequest{Key: key})
				c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &body}})
				return key
			}
			c, other := e.as(t, keys["reader"]), e.as(t, keys["other"])
			key, otherKey := stored(c), stored(other)
			replay := func(c *caller, key string) *idem.BeginResponse {
				t.Helper()
				return c.begin(idem.BeginRequest{Key: key})
			}
			// 2048 bytes a second: the first replay leaves 548, the second
			// is admitted on them and takes the budget below zero.
			for i := range 2 {
				if r := replay(c, key); r.StatusCode() != http.StatusOK || *r.JSON200.Response.Body != body {
					t.Fatalf("replay %d within the budget: %d %s", i+1, r.StatusCode(), r.Body)
				}
			}
			r := replay(c, key)
			p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusTooManyRequests, "rate-limited")
			requireRetryAfter(t, r.HTTPResponse, 1, 1)
			if !strings.Contains(p.Detail, "read_bytes_per_s 2048") {
				t.Errorf("detail %q does not name the budget", p.Detail)
			}
			st := c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)})
			requireProblem(t, st.HTTPResponse, st.Body, http.StatusTooManyRequests, "rate-limited")
			// What is not a read goes on.
			if st := c.status(idem.GetStatusParams{Key: key}); st.StatusCode() != http.StatusOK {
				t.Fatalf("status without the response over the read budget: %d %s", st.StatusCode(), st.Body)
			}
			c.acquire(idem.BeginRequest{Key: idemtest.Unique("new")})
			if r := replay(other, otherKey); r.StatusCode() != http.StatusOK {
				t.Fatalf("another tenant's replay: %d %s", r.StatusCode(), r.Body)
			}
			// Paid back within a second.
			time.Sleep(1100 * time.Millisecond)
			if st := c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)}); st.StatusCode() != http.StatusOK || *st.JSON200.Response.Body != body {
				t.Fatalf("status with the response after a second: %d %s", st.StatusCode(), st.Body)
			}
			if got := e.labelled(t, "idemsvc_limit_rejections_total", `limit="read_bytes_per_s",tenant="`+names["reader"]+`"`); got != 2 {
				t.Errorf("read rejections = %v, want 2", got)
			}
		})
	}
}
