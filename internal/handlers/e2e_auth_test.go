// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"testing"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// startWithTenants serves store with the tenants payments, billing and the
// admin ops.
func startWithTenants(t *testing.T, b backend) *env {
	t.Helper()
	return start(t, handlers.Config{Store: b.Open(t), Keyring: tenantsKeyring(t)})
}

// API keys, tenants and what each may see and change.
func TestE2EAuth(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startWithTenants(t, b)

		t.Run("a missing or wrong key is 401 and changes nothing", func(t *testing.T) {
			t.Parallel()
			payments := e.as(t, keyPayments)
			key := idemtest.Unique("order")
			token := payments.acquire(idem.BeginRequest{Key: key}).LeaseToken
			fresh := idemtest.Unique("fresh")
			before := payments.snapshot(key)

			for _, header := range []string{"", "Bearer", "Bearer ", "Bearer wrong-key", "Basic " + keyPayments,
				keyPayments, "Bearer " + keyPayments + "x", "Bearer " + strings.ToUpper(keyPayments)} {
				var editor []idem.RequestEditorFn
				editor = append(editor, func(_ context.Context, r *http.Request) error {
					if header != "" {
						r.Header.Set("Authorization", header)
					}
					return nil
				})
				c := e.client(t, "")
				var answers []answer
				r1, err := c.BeginWithResponse(bg, idem.BeginRequest{Key: fresh}, editor...)
				must(t, err)
				answers = append(answers, answer{r1.HTTPResponse, r1.Body})
				r2, err := c.CompleteWithResponse(bg, idem.CompleteRequest{Key: key, LeaseToken: token}, editor...)
				must(t, err)
				answers = append(answers, answer{r2.HTTPResponse, r2.Body})
				r3, err := c.FailWithResponse(bg, idem.FailRequest{Key: key, LeaseToken: token}, editor...)
				must(t, err)
				answers = append(answers, answer{r3.HTTPResponse, r3.Body})
				r4, err := c.ExtendWithResponse(bg, idem.ExtendRequest{Key: key, LeaseToken: token}, editor...)
				must(t, err)
				answers = append(answers, answer{r4.HTTPResponse, r4.Body})
				r5, err := c.GetStatusWithResponse(bg, &idem.GetStatusParams{Key: key}, editor...)
				must(t, err)
				answers = append(answers, answer{r5.HTTPResponse, r5.Body})
				r6, err := c.DeleteKeyWithResponse(bg, &idem.DeleteKeyParams{Key: key}, editor...)
				must(t, err)
				answers = append(answers, answer{r6.HTTPResponse, r6.Body})
				for i, a := range answers {
					requireProblem(t, a.resp, a.body, http.StatusUnauthorized, "unauthorized")
					if h := a.resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
						t.Fatalf("call %d with Authorization %q: WWW-Authenticate %q, want Bearer", i, header, h)
					}
				}
			}
			// A call without a key is 401 before its parameters are looked at.
			for _, path := range []string{"/v1/status", "/v1/status?include_response=maybe", "/v1/keys", "/v1/keys?key=" + strings.Repeat("k", 300)} {
				method := http.MethodGet
				if strings.HasPrefix(path, "/v1/keys") {
					method = http.MethodDelete
				}
				resp, body := e.raw(t, method, path, "", nil)
				requireProblem(t, resp, body, http.StatusUnauthorized, "unauthorized")
			}
			resp, body := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"Key":1}`))
			requireProblem(t, resp, body, http.StatusUnauthorized, "unauthorized")
			if after := payments.snapshot(key); after != before {
				t.Fatalf("unauthenticated calls changed the record:\n%s\n%s", before, after)
			}
			payments.requireAbsent(fresh)
			for _, c := range []*caller{e.as(t, keyBilling), e.as(t, keyOps)} {
				c.requireAbsent(fresh)
			}
		})

		t.Run("the same key under two tenants is two records", func(t *testing.T) {
			t.Parallel()
			payments, billing := e.as(t, keyPayments), e.as(t, keyBilling)
			key := idemtest.Unique("invoice")
			p := payments.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-payments")})
			bl := billing.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-billing")})
			if bl.Attempt != 1 || bl.LeaseToken == p.LeaseToken {
				t.Fatalf("billing's begin: %+v, payments' %+v", bl, p)
			}
			// One tenant's token means nothing under the other.
			r := billing.complete(idem.CompleteRequest{Key: key, LeaseToken: p.LeaseToken})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
			payments.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: p.LeaseToken, Response: &idem.StoredResponse{Body: ptr("payments")}})

			if rec := billing.record(key); rec.State != idem.StateInProgress || rec.Tenant != "billing" || *rec.Fingerprint != "fp-billing" {
				t.Fatalf("billing's record: %+v", rec)
			}
			if rec := payments.record(key); rec.State != idem.StateCompleted || rec.Tenant != "payments" || *rec.Response.Body != "payments" {
				t.Fatalf("payments' record: %+v", rec)
			}
			// Deleting under one tenant leaves the other's.
			if d := billing.del(idem.DeleteKeyParams{Key: key}); d.StatusCode() != http.StatusNoContent {
				t.Fatalf("delete: %d", d.StatusCode())
			}
			billing.requireAbsent(key)
			if rec := payments.record(key); rec.State != idem.StateCompleted {
				t.Fatalf("payments' record after billing's delete: %+v", rec)
			}
			// The admin's own tenant has neither.
			e.as(t, keyOps).requireAbsent(key)
		})

		t.Run("a tenant naming another tenant is 403 and changes nothing", func(t *testing.T) {
			t.Parallel()
			payments, billing := e.as(t, keyPayments), e.as(t, keyBilling)
			held, released := idemtest.Unique("held"), idemtest.Unique("released")
			token := billing.acquire(idem.BeginRequest{Key: held}).LeaseToken
			l := billing.acquire(idem.BeginRequest{Key: released})
			billing.mustFail(idem.FailRequest{Key: released, LeaseToken: l.LeaseToken})
			beforeHeld, beforeReleased := billing.snapshot(held), billing.snapshot(released)
			other := ptr("billing")

			var answers []answer
			add := func(resp *http.Response, body []byte) { answers = append(answers, answer{resp, body}) }
			r1 := payments.begin(idem.BeginRequest{Key: released, Tenant: other})
			add(r1.HTTPResponse, r1.Body)
			r2 := payments.complete(idem.CompleteRequest{Key: held, LeaseToken: token, Tenant: other})
			add(r2.HTTPResponse, r2.Body)
			r3 := payments.fail(idem.FailRequest{Key: held, LeaseToken: token, Retryable: ptr(false), Tenant: other})
			add(r3.HTTPResponse, r3.Body)
			r4 := payments.extend(idem.ExtendRequest{Key: held, LeaseToken: token, LeaseMs: ptr[int64](3600000), Tenant: other})
			add(r4.HTTPResponse, r4.Body)
			r5 := payments.status(idem.GetStatusParams{Key: held, IncludeResponse: ptr(true), Tenant: other})
			add(r5.HTTPResponse, r5.Body)
			r6 := payments.del(idem.DeleteKeyParams{Key: held, Tenant: other})
			add(r6.HTTPResponse, r6.Body)
			r7 := payments.del(idem.DeleteKeyParams{Key: released, Tenant: ptr("ops")})
			add(r7.HTTPResponse, r7.Body)
			for _, a := range answers {
				requireProblem(t, a.resp, a.body, http.StatusForbidden, "forbidden")
				if m := members(t, a.body); m["state"] != nil || m["key"] != nil {
					t.Fatalf("a 403 tells about the record: %s", a.body)
				}
			}
			if got := billing.snapshot(held); got != beforeHeld {
				t.Fatalf("billing's record in progress changed:\n%s\n%s", beforeHeld, got)
			}
			if got := billing.snapshot(released); got != beforeReleased {
				t.Fatalf("billing's released record changed:\n%s\n%s", beforeReleased, got)
			}
			payments.requireAbsent(held)
			payments.requireAbsent(released)
		})

		t.Run("a tenant may name itself", func(t *testing.T) {
			t.Parallel()
			payments := e.as(t, keyPayments)
			key := idemtest.Unique("order")
			self := ptr("payments")
			l := payments.acquire(idem.BeginRequest{Key: key, Tenant: self})
			payments.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Tenant: self})
			if rec := payments.record(key); rec.State != idem.StateCompleted || rec.Tenant != "payments" {
				t.Fatalf("record: %+v", rec)
			}
			if r := payments.status(idem.GetStatusParams{Key: key, Tenant: self}); r.StatusCode() != http.StatusOK {
				t.Fatalf("status naming itself: %d %s", r.StatusCode(), r.Body)
			}
			if r := payments.del(idem.DeleteKeyParams{Key: key, Tenant: self}); r.StatusCode() != http.StatusNoContent {
				t.Fatalf("delete naming itself: %d %s", r.StatusCode(), r.Body)
			}
			payments.requireAbsent(key)
		})

		t.Run("an admin acts for a tenant it names", func(t *testing.T) {
			t.Parallel()
			ops, payments := e.as(t, keyOps), e.as(t, keyPayments)
			key := idemtest.Unique("order")
			forPayments := ptr("payments")
			l := ops.acquire(idem.BeginRequest{Key: key, Tenant: forPayments, LeaseMs: ptr[int64](60000)})
			// The record is payments': payments sees it and may finish it.
			if rec := payments.record(key); rec.State != idem.StateInProgress || rec.Tenant != "payments" {
				t.Fatalf("payments' view: %+v", rec)
			}
			ops.requireAbsent(key) // not under the admin's own tenant
			ext := ops.extend(idem.ExtendRequest{Key: key, LeaseToken: l.LeaseToken, LeaseMs: ptr[int64](120000), Tenant: forPayments})
			requireJSON(t, ext.HTTPResponse, ext.Body, http.StatusOK)
			payments.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("paid")}})

			r := ops.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true), Tenant: forPayments})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			if rec := r.JSON200; rec.Tenant != "payments" || rec.State != idem.StateCompleted || *rec.Response.Body != "paid" {
				t.Fatalf("admin's view of payments' record: %s", r.Body)
			}
			// The admin fails and deletes for the tenant too.
			key2 := idemtest.Unique("order")
			l2 := ops.acquire(idem.BeginRequest{Key: key2, Tenant: forPayments})
			ops.mustFail(idem.FailRequest{Key: key2, LeaseToken: l2.LeaseToken, Retryable: ptr(false), Tenant: forPayments})
			if rec := payments.record(key2); rec.State != idem.StateFailed {
				t.Fatalf("payments' view after the admin's fail: %+v", rec)
			}
			if d := ops.del(idem.DeleteKeyParams{Key: key, Tenant: forPayments}); d.StatusCode() != http.StatusNoContent {
				t.Fatalf("admin delete: %d %s", d.StatusCode(), d.Body)
			}
			payments.requireAbsent(key)
			// Billing never saw any of it.
			e.as(t, keyBilling).requireAbsent(key2)
		})

		t.Run("an admin naming a malformed tenant is 400", func(t *testing.T) {
			t.Parallel()
			ops := e.as(t, keyOps)
			r := ops.begin(idem.BeginRequest{Key: idemtest.Unique("order"), Tenant: ptr("Payments!")})
			p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusBadRequest, "invalid-request")
			requireField(t, p, "tenant")
		})

		t.Run("an admin naming a tenant the file does not list is 404 naming it", func(t *testing.T) {
			t.Parallel()
			ops := e.as(t, keyOps)
			key := idemtest.Unique("order")
			r := ops.begin(idem.BeginRequest{Key: key, Tenant: ptr("paymnets")})
			p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			if !strings.Contains(p.Detail, `"paymnets"`) {
				t.Errorf("detail %q does not name the tenant", p.Detail)
			}
			s := ops.status(idem.GetStatusParams{Key: key, Tenant: ptr("paymnets")})
			requireProblem(t, s.HTTPResponse, s.Body, http.StatusNotFound, "not-found")
		})

		t.Run("keys full of special characters are just keys, per tenant", func(t *testing.T) {
			t.Parallel()
			payments, billing := e.as(t, keyPayments), e.as(t, keyBilling)
			id := idemtest.Unique("")
			keys := []string{
				"{" + id + "}", "{" + id + "}*", "*" + id, "?" + id, `\` + id, id + `\*?{}`,
				"{payments}" + id, "{billing:" + id + "}", id + "+&=%#/;,", "%2A" + id, "*",
			}
			tokens := map[string]string{}
			for _, k := range keys {
				// "*" alone may remain from an earlier run on a shared server.
				payments.del(idem.DeleteKeyParams{Key: k})
				billing.del(idem.DeleteKeyParams{Key: k})
				tokens[k] = payments.acquire(idem.BeginRequest{Key: k}).LeaseToken
			}
			for _, k := range keys {
				rec := payments.record(k)
				if rec.Key != k || rec.State != idem.StateInProgress {
					t.Fatalf("status of %q: %+v", k, rec)
				}
				billing.requireAbsent(k)
			}
			// Completing and deleting one touches no other, whatever its
			// characters mean to Redis or to URLs.
			for _, k := range []string{"*", "{" + id + "}"} {
				payments.mustComplete(idem.CompleteRequest{Key: k, LeaseToken: tokens[k], Response: &idem.StoredResponse{Body: ptr(k)}})
				if d := payments.del(idem.DeleteKeyParams{Key: k}); d.StatusCode() != http.StatusNoContent {
					t.Fatalf("delete %q: %d", k, d.StatusCode())
				}
				payments.requireAbsent(k)
			}
			for _, k := range keys {
				if k == "*" || k == "{"+id+"}" {
					continue
				}
				if rec := payments.record(k); rec.State != idem.StateInProgress || rec.Key != k {
					t.Fatalf("%q after other keys were deleted: %+v", k, rec)
				}
				bl := billing.acquire(idem.BeginRequest{Key: k})
				if bl.Attempt != 1 {
					t.Fatalf("billing's %q: attempt %d", k, bl.Attempt)
				}
				r := payments.begin(idem.BeginRequest{Key: k})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
			}
		})

		t.Run("health, readiness and metrics need no key", func(t *testing.T) {
			t.Parallel()
			for _, path := range []string{"/healthz", "/readyz"} {
				resp, body := e.raw(t, http.MethodGet, path, "", nil)
				requireJSON(t, resp, body, http.StatusOK)
				var h idem.Health
				if err := json.Unmarshal(body, &h); err != nil || h.Status != idem.HealthStatusOk {
					t.Fatalf("%s: %s", path, body)
				}
			}
			c := e.client(t, "")
			hr, err := c.HealthzWithResponse(bg)
			must(t, err)
			if hr.JSON200 == nil || hr.JSON200.Status != idem.HealthStatusOk {
				t.Fatalf("healthz through the client: %d %s", hr.StatusCode(), hr.Body)
			}
			rr, err := c.ReadyzWithResponse(bg)
			must(t, err)
			if rr.JSON200 == nil || rr.JSON200.Status != idem.HealthStatusOk {
				t.Fatalf("readyz through the client: %d %s", rr.StatusCode(), rr.Body)
			}
			mr, err := c.MetricsWithResponse(bg)
			must(t, err)
			if mr.StatusCode() != http.StatusOK {
				t.Fatalf("metrics: %d %s", mr.StatusCode(), mr.Body)
			}
			if mt, _, _ := mime.ParseMediaType(mr.HTTPResponse.Header.Get("Content-Type")); mt != "text/plain" {
				t.Fatalf("metrics Content-Type %q", mr.HTTPResponse.Header.Get("Content-Type"))
			}
			if !strings.Contains(string(mr.Body), "\nidemsvc_") && !strings.HasPrefix(string(mr.Body), "idemsvc_") {
				t.Fatalf("no idemsvc_ metric in /metrics")
			}
		})

		t.Run("the status query carries any key", func(t *testing.T) {
			t.Parallel()
			// A raw query: the key is percent-encoded by hand, as a non-Go
			// caller would.
			payments := e.as(t, keyPayments)
			key := idemtest.Unique("q") + "&key=other;tenant=billing"
			payments.acquire(idem.BeginRequest{Key: key})
			resp, body := e.raw(t, http.MethodGet, "/v1/status?key="+url.QueryEscape(key), "", nil, "Authorization", "Bearer "+keyPayments)
			requireJSON(t, resp, body, http.StatusOK)
			var rec idem.StatusRecord
			if err := json.Unmarshal(body, &rec); err != nil || rec.Key != key || rec.Tenant != "payments" {
				t.Fatalf("status: %s (%v)", body, err)
			}
		})
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("request: %v", err)
	}
}
