// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// wellFormedToken is a lease token idemsvc never issued.
const wellFormedToken = "0123456789abcdef0123456789abcdef"

// The outcomes of POST /v1/complete.
func TestE2EComplete(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("stores the response", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, RetentionS: ptr[int64](600)})
			r := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{StatusCode: ptr(201), Body: ptr("created")}})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "status", "key", "attempt", "completed_at", "expires_at")
			done := r.JSON200
			if done.Status != idem.FinishedStateCompleted || done.Key != key || done.Attempt != 1 {
				t.Fatalf("complete: %s", r.Body)
			}
			// Retention counts from the transition; begin's retention_s holds.
			if d := done.ExpiresAt.Sub(done.CompletedAt.Time); d != 600*time.Second {
				t.Fatalf("expires_at is %s after completed_at, want the begin's retention of 600s", d)
			}
			rec := c.record(key)
			if rec.State != idem.StateCompleted || !sameTime(rec.UpdatedAt, *done.CompletedAt) || !sameTime(rec.ExpiresAt, done.ExpiresAt) {
				t.Fatalf("status after complete: %+v", rec)
			}
		})

		t.Run("retention_s of complete replaces begin's", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, RetentionS: ptr[int64](600)})
			done := c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, RetentionS: ptr[int64](3600)})
			if d := done.ExpiresAt.Sub(done.CompletedAt.Time); d != time.Hour {
				t.Fatalf("expires_at is %s after completed_at, want 1h", d)
			}
		})

		t.Run("a retried complete gets the same result and changes nothing", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			first := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{StatusCode: ptr(201), Body: ptr("first")}})
			requireJSON(t, first.HTTPResponse, first.Body, http.StatusOK)
			before := c.snapshot(key)
			for _, resp := range []*idem.StoredResponse{
				{StatusCode: ptr(201), Body: ptr("first")},
				{StatusCode: ptr(500), Body: ptr("second")},
			} {
				again := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: resp})
				requireJSON(t, again.HTTPResponse, again.Body, http.StatusOK)
				if !bytes.Equal(again.Body, first.Body) {
					t.Fatalf("retried complete: %s, first gave %s", again.Body, first.Body)
				}
			}
			if after := c.snapshot(key); after != before {
				t.Fatalf("a retried complete changed the record:\n%s\n%s", before, after)
			}
			if r := c.begin(idem.BeginRequest{Key: key}); *r.JSON200.Response.Body != "first" {
				t.Fatalf("replay after a retried complete: %s", r.Body)
			}
		})

		leaseLost := []struct {
			name  string
			setup func(c *caller, key string) (token string)
		}{
			{"after a terminal failure", func(c *caller, key string) string {
				l := c.acquire(idem.BeginRequest{Key: key})
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false)})
				return l.LeaseToken
			}},
			{"after a retryable failure", func(c *caller, key string) string {
				l := c.acquire(idem.BeginRequest{Key: key})
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken})
				return l.LeaseToken
			}},
			{"with the token of an earlier attempt", func(c *caller, key string) string {
				l := c.acquire(idem.BeginRequest{Key: key})
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken})
				c.acquire(idem.BeginRequest{Key: key})
				return l.LeaseToken
			}},
			{"with a token never issued", func(c *caller, key string) string {
				c.acquire(idem.BeginRequest{Key: key})
				return wellFormedToken
			}},
		}
		for _, row := range leaseLost {
			t.Run("409 lease-lost "+row.name, func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				key := idemtest.Unique("order")
				token := row.setup(c, key)
				before := c.snapshot(key)
				r := c.complete(idem.CompleteRequest{Key: key, LeaseToken: token, Response: &idem.StoredResponse{Body: ptr("x")}})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
				if after := c.snapshot(key); after != before {
					t.Fatalf("a refused complete changed the record:\n%s\n%s", before, after)
				}
			})
		}

		t.Run("404 without a record", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			if r := c.del(idem.DeleteKeyParams{Key: key}); r.StatusCode() != http.StatusNoContent {
				t.Fatalf("delete: %d %s", r.StatusCode(), r.Body)
			}
			r := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("x")}})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			c.requireAbsent(key)
			never := idemtest.Unique("never")
			r = c.complete(idem.CompleteRequest{Key: never, LeaseToken: wellFormedToken})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			c.requireAbsent(never)
		})

		// The limit counts the body after decoding plus the header names and
		// values: 1 MiB is stored (although its base64 is larger), one byte
		// more is refused.
		const mib = 1 << 20
		headers := map[string]string{"Content-Type": "application/octet-stream"}
		headerBytes := len("Content-Type") + len("application/octet-stream")

		t.Run("a response of exactly 1 MiB is stored and replayed", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			binary := bytes.Repeat([]byte{0x00, 0xff, 0x7f, 0x80}, (mib-headerBytes)/4+1)[:mib-headerBytes]
			encoded := base64.StdEncoding.EncodeToString(binary)
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{
				Headers: headers, Body: &encoded, BodyEncoding: ptr(idem.BodyEncodingBase64)}})
			r := c.begin(idem.BeginRequest{Key: key})
			if r.StatusCode() != http.StatusOK || r.JSON200.Response.Body == nil || *r.JSON200.Response.Body != encoded {
				t.Fatalf("replay of a 1 MiB response: %d", r.StatusCode())
			}
		})

		t.Run("413 for a response of 1 MiB plus one byte", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			before := c.snapshot(key)
			body := strings.Repeat("b", mib-headerBytes+1)
			r := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Headers: headers, Body: &body}})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusRequestEntityTooLarge, "too-large")
			if after := c.snapshot(key); after != before {
				t.Fatalf("a refused complete changed the record:\n%s\n%s", before, after)
			}
			// The holder can still complete with a smaller response.
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("small")}})
		})
	})
}

