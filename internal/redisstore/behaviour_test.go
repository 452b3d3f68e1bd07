// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestBeginAcquiresAndReplays(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		start := time.Now()
		res := s.mustBegin(sm.BeginRequest{Owner: "req-1", Fingerprint: "fp", Lease: 5 * time.Second})
		if !res.Acquired || res.Lease.Attempt != 1 || res.Lease.Recovered || len(res.Lease.Token) != 32 {
			t.Fatalf("begin: got %+v, want a first acquisition", res)
		}
		if d := res.Lease.ExpiresAt.Sub(start); d < 4*time.Second || d > 6*time.Second {
			t.Errorf("lease expires %v after the call, want about 5s", d)
		}

		// The same owner gets the same lease back; anybody else is refused.
		again := s.mustBegin(sm.BeginRequest{Owner: "req-1"})
		if !again.Acquired || again.Lease != res.Lease {
			t.Errorf("same owner: got %+v, want the lease %+v", again.Lease, res.Lease)
		}
		_, err := s.begin(sm.BeginRequest{Owner: "req-2"})
		var busy *sm.InProgressError
		if !errors.As(err, &busy) || busy.Attempt != 1 || !busy.LeaseExpiresAt.Equal(res.Lease.ExpiresAt) {
			t.Fatalf("other owner: got %v, want in progress by attempt 1 until %v", err, res.Lease.ExpiresAt)
		}

		done, err := s.complete("paid")
		if err != nil {
			t.Fatal(err)
		}
		if done.State != sm.StateCompleted || done.Attempt != 1 || done.ExpiresAt.Sub(done.UpdatedAt) != 24*time.Hour {
			t.Errorf("complete: got %+v, want completed, attempt 1, retained 24h", done)
		}
		retried, err := s.complete("a different body")
		if err != nil || retried.UpdatedAt != done.UpdatedAt || retried.ExpiresAt != done.ExpiresAt {
			t.Errorf("retried complete: got %+v, %v; want the first answer %+v", retried, err, done)
		}

		replay := s.mustBegin(sm.BeginRequest{Owner: "req-3", Fingerprint: "fp"})
		if replay.Acquired || replay.Record.State != sm.StateCompleted || replay.Record.Attempt != 1 ||
			!replay.Record.UpdatedAt.Equal(done.UpdatedAt) {
			t.Fatalf("replay: got %+v", replay.Record)
		}
		resp := replay.Record.Response
		if resp.StatusCode != 201 || resp.Headers["Content-Type"] != "text/plain" || string(resp.Body) != "paid" {
			t.Errorf("replayed response: got %+v, want the first complete's", resp)
		}
	})
}

func TestStatusFields(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{Owner: "worker-7", Fingerprint: "sha256:abc", Lease: shortLease, Retention: time.Hour})
		rec := s.status()
		if rec.Tenant != s.tenant || rec.Key != s.key || rec.State != sm.StateInProgress || rec.Owner != "worker-7" ||
			rec.Fingerprint != "sha256:abc" || rec.LeaseExpired || rec.LeaseExpiresAt.IsZero() ||
			rec.CreatedAt.IsZero() || !rec.CreatedAt.Equal(rec.UpdatedAt) {
			t.Fatalf("in progress: got %+v", rec)
		}
		if d := rec.ExpiresAt.Sub(rec.LeaseExpiresAt); d != time.Hour {
			t.Errorf("retention: expires %v after the lease, want 1h", d)
		}
		s.waitLeaseExpiry()
		if rec := s.status(); !rec.LeaseExpired {
			t.Errorf("after the lease: got lease_expired false")
		}
		if _, err := s.fail(false); err != nil {
			t.Fatal(err)
		}
		rec = s.status()
		if rec.State != sm.StateFailed || rec.Retryable || rec.Error != "card declined" ||
			rec.Response.StatusCode != 402 || !rec.LeaseExpiresAt.IsZero() {
			t.Errorf("failed: got %+v", rec)
		}
		noResponse, err := s.store.Status(ctx, s.tenant, s.key, false)
		if err != nil || !noResponse.Response.IsZero() {
			t.Errorf("status without response: got %+v, %v", noResponse.Response, err)
		}
	})
}

