// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"encoding/base64"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// The outcomes of POST /v1/begin, one subtest per row of the contract's
// table, on every backend.
func TestE2EBegin(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("a new key is acquired", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			before := time.Now()
			r := c.begin(idem.BeginRequest{Key: key, Owner: ptr("req-1"), LeaseMs: ptr[int64](20000)})
			after := time.Now()
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusCreated)
			requireMembers(t, r.Body, "status", "key", "attempt", "lease_token", "lease_expires_at", "recovered")
			a := r.JSON201
			if a.Status != idem.BeginAcquiredStatusAcquired || a.Key != key || a.Attempt != 1 || a.Recovered || a.LeaseToken == "" {
				t.Fatalf("acquired: %s", r.Body)
			}
			// The lease runs lease_ms from now (the store's clock, on this machine).
			lo, hi := before.Add(19*time.Second), after.Add(21*time.Second)
			if a.LeaseExpiresAt.Before(lo) || a.LeaseExpiresAt.After(hi) {
				t.Fatalf("lease_expires_at %s, want about 20s from now (%s)", a.LeaseExpiresAt, before)
			}
		})

		t.Run("the lease defaults to 30s", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			before := time.Now()
			a := c.acquire(idem.BeginRequest{Key: idemtest.Unique("order")})
			if d := a.LeaseExpiresAt.Sub(before); d < 29*time.Second || d > 31*time.Second {
				t.Fatalf("lease_expires_at is %s after the begin, want 30s", d)
			}
		})

		t.Run("the same owner gets its live lease again", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			first := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
			before := c.snapshot(key)
			r := c.begin(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusCreated)
			again := r.JSON201
			if again.LeaseToken != first.LeaseToken || again.Attempt != first.Attempt ||
				!sameTime(again.LeaseExpiresAt, first.LeaseExpiresAt) || again.Recovered || again.Key != key {
				t.Fatalf("re-begin by the owner: got %+v, want the lease %+v", again, first)
			}
			if after := c.snapshot(key); after != before {
				t.Fatalf("re-begin changed the record:\n%s\n%s", before, after)
			}
			// The lease is the owner's: it completes with the token.
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: again.LeaseToken})
		})

		t.Run("another caller gets 409 in-progress", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			held := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1"), LeaseMs: ptr[int64](20000)})
			before := c.snapshot(key)
			for _, other := range []*string{ptr("req-2"), nil} {
				r := c.begin(idem.BeginRequest{Key: key, Owner: other})
				p := requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
				// The attempt is moments old: a retry is worth making in a
				// second (2 allows for a slow machine), not at the lease's end.
				requireRetryAfter(t, r.HTTPResponse, 1, 2)
				if r.Headers409 == nil || r.Headers409.RetryAfter < 1 {
					t.Fatalf("Retry-After not parsed by the client: %+v", r.Headers409)
				}
				if p.Attempt == nil || *p.Attempt != 1 {
					t.Fatalf("attempt member: %s", r.Body)
				}
				if p.LeaseExpiresAt == nil || !sameTime(*p.LeaseExpiresAt, held.LeaseExpiresAt) {
					t.Fatalf("lease_expires_at member %v, want %s", p.LeaseExpiresAt, held.LeaseExpiresAt)
				}
				if v := members(t, r.Body)["lease_expires_at"]; !milliRE.Match(v) {
					t.Fatalf("lease_expires_at %s: not RFC 3339 UTC with milliseconds", v)
				}
			}
			if after := c.snapshot(key); after != before {
				t.Fatalf("a refused begin changed the record:\n%s\n%s", before, after)
			}
		})

		t.Run("begins without an owner never match", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			c.acquire(idem.BeginRequest{Key: key})
			r := c.begin(idem.BeginRequest{Key: key})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "in-progress")
		})

		t.Run("a completed key replays a binary response byte for byte", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			binary := make([]byte, 4096)
			for i := range binary {
				binary[i] = byte(i*7 + i/256) // every byte value, 0x00 and 0xff included
			}
			encoded := base64.StdEncoding.EncodeToString(binary)
			headers := map[string]string{
				"Content-Type":  "application/octet-stream",
				"Cache-Control": "no-store, max-age=0",
				"X-Charge-Id":   "ch_123",
				"x-lower":       "  spaced value  ",
			}
			lease := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
			done := c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{
				StatusCode: ptr(201), Headers: headers, Body: &encoded, BodyEncoding: ptr(idem.BodyEncodingBase64),
			}})
			for _, owner := range []*string{ptr("req-2"), ptr("req-1"), nil} { // every later begin replays
				r := c.begin(idem.BeginRequest{Key: key, Owner: owner})
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				m := requireMembers(t, r.Body, "status", "key", "attempt", "completed_at", "response")
				rp := r.JSON200
				if rp.Status != idem.FinishedStateCompleted || rp.Key != key || rp.Attempt != 1 ||
					rp.CompletedAt == nil || !sameTime(*rp.CompletedAt, *done.CompletedAt) {
					t.Fatalf("replay: %s; complete gave %+v", r.Body, done)
				}
				requireMembers(t, m["response"], "status_code", "headers", "body", "body_encoding")
				resp := rp.Response
				if resp.StatusCode == nil || *resp.StatusCode != 201 || !maps.Equal(resp.Headers, headers) ||
					resp.BodyEncoding == nil || *resp.BodyEncoding != idem.BodyEncodingBase64 || resp.Body == nil || *resp.Body != encoded {
					t.Fatalf("replayed response: %s", m["response"])
				}
				got, err := base64.StdEncoding.DecodeString(*resp.Body)
				if err != nil || !bytes.Equal(got, binary) {
					t.Fatalf("replayed body differs from the stored bytes (err %v)", err)
				}
			}
		})

		t.Run("a completed key replays a text body byte for byte", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			small := "{\"charge_id\":\"ch_123\",\"note\":\"naïve ☃ 😀 <b>&amp;</b>\"}\r\n\t\x00\x01 \\ end"
			// A large body is escaped and written in pieces.
			for _, text := range []string{small, strings.Repeat(small, 1500)} {
				key := idemtest.Unique("order")
				lease := c.acquire(idem.BeginRequest{Key: key})
				c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{
					StatusCode: ptr(200), Headers: map[string]string{"Content-Type": "application/json; charset=utf-8"}, Body: &text,
				}})
				r := c.begin(idem.BeginRequest{Key: key})
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				resp := r.JSON200.Response
				if resp.Body == nil || *resp.Body != text || resp.BodyEncoding == nil || *resp.BodyEncoding != idem.BodyEncodingText ||
					resp.StatusCode == nil || *resp.StatusCode != 200 || resp.Headers["Content-Type"] != "application/json; charset=utf-8" {
					t.Fatalf("replayed response of a body of %d bytes differs", len(text))
				}
			}
		})

		t.Run("a completed key replays a response of only a body", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("msg")
			lease := c.acquire(idem.BeginRequest{Key: key})
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{Body: ptr("ack")}})
			r := c.begin(idem.BeginRequest{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			m := requireMembers(t, r.Body, "status", "key", "attempt", "completed_at", "response")
			requireMembers(t, m["response"], "body", "body_encoding")
			if *r.JSON200.Response.Body != "ack" {
				t.Fatalf("replay: %s", r.Body)
			}
		})

		t.Run("a completed key without a response replays an empty response", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("msg")
			lease := c.acquire(idem.BeginRequest{Key: key})
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken})
			r := c.begin(idem.BeginRequest{Key: key})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
			m := requireMembers(t, r.Body, "status", "key", "attempt", "completed_at", "response")
			requireMembers(t, m["response"])
		})

		t.Run("a terminal failure replays its response and error", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			lease := c.acquire(idem.BeginRequest{Key: key})
			failed := c.mustFail(idem.FailRequest{Key: key, LeaseToken: lease.LeaseToken, Retryable: ptr(false), Error: ptr("card declined"),
				Response: &idem.StoredResponse{StatusCode: ptr(402), Headers: map[string]string{"Content-Type": "application/json"}, Body: ptr(`{"error":"card_declined"}`)}})
			for range 2 {
				r := c.begin(idem.BeginRequest{Key: key, Owner: ptr("req-2")})
				requireJSON(t, r.HTTPResponse, r.Body, http.StatusOK)
				requireMembers(t, r.Body, "status", "key", "attempt", "failed_at", "response", "error")
				rp := r.JSON200
				if rp.Status != idem.FinishedStateFailed || rp.Key != key || rp.Attempt != 1 || rp.Error == nil || *rp.Error != "card declined" ||
					rp.FailedAt == nil || !sameTime(*rp.FailedAt, *failed.FailedAt) {
					t.Fatalf("replay: %s", r.Body)
				}
				if rp.Response.StatusCode == nil || *rp.Response.StatusCode != 402 || *rp.Response.Body != `{"error":"card_declined"}` ||
					rp.Response.Headers["Content-Type"] != "application/json" {
					t.Fatalf("replayed response: %s", r.Body)
				}
			}
		})

		t.Run("a released key is acquired again by the next begin", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			first := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-1")})
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: first.LeaseToken, Retryable: ptr(true)})
			second := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("req-2")})
			if second.Attempt != 2 || second.Recovered || second.LeaseToken == first.LeaseToken {
				t.Fatalf("after a release: %+v", second)
			}
		})

		// A different fingerprint is refused whatever the state; the same
		// one gets the state's usual answer.
		states := []struct {
			name       string
			setup      func(c *caller, key string)
			sameStatus int
		}{
			{"in progress", func(c *caller, key string) {
				c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1"), Owner: ptr("req-1")})
			}, http.StatusConflict},
			{"completed", func(c *caller, key string) {
				l := c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1")})
				c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("ok")}})
			}, http.StatusOK},
			{"failed terminally", func(c *caller, key string) {
				l := c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1")})
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false)})
			}, http.StatusOK},
			{"released", func(c *caller, key string) {
				l := c.acquire(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1")})
				c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(true)})
			}, http.StatusCreated},
		}
		for _, s := range states {
			t.Run("a different fingerprint is 422 when "+s.name, func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				key := idemtest.Unique("order")
				s.setup(c, key)
				before := c.snapshot(key)
				r := c.begin(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-2"), Owner: ptr("req-9")})
				requireProblem(t, r.HTTPResponse, r.Body, http.StatusUnprocessableEntity, "fingerprint-mismatch")
				if r.ApplicationproblemJSON422 == nil {
					t.Fatalf("the client did not parse the 422")
				}
				if after := c.snapshot(key); after != before {
					t.Fatalf("a mismatching begin changed the record:\n%s\n%s", before, after)
				}
				r = c.begin(idem.BeginRequest{Key: key, Fingerprint: ptr("fp-1"), Owner: ptr("req-9")})
				if r.StatusCode() != s.sameStatus {
					t.Fatalf("same fingerprint: got %d %s, want %d", r.StatusCode(), r.Body, s.sameStatus)
				}
			})
		}

		t.Run("fingerprints are compared only when both carry one", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			withFP, withoutFP := idemtest.Unique("fp"), idemtest.Unique("nofp")
			l := c.acquire(idem.BeginRequest{Key: withFP, Fingerprint: ptr("fp-1")})
			c.mustComplete(idem.CompleteRequest{Key: withFP, LeaseToken: l.LeaseToken})
			if r := c.begin(idem.BeginRequest{Key: withFP}); r.StatusCode() != http.StatusOK {
				t.Fatalf("begin without a fingerprint: got %d %s, want the replay", r.StatusCode(), r.Body)
			}
			l = c.acquire(idem.BeginRequest{Key: withoutFP})
			c.mustComplete(idem.CompleteRequest{Key: withoutFP, LeaseToken: l.LeaseToken})
			if r := c.begin(idem.BeginRequest{Key: withoutFP, Fingerprint: ptr("fp-9")}); r.StatusCode() != http.StatusOK {
				t.Fatalf("begin with a fingerprint on a record without one: got %d %s, want the replay", r.StatusCode(), r.Body)
			}
		})
	})
}