// The outcomes of POST /v1/fail.
func TestE2EFail(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("a terminal failure is stored", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, RetentionS: ptr[int64](600)})
			r := c.fail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false), Error: ptr("card declined")})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "status", "key", "attempt", "failed_at", "expires_at", "retryable")
			res := r.JSON200
			if res.Status != idem.FinishedStateFailed || res.Key != key || res.Attempt != 1 || *res.Retryable {
				t.Fatalf("fail: %s", r.Body)
			}
			if d := res.ExpiresAt.Sub(res.FailedAt.Time); d != 600*time.Second {
				t.Fatalf("expires_at is %s after failed_at, want 600s", d)
			}
			rec := c.record(key)
			if rec.State != idem.StateFailed || rec.Retryable == nil || *rec.Retryable || rec.Error == nil || *rec.Error != "card declined" {
				t.Fatalf("status after a terminal failure: %+v", rec)
			}
		})

		for _, row := range []struct {
			name      string
			retryable *bool
		}{{"retryable: true", ptr(true)}, {"retryable omitted (the default)", nil}} {
			t.Run("a retryable failure releases the key, "+row.name, func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				key := idemtest.Unique("order")
				first := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
				r := c.fail(idem.FailRequest{Key: key, LeaseToken: first.LeaseToken, Retryable: row.retryable, Error: ptr("timeout upstream")})
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				if res := r.JSON200; res.Status != idem.FinishedStateFailed || res.Retryable == nil || !*res.Retryable {
					t.Fatalf("release: %s", r.Body)
				}
				rec := c.record(key)
				if rec.State != idem.StateFailed || rec.Retryable == nil || !*rec.Retryable {
					t.Fatalf("status of a released key: %+v", rec)
				}
				// The same owner too gets a new attempt, not the old lease.
				second := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
				if second.Attempt != 2 || second.Recovered || second.LeaseToken == first.LeaseToken {
					t.Fatalf("begin after a release: %+v", second)
				}
				rc := c.complete(idem.CompleteRequest{Key: key, LeaseToken: first.LeaseToken})
				requireProblem(t, rc.HTTPResponse, rc.Body, http.StatusConflict, "lease-lost")
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: second.LeaseToken})
				if third := c.acquire(idem.BeginRequest{Key: key}); third.Attempt != 3 {
					t.Fatalf("attempt after two releases: %d, want 3", third.Attempt)
				}
			})
		}

		t.Run("a retried fail gets the same result and changes nothing", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			for _, retryable := range []bool{false, true} {
				key := idemtest.Unique("order")
				l := c.acquire(idem.BeginRequest{Key: key})
				req := idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: &retryable, Error: ptr("boom"),
					Response: &idem.StoredResponse{StatusCode: ptr(502)}}
				first := c.fail(req)
				requireJSON(t, first.HTTPResponse, first.Body, http.StatusOK)
				before := c.snapshot(key)
				again := c.fail(req)
				requireJSON(t, again.HTTPResponse, again.Body, http.StatusOK)
				if !bytes.Equal(again.Body, first.Body) {
					t.Fatalf("retried fail (retryable %v): %s, first gave %s", retryable, again.Body, first.Body)
				}
				if after := c.snapshot(key); after != before {
					t.Fatalf("a retried fail changed the record:\n%s\n%s", before, after)
				}
			}
		})

		t.Run("409 lease-lost after complete", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("ok")}})
			before := c.snapshot(key)
			for _, retryable := range []bool{false, true} {
				r := c.fail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: &retryable})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
			}
			if after := c.snapshot(key); after != before {
				t.Fatalf("a refused fail changed the record:\n%s\n%s", before, after)
			}
		})

		t.Run("404 without a record", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			r := c.fail(idem.FailRequest{Key: key, LeaseToken: wellFormedToken, Retryable: ptr(false)})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			c.requireAbsent(key)
		})
	})
}

