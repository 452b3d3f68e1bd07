// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// GET /v1/keys through the SDK's iterator: a tenant lists its own records
// in one state, page by page, and never another's; an admin lists any
// listed tenant's; bad parameters are 400 naming the field.
func TestE2EListKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startWithTenants(t, b)
		sdk := func(apiKey string, opts ...idem.Option) *idem.Client {
			c, err := idem.New(e.url, append([]idem.Option{idem.WithAPIKey(apiKey), idem.WithHTTP(e.http)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		payments, billing := sdk(keyPayments), sdk(keyBilling)
		prefix := idemtest.Unique("list")
		stuck := map[string]bool{}
		for i := range 25 {
			key := fmt.Sprintf("%s-busy-%d", prefix, i)
			if _, err := payments.Begin(t.Context(), idem.BeginParams{Key: key}); err != nil {
				t.Fatal(err)
			}
			stuck[key] = true
		}
		done := fmt.Sprintf("%s-done", prefix)
		res, err := payments.Begin(t.Context(), idem.BeginParams{Key: done})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := payments.Complete(t.Context(), done, res.Lease.LeaseToken, idem.Response{Body: []byte("ok")}, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := billing.Begin(t.Context(), idem.BeginParams{Key: prefix + "-billing"}); err != nil {
			t.Fatal(err)
		}

		list := func(c *idem.Client, p idem.ListParams) (map[string]bool, error) {
			seen := map[string]bool{}
			for rec, err := range c.Keys(t.Context(), p) {
				if err != nil {
					return seen, err
				}
				if string(rec.State) != string(p.State) || rec.Response != nil {
					t.Errorf("listed %+v while listing %s", rec, p.State)
				}
				if strings.HasPrefix(rec.Key, prefix) {
					seen[rec.Key] = true
				}
			}
			return seen, nil
		}
		seen, err := list(payments, idem.ListParams{State: idem.StateInProgress, PageSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		for key := range stuck {
			if !seen[key] {
				t.Errorf("%s not listed", key)
			}
		}
		if len(seen) != len(stuck) {
			t.Errorf("listed %d of the test's in-progress records, want %d (no completed, no billing's)", len(seen), len(stuck))
		}
		if seen, _ := list(payments, idem.ListParams{State: idem.StateCompleted}); !seen[done] || len(seen) != 1 {
			t.Errorf("completed: %v, want only %s", seen, done)
		}
		if seen, _ := list(payments, idem.ListParams{State: idem.StateInProgress, OlderThan: time.Hour}); len(seen) != 0 {
			t.Errorf("older than an hour: %v", seen)
		}
		// The admin lists billing's records by naming the tenant.
		if seen, err := list(sdk(keyOps, idem.WithTenant("billing")), idem.ListParams{State: idem.StateInProgress}); err != nil || !seen[prefix+"-billing"] || len(seen) != 1 {
			t.Errorf("admin listing billing: %v, %v", seen, err)
		}
		if _, err := list(sdk(keyOps, idem.WithTenant("nobody")), idem.ListParams{State: idem.StateInProgress}); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("admin listing an unlisted tenant: %v, want not found", err)
		}
		if _, err := list(sdk(keyPayments, idem.WithTenant("billing")), idem.ListParams{State: idem.StateInProgress}); !errors.Is(err, idem.ErrForbidden) {
			t.Errorf("a tenant listing another: %v, want forbidden", err)
		}

		for query, field := range map[string]string{
			"state=stuck":                 "state",
			"state=completed&limit=0":     "limit",
			"state=completed&limit=1001":  "limit",
			"state=completed&cursor=abc!": "cursor",
			"":                            "state",
		} {
			resp, body := e.raw(t, http.MethodGet, "/v1/keys?"+query, "", nil, "Authorization", "Bearer "+keyPayments)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), field) {
				t.Errorf("GET /v1/keys?%s = %d %s; want 400 naming %s", query, resp.StatusCode, body, field)
			}
		}
	})
}