// A lease that ran out is taken over by the next begin; the old token is
// dead from then on.
func TestE2ELeaseExpiry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))

		t.Run("the next begin takes over with recovered", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			old := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("worker-a"), LeaseMs: ptr[int64](100)})
			c.awaitLeaseExpired(key)
			rec := c.record(key)
			if rec.State != idem.StateInProgress || rec.Attempt != 1 {
				t.Fatalf("expired lease before takeover: %+v", rec)
			}
			r := c.begin(idem.BeginRequest{Key: key, Owner: ptr("worker-b")})
			requireJSON(t, r.HTTPResponse, r.Body, http.StatusCreated)
			taken := r.JSON201
			if !taken.Recovered || taken.Attempt != 2 || taken.LeaseToken == old.LeaseToken {
				t.Fatalf("takeover: %s", r.Body)
			}
			if v := members(t, r.Body)["recovered"]; string(v) != "true" {
				t.Fatalf("recovered member %s, want true", v)
			}

			// The old token is dead: complete, fail and extend are refused
			// and change nothing.
			before := c.snapshot(key)
			rc := c.complete(idem.CompleteRequest{Key: key, LeaseToken: old.LeaseToken, Response: &idem.StoredResponse{Body: ptr("late")}})
			requireProblem(t, rc.HTTPResponse, rc.Body, http.StatusConflict, "lease-lost")
			rf := c.fail(idem.FailRequest{Key: key, LeaseToken: old.LeaseToken, Retryable: ptr(false)})
			requireProblem(t, rf.HTTPResponse, rf.Body, http.StatusConflict, "lease-lost")
			rx := c.extend(idem.ExtendRequest{Key: key, LeaseToken: old.LeaseToken, LeaseMs: ptr[int64](60000)})
			requireProblem(t, rx.HTTPResponse, rx.Body, http.StatusConflict, "lease-lost")
			if after := c.snapshot(key); after != before {
				t.Fatalf("a dead token changed the record:\n%s\n%s", before, after)
			}

			done := c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: taken.LeaseToken, Response: &idem.StoredResponse{Body: ptr("second")}})
			if done.Attempt != 2 {
				t.Fatalf("complete by the new holder: %+v", done)
			}
			rb := c.begin(idem.BeginRequest{Key: key})
			if rb.StatusCode() != http.StatusOK || rb.JSON200.Attempt != 2 || *rb.JSON200.Response.Body != "second" {
				t.Fatalf("replay after takeover: %d %s", rb.StatusCode(), rb.Body)
			}
		})

		t.Run("the owner of an expired lease gets a new attempt", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			old := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("worker-a"), LeaseMs: ptr[int64](100)})
			c.awaitLeaseExpired(key)
			again := c.acquire(idem.BeginRequest{Key: key, Owner: ptr("worker-a")})
			if !again.Recovered || again.Attempt != 2 || again.LeaseToken == old.LeaseToken {
				t.Fatalf("re-begin after expiry: %+v", again)
			}
		})

		t.Run("a holder nobody took over from may still complete", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](100)})
			c.awaitLeaseExpired(key)
			done := c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: ptr("late but fine")}})
			if done.Status != idem.FinishedStateCompleted || done.Attempt != 1 {
				t.Fatalf("complete after expiry: %+v", done)
			}
		})

		t.Run("a holder nobody took over from may still fail", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("order")
			l := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr[int64](100)})
			c.awaitLeaseExpired(key)
			res := c.mustFail(idem.FailRequest{Key: key, LeaseToken: l.LeaseToken, Retryable: ptr(false), Error: ptr("gave up")})
			if res.Status != idem.FinishedStateFailed || res.Retryable == nil || *res.Retryable {
				t.Fatalf("fail after expiry: %+v", res)
			}
		})
	})
}