// The outcomes of POST /v1/extend.
func TestE2EExtend(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("pushes lease_expires_at", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("worker-a"), LeaseMs: ptr[int64](100)})
			r := c.extend(idem.ExtendRequest{Key: key, LeaseToken: l.LeaseToken, LeaseMs: ptr[int64](60000)})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "attempt", "lease_token", "lease_expires_at")
			ext := r.JSON200
			if ext.Key != key || ext.Attempt != 1 || ext.LeaseToken != l.LeaseToken {
				t.Fatalf("extend: %s", r.Body)
			}
			if d := ext.LeaseExpiresAt.Sub(l.LeaseExpiresAt.Time); d < 59*time.Second {
				t.Fatalf("extend moved lease_expires_at by %s, want about 60s", d)
			}
			if rec := c.record(key); rec.LeaseExpiresAt == nil || !sameTime(*rec.LeaseExpiresAt, ext.LeaseExpiresAt) {
				t.Fatalf("status lease_expires_at %v, want %s", rec.LeaseExpiresAt, ext.LeaseExpiresAt)
			}
			// Past the first lease's end the key is still held.
			time.Sleep(time.Until(l.LeaseExpiresAt.Time) + 50*time.Millisecond)
			rb := c.begin(idem.BeginRequest{Key: key, Owner: ptr("worker-b")})
			p := requireProblem(t, rb.HTTPResponse, rb.Body, http.StatusConflict, "in-progress")
			if p.LeaseExpiresAt == nil || !sameTime(*p.LeaseExpiresAt, ext.LeaseExpiresAt) {
				t.Fatalf("in-progress lease_expires_at %v, want the extended %s", p.LeaseExpiresAt, ext.LeaseExpiresAt)
			}
			if rec := c.record(key); *rec.LeaseExpired {
				t.Fatalf("an extended lease shows as expired")
			}
		})

		t.Run("409 lease-lost with the token of a taken-over attempt", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			old := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](100)})
			c.awaitLeaseExpired(key)
			c.acquire(idem.BeginRequest{Key: key})
			before := c.snapshot(key)
			r := c.extend(idem.ExtendRequest{Key: key, LeaseToken: old.LeaseToken, LeaseMs: ptr[int64](60000)})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
			if after := c.snapshot(key); after != before {
				t.Fatalf("a refused extend changed the record:\n%s\n%s", before, after)
			}
		})

		t.Run("409 lease-lost once the attempt finished", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			for _, finish := range []func(key, token string){
				func(key, token string) { c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: token}) },
				func(key, token string) {
					c.mustFail(idem.FailRequest{Key: key, LeaseToken: token, Retryable: ptr(false)})
				},
				func(key, token string) {
					c.mustFail(idem.FailRequest{Key: key, LeaseToken: token, Retryable: ptr(true)})
				},
			} {
				key := idemtest.Unique("order")
				l := c.acquire(idem.BeginRequest{Key: key})
				finish(key, l.LeaseToken)
				before := c.snapshot(key)
				r := c.extend(idem.ExtendRequest{Key: key, LeaseToken: l.LeaseToken, LeaseMs: ptr[int64](60000)})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
				if after := c.snapshot(key); after != before {
					t.Fatalf("a refused extend changed the record:\n%s\n%s", before, after)
				}
			}
		})

		t.Run("404 without a record", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			r := c.extend(idem.ExtendRequest{Key: key, LeaseToken: wellFormedToken, LeaseMs: ptr[int64](60000)})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			c.requireAbsent(key)
		})
	})
}