func TestLeaseExpiryAndTakeover(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		first := s.mustBegin(sm.BeginRequest{Owner: "a", Lease: shortLease}).Lease
		if _, err := s.begin(sm.BeginRequest{Owner: "b"}); !errors.Is(err, sm.ErrInProgress) {
			t.Fatalf("within the lease: got %v, want in progress", err)
		}
		s.waitLeaseExpiry()
		// The old owner's begin after expiry is a new attempt too.
		second := s.mustBegin(sm.BeginRequest{Owner: "a", Lease: shortLease}).Lease
		if second.Attempt != 2 || !second.Recovered || second.Token == first.Token {
			t.Fatalf("takeover: got %+v, want attempt 2, recovered, new token", second)
		}
		s.lease = first
		if _, err := s.complete("late"); !errors.Is(err, sm.ErrLeaseLost) {
			t.Fatalf("stale complete: got %v, want lease lost", err)
		}
		if _, err := s.extend(time.Second); !errors.Is(err, sm.ErrLeaseLost) {
			t.Fatalf("stale extend: got %v, want lease lost", err)
		}
		s.lease = second
		if _, err := s.complete("on time"); err != nil {
			t.Fatal(err)
		}
		if got := s.status(); got.Attempt != 2 || string(got.Response.Body) != "on time" {
			t.Errorf("after: got attempt %d body %q", got.Attempt, got.Response.Body)
		}
	})
}

func TestExtendKeepsTheLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{Lease: 200 * time.Millisecond})
		for range 3 {
			time.Sleep(100 * time.Millisecond)
			lease, err := s.extend(200 * time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if lease.Token != s.lease.Token || !lease.ExpiresAt.After(s.lease.ExpiresAt) {
				t.Fatalf("extend: got %+v after %+v", lease, s.lease)
			}
			s.lease = lease
		}
		// 300 ms after a 200 ms begin, the extended lease still holds.
		if _, err := s.begin(sm.BeginRequest{}); !errors.Is(err, sm.ErrInProgress) {
			t.Fatalf("begin on an extended lease: got %v, want in progress", err)
		}
		if rec := s.status(); !rec.LeaseExpiresAt.Equal(s.lease.ExpiresAt) {
			t.Errorf("status lease: got %v, want %v", rec.LeaseExpiresAt, s.lease.ExpiresAt)
		}
	})
}

func TestRetryableFailureReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		first := s.mustBegin(sm.BeginRequest{}).Lease
		if _, err := s.fail(true); err != nil {
			t.Fatal(err)
		}
		second := s.mustBegin(sm.BeginRequest{})
		if !second.Acquired || second.Lease.Attempt != 2 || second.Lease.Recovered {
			t.Fatalf("after a retryable failure: got %+v, want attempt 2, not recovered", second)
		}
		s.lease = first
		if _, err := s.fail(true); !errors.Is(err, sm.ErrLeaseLost) {
			t.Errorf("fail with the released token: got %v, want lease lost", err)
		}
	})
}

func TestTerminalFailureReplays(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{})
		failed, err := s.fail(false)
		if err != nil {
			t.Fatal(err)
		}
		replay := s.mustBegin(sm.BeginRequest{})
		rec := replay.Record
		if replay.Acquired || rec.State != sm.StateFailed || rec.Retryable || rec.Error != "card declined" ||
			string(rec.Response.Body) != `{"error":"declined"}` || !rec.UpdatedAt.Equal(failed.UpdatedAt) {
			t.Errorf("replay: got %+v", replay)
		}
	})
}

func TestRetentionExpiry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{Retention: time.Hour})
		done, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: s.lease.Token, Retention: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if d := done.ExpiresAt.Sub(done.UpdatedAt); d != time.Second {
			t.Fatalf("complete kept %v, want the 1s it asked for", d)
		}
		time.Sleep(time.Until(done.ExpiresAt) + 50*time.Millisecond)
		if rec := s.status(); rec != nil {
			t.Fatalf("after retention: got %+v, want no record", rec)
		}
		again := s.mustBegin(sm.BeginRequest{})
		if !again.Acquired || again.Lease.Attempt != 1 {
			t.Errorf("begin after retention: got %+v, want a new key", again)
		}
	})
}

// TestInProgressOutlivesShortRetention: an in-progress record lives its
// retention past its lease, so a retention shorter than the lease neither
// frees the key early nor resets the attempt count at a takeover.
func TestInProgressOutlivesShortRetention(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{Retention: time.Second, Lease: 1500 * time.Millisecond})
		time.Sleep(1200 * time.Millisecond)
		if _, err := s.begin(sm.BeginRequest{}); !errors.Is(err, sm.ErrInProgress) {
			t.Fatalf("begin within the lease, after retention: got %v, want in progress", err)
		}
		s.waitLeaseExpiry()
		res := s.mustBegin(sm.BeginRequest{})
		if !res.Acquired || res.Lease.Attempt != 2 || !res.Lease.Recovered {
			t.Fatalf("begin after the lease: got %+v, want attempt 2 recovered", res.Lease)
		}
	})
}

func TestBinaryBodyReplaysByteForByte(t *testing.T) {
	var b strings.Builder
	for i := range 64 << 10 {
		b.WriteByte(byte(i * 7))
	}
	body := b.String()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{})
		resp := sm.Response{StatusCode: 200, Body: body, Base64: true,
			Headers: map[string]string{"Content-Type": "application/octet-stream", "X-Empty": "", "X-Bin": "\x01\xff"}}
		if _, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: s.lease.Token, Response: resp}); err != nil {
			t.Fatal(err)
		}
		got := s.mustBegin(sm.BeginRequest{}).Record.Response
		if got.Body != body || !got.Base64 || got.StatusCode != 200 || len(got.Headers) != 3 ||
			got.Headers["X-Bin"] != "\x01\xff" || got.Headers["Content-Type"] != "application/octet-stream" {
			t.Errorf("replay differs: status %d, base64 %v, headers %q, body equal %v",
				got.StatusCode, got.Base64, got.Headers, got.Body == body)
		}
	})
}