// GET /v1/status: the fields of each state, with and without the response.
func TestE2EStatus(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("in progress", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1"), Fingerprint: ptr("sha256:abc")})
			r := c.status(idem.GetStatusParams{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "owner", "fingerprint",
				"created_at", "updated_at", "lease_expires_at", "lease_expired", "expires_at")
			rec := r.JSON200
			if rec.Key != key || rec.Tenant != "default" || rec.State != idem.StateInProgress || rec.Attempt != 1 ||
				*rec.Owner != "req-1" || *rec.Fingerprint != "sha256:abc" || *rec.LeaseExpired ||
				!sameTime(*rec.LeaseExpiresAt, l.LeaseExpiresAt) || !sameTime(rec.CreatedAt, rec.UpdatedAt) ||
				rec.ExpiresAt.Before(rec.LeaseExpiresAt.Time) {
				t.Fatalf("status: %s", r.Body)
			}
		})

		t.Run("in progress without owner or fingerprint omits them", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			c.acquire(idem.BeginRequest{Key: key})
			r := c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(false)})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "tenant", "state", "attempt",
				"created_at", "updated_at", "lease_expires_at", "lease_expired", "expires_at")
		})

		t.Run("completed, with and without the response", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1"), Fingerprint: ptr("sha256:abc")})
			stored := idem.StoredResponse{StatusCode: ptr(201), Headers: map[string]string{"Location": "/charges/ch_1"},
				Body: ptr(base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xff})), BodyEncoding: ptr(idem.BodyEncodingBase64)}
			done := c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &stored})

			r := c.status(idem.GetStatusParams{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "owner", "fingerprint",
				"created_at", "updated_at", "expires_at")
			rec := r.JSON200
			if rec.State != idem.StateCompleted || rec.Attempt != 1 || !sameTime(rec.UpdatedAt, *done.CompletedAt) ||
				!sameTime(rec.ExpiresAt, done.ExpiresAt) {
				t.Fatalf("status: %s", r.Body)
			}

			r = c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			m := requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "owner", "fingerprint",
				"created_at", "updated_at", "expires_at", "response")
			if got, want := string(m["response"]), responseJSON(t, stored); got != want {
				t.Fatalf("response %s, want %s", got, want)
			}
		})

		t.Run("failed terminally", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			stored := idem.StoredResponse{StatusCode: ptr(402), Body: ptr("declined"), BodyEncoding: ptr(idem.BodyEncodingText)}
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false), Error: ptr("card declined"), Response: &stored})
			r := c.status(idem.GetStatusParams{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "created_at", "updated_at", "expires_at", "retryable", "error")
			if rec := r.JSON200; rec.State != idem.StateFailed || *rec.Retryable || *rec.Error != "card declined" {
				t.Fatalf("status: %s", r.Body)
			}
			r = c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)})
			m := requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "created_at", "updated_at", "expires_at",
				"retryable", "error", "response")
			if got, want := string(m["response"]), responseJSON(t, stored); got != want {
				t.Fatalf("response %s, want %s", got, want)
			}
		})

		t.Run("released, without an error message", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(true)})
			r := c.status(idem.GetStatusParams{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			requireMembers(t, r.Body, "key", "tenant", "state", "attempt", "created_at", "updated_at", "expires_at", "retryable")
			if rec := r.JSON200; rec.State != idem.StateFailed || !*rec.Retryable {
				t.Fatalf("status: %s", r.Body)
			}
		})

		t.Run("404 without a record", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			r := c.status(idem.GetStatusParams{Key: idemtest.Unique("never"), IncludeResponse: ptr(true)})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
		})
	})
}

// DELETE /v1/keys forgets a record; the key is new again.
func TestE2EDelete(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("a completed key is forgotten", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1")})
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("ok")}})
			r := c.del(idem.DeleteKeyParams{Key: key})
			if r.StatusCode() != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete: %d %q", r.StatusCode(), r.Body)
			}
			c.requireAbsent(key)
			// A new key: attempt 1 again, and the old fingerprint is gone.
			again := c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-2")})
			if again.Attempt != 1 || again.Recovered {
				t.Fatalf("begin after delete: %+v", again)
			}
			rc := c.complete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken})
			requireProblem(t, rc.HTTPResponse, rc.Body, http.StatusConflict, "lease-lost")
		})

		t.Run("an attempt in progress is forgotten", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key})
			if r := c.del(idem.DeleteKeyParams{Key: key}); r.StatusCode() != http.StatusNoContent {
				t.Fatalf("delete: %d %s", r.StatusCode(), r.Body)
			}
			r := c.extend(idem.ExtendRequest{Key: key, LeaseToken: l.LeaseToken})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
			c.acquire(idem.BeginRequest{Key: key})
		})

		t.Run("204 also when absent", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("never")
			for range 2 {
				if r := c.del(idem.DeleteKeyParams{Key: key}); r.StatusCode() != http.StatusNoContent {
					t.Fatalf("delete of an absent key: %d %s", r.StatusCode(), r.Body)
				}
			}
			c.requireAbsent(key)
		})
	})
}