func TestConcurrentBeginHasOneWinner(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		stores := []sm.Store{open(t), open(t), open(t)}
		tenant, key := idemtest.Unique("t"), idemtest.Unique("race")
		var acquired, busy atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 200 {
			wg.Go(func() {
				<-start
				// A begin that times out on a busy machine is retried as the
				// contract says is safe: with the same owner, which gets its
				// lease back if the first try acquired.
				req := sm.BeginRequest{Key: key, Owner: fmt.Sprintf("caller-%d", i)}
				res, err := stores[i%3].Begin(ctx, tenant, req)
				for try := 0; try < 10 && errors.Is(err, sm.ErrStoreUnavailable); try++ {
					res, err = stores[i%3].Begin(ctx, tenant, req)
				}
				switch {
				case err == nil && res.Acquired:
					acquired.Add(1)
				case errors.Is(err, sm.ErrInProgress):
					busy.Add(1)
				default:
					t.Errorf("begin %d: got %+v, %v", i, res, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if acquired.Load() != 1 || busy.Load() != 199 {
			t.Errorf("got %d acquired and %d in progress, want 1 and 199", acquired.Load(), busy.Load())
		}
	})
}

func TestAwkwardKeys(t *testing.T) {
	keys := []string{
		`{}*?\`, `{x}`, `}{`, `*`, `?`, `\`, `{{{{`, `a{b}c`,
		strings.Repeat("k", 255), strings.Repeat(`{`, 255), strings.Repeat(`\*?}`, 63) + "~~~",
	}
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		tenant := idemtest.Unique("t")
		for i, key := range keys {
			res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
			if err != nil || !res.Acquired {
				t.Fatalf("begin %q: got %+v, %v", key, res, err)
			}
			if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: sm.Response{Body: strconv.Itoa(i)}}); err != nil {
				t.Fatalf("complete %q: %v", key, err)
			}
		}
		for i, key := range keys {
			rec, err := store.Status(ctx, tenant, key, true)
			if err != nil || rec.Key != key || rec.Response.Body != strconv.Itoa(i) {
				t.Errorf("status %q: got key %q body %q, %v", key, rec.Key, rec.Response.Body, err)
			}
		}
	})
}

func TestTenantsAreSeparate(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		a, b := idemtest.Unique("a"), idemtest.Unique("b")
		key := idemtest.Unique("shared-key")
		la, err := store.Begin(ctx, a, sm.BeginRequest{Key: key, Fingerprint: "fa"})
		if err != nil || !la.Acquired {
			t.Fatalf("tenant a: %+v, %v", la, err)
		}
		lb, err := store.Begin(ctx, b, sm.BeginRequest{Key: key, Fingerprint: "fb"})
		if err != nil || !lb.Acquired {
			t.Fatalf("tenant b with the same key: got %+v, %v; want its own record", lb, err)
		}
		if _, err := store.Complete(ctx, b, sm.CompleteRequest{Key: key, Token: la.Lease.Token}); !errors.Is(err, sm.ErrLeaseLost) {
			t.Errorf("tenant b with tenant a's token: got %v, want lease lost", err)
		}
		if _, err := store.Complete(ctx, a, sm.CompleteRequest{Key: key, Token: la.Lease.Token, Response: sm.Response{Body: "a"}}); err != nil {
			t.Fatal(err)
		}
		if err := store.Delete(ctx, b, key); err != nil {
			t.Fatal(err)
		}
		rec, err := store.Status(ctx, a, key, true)
		if err != nil || string(rec.Response.Body) != "a" || rec.Tenant != a {
			t.Errorf("tenant a after b deleted its key: got %+v, %v", rec, err)
		}
	})
}

func TestInvalidInputChangesNothing(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		s.mustBegin(sm.BeginRequest{Retention: time.Hour})
		before := s.status()
		tok := s.lease.Token
		cases := []struct {
			name    string
			op      func() error
			field   string // for ErrInvalid
			wantErr error
		}{
			{"empty key", func() error { _, err := s.store.Begin(ctx, s.tenant, sm.BeginRequest{}); return err }, "key", sm.ErrInvalid},
			{"key too long", func() error { _, err := s.store.Begin(ctx, s.tenant, sm.BeginRequest{Key: long(256)}); return err }, "key", sm.ErrInvalid},
			{"key with a space", func() error { _, err := s.store.Begin(ctx, s.tenant, sm.BeginRequest{Key: "a b"}); return err }, "key", sm.ErrInvalid},
			{"key with non-ASCII", func() error { _, err := s.store.Begin(ctx, s.tenant, sm.BeginRequest{Key: "café"}); return err }, "key", sm.ErrInvalid},
			{"bad tenant", func() error { _, err := s.store.Begin(ctx, "Payments", sm.BeginRequest{Key: s.key}); return err }, "tenant", sm.ErrInvalid},
			{"fingerprint too long", func() error { _, err := s.begin(sm.BeginRequest{Fingerprint: long(257)}); return err }, "fingerprint", sm.ErrInvalid},
			{"owner too long", func() error { _, err := s.begin(sm.BeginRequest{Owner: long(257)}); return err }, "owner", sm.ErrInvalid},
			{"lease too short", func() error { _, err := s.begin(sm.BeginRequest{Lease: 99 * time.Millisecond}); return err }, "lease_ms", sm.ErrInvalid},
			{"lease too long", func() error { _, err := s.begin(sm.BeginRequest{Lease: time.Hour + time.Millisecond}); return err }, "lease_ms", sm.ErrInvalid},
			{"retention too long", func() error { _, err := s.begin(sm.BeginRequest{Retention: 30*24*time.Hour + time.Second}); return err }, "retention_s", sm.ErrInvalid},
			{"negative retention", func() error { _, err := s.begin(sm.BeginRequest{Retention: -time.Second}); return err }, "retention_s", sm.ErrInvalid},
			{"missing token", func() error {
				_, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key})
				return err
			}, "lease_token", sm.ErrInvalid},
			{"malformed token", func() error {
				_, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: "not-a-token"})
				return err
			}, "lease_token", sm.ErrInvalid},
			{"status code", func() error {
				_, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: tok, Response: sm.Response{StatusCode: 600}})
				return err
			}, "response.status_code", sm.ErrInvalid},
			{"response too large", func() error {
				_, err := s.store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: tok,
					Response: sm.Response{Body: strings.Repeat("x", 1<<20-10), Headers: map[string]string{"X-Pad": long(11)}}})
				return err
			}, "", sm.ErrTooLarge},
			{"error message too long", func() error {
				_, err := s.store.Fail(ctx, s.tenant, sm.FailRequest{Key: s.key, Token: tok, Error: long(1025)})
				return err
			}, "error", sm.ErrInvalid},
			{"extend lease too long", func() error {
				_, err := s.store.Extend(ctx, s.tenant, sm.ExtendRequest{Key: s.key, Token: tok, Lease: 2 * time.Hour})
				return err
			}, "lease_ms", sm.ErrInvalid},
		}
		for _, c := range cases {
			err := c.op()
			if !errors.Is(err, c.wantErr) {
				t.Errorf("%s: got %v, want %v", c.name, err, c.wantErr)
				continue
			}
			var inv *sm.InvalidError
			if c.field != "" && (!errors.As(err, &inv) || inv.Field != c.field) {
				t.Errorf("%s: got %v, want field %q named", c.name, err, c.field)
			}
		}
		if after := s.status(); after.State != before.State || after.UpdatedAt != before.UpdatedAt || after.LeaseExpiresAt != before.LeaseExpiresAt {
			t.Errorf("record changed: before %+v, after %+v", before, after)
		}
		// The response limit is inclusive, and the error message is not part of it.
		exact := sm.Response{Body: strings.Repeat("x", 1<<20-5), Headers: map[string]string{"X-Pad": ""}}
		if _, err := s.store.Fail(ctx, s.tenant, sm.FailRequest{Key: s.key, Token: tok, Error: long(1024), Response: exact}); err != nil {
			t.Errorf("a response of exactly 1 MiB: %v", err)
		}
	})
}

func TestStateNames(t *testing.T) {
	for _, s := range []sm.State{sm.StateInProgress, sm.StateCompleted, sm.StateFailed} {
		got, err := sm.ParseState(s.String())
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := sm.ParseState("released"); err == nil {
		t.Error("ParseState accepted an unknown name")
	}
}

// TestLimitsAreCappedAtWhatARecordHolds: a configured limit beyond the
// record's 16-bit length prefixes is capped, never written corrupt.
func TestLimitsAreCappedAtWhatARecordHolds(t *testing.T) {
	limits := sm.Limits{MaxOwnerBytes: 70000}
	stores := map[string]sm.Store{
		"memory": sm.NewMemoryStore(limits),
		"redis":  redisstore.New(redistest.SharedServer(t).Client(t), redisstore.Options{Limits: limits}),
	}
	for name, store := range stores {
		_, err := store.Begin(ctx, "t", sm.BeginRequest{Key: idemtest.Unique("k"), Owner: strings.Repeat("o", 1<<16)})
		var inv *sm.InvalidError
		if !errors.As(err, &inv) || inv.Field != "owner" {
			t.Errorf("%s: a 65,536-byte owner: got %v, want invalid owner", name, err)
		}
		if _, err := store.Begin(ctx, "t", sm.BeginRequest{Key: idemtest.Unique("k"), Owner: strings.Repeat("o", 1<<16-1)}); err != nil {
			t.Errorf("%s: a 65,535-byte owner: %v", name, err)
		}
	}
}
