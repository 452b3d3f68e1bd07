// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/lua"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// sdk is the Go SDK's client of e.
func (e *env) sdk(t *testing.T, apiKey string) *idem.Client {
	t.Helper()
	c, err := idem.New(e.url, idem.WithAPIKey(apiKey), idem.WithHTTP(e.http))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// batchResults posts a batch as raw JSON and returns its results.
func (e *env) batchResults(t *testing.T, path, body string) []idem.BatchResult {
	t.Helper()
	resp, b := e.raw(t, http.MethodPost, path, "application/json", strings.NewReader(body))
	requireJSON(t, resp, b, http.StatusOK)
	var out idem.BatchResponse
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("batch answer %s: %v", b, err)
	}
	return out.Results
}

// A begin batch mixing new keys, a completed key, a key in progress
// elsewhere, a fingerprint mismatch, an invalid item and a wait: each
// result is the single call's answer, in order, on every store; a finish
// batch completes, fails and meets a lost lease alike.
func TestE2EBatch(t *testing.T) {
	t.Parallel()
	for _, b := range idemtest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := startOn(t, b.Open(t))
			c, sdk := e.as(t, ""), e.sdk(t, "")

			done, busy, printed := idemtest.Unique("done"), idemtest.Unique("busy"), idemtest.Unique("printed")
			l := c.acquire(idem.BeginRequest{Key: done})
			c.mustComplete(idem.CompleteRequest{Key: done, LeaseToken: l.LeaseToken,
				Response: &idem.StoredResponse{StatusCode: ptr(201), Body: ptr("paid")}})
			other := c.acquire(idem.BeginRequest{Key: busy, Owner: ptr("elsewhere")})
			c.acquire(idem.BeginRequest{Key: printed, Fingerprint: ptr("fp-1")})
			fresh := []string{idemtest.Unique("new"), idemtest.Unique("new"), idemtest.Unique("new")}

			res, err := sdk.BeginBatch(bg, []idem.BeginParams{
				{Key: fresh[0]}, {Key: done}, {Key: busy}, {Key: printed, Fingerprint: "fp-2"}, {Key: fresh[1]},
				{Key: fresh[2], Owner: "me"},
			})
			if err != nil {
				t.Fatalf("begin batch: %v", err)
			}
			for _, i := range []int{0, 4, 5} {
				if res[i].Err != nil || res[i].Lease == nil || res[i].Lease.Key != fresh[i/4+i/5] || res[i].Lease.Attempt != 1 {
					t.Errorf("item %d: %+v, want acquired", i, res[i])
				}
			}
			if r := res[1]; r.Err != nil || r.Replay == nil || r.Replay.Status != idem.FinishedStateCompleted || *r.Replay.Response.Body != "paid" {
				t.Errorf("completed item: %+v", r)
			}
			var inProgress *idem.Error
			if !errors.As(res[2].Err, &inProgress) || !errors.Is(res[2].Err, idem.ErrInProgress) || inProgress.StatusCode != http.StatusConflict ||
				*inProgress.Problem.Attempt != other.Attempt || !inProgress.Problem.LeaseExpiresAt.Equal(other.LeaseExpiresAt.Time) {
				t.Errorf("in-progress item: %v %+v", res[2].Err, inProgress)
			}
			if !errors.Is(res[3].Err, idem.ErrFingerprintMismatch) {
				t.Errorf("mismatching item: %v", res[3].Err)
			}
			// The same owner again gets the same lease, as a single begin does.
			again, err := sdk.BeginBatch(bg, []idem.BeginParams{{Key: fresh[2], Owner: "me"}})
			if err != nil || again[0].Lease == nil || again[0].Lease.LeaseToken != res[5].Lease.LeaseToken {
				t.Errorf("same owner again: %v %+v", err, again)
			}

			// Byte for byte the single call's answer: a problem, a replay.
			results := e.batchResults(t, "/v1/begin/batch", `{"items":[{"key":"`+printed+`","fingerprint":"fp-2"},{"key":"`+done+`"},{"key":"x","bogus":1},{"key":"y","wait_ms":100},7]}`)
			single := func(body string) (int, string) {
				resp, b := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(body))
				return resp.StatusCode, strings.TrimSpace(string(b))
			}
			for i, body := range []string{`{"key":"` + printed + `","fingerprint":"fp-2"}`, `{"key":"` + done + `"}`, `{"key":"x","bogus":1}`} {
				status, want := single(body)
				if results[i].Status != status || strings.TrimSpace(string(results[i].Body)) != want {
					t.Errorf("item %d: %d %s, want the single call's %d %s", i, results[i].Status, results[i].Body, status, want)
				}
			}
			for i, field := range map[int]string{2: "bogus", 3: "wait_ms", 4: ""} {
				var p idem.Problem
				_ = json.Unmarshal(results[i].Body, &p)
				if results[i].Status != http.StatusBadRequest || p.Code != "invalid-request" || (field != "" && (p.Field == nil || *p.Field != field)) {
					t.Errorf("invalid item %d: %d %s, want 400 naming %q", i, results[i].Status, results[i].Body, field)
				}
			}
			c.requireAbsent("y") // a waiting item is refused, not begun

			// Finish: complete, terminal fail, a lost lease, an invalid item.
			lost := idemtest.Unique("lost")
			old := c.acquire(idem.BeginRequest{Key: lost})
			c.mustFail(idem.FailRequest{Key: lost, LeaseToken: old.LeaseToken})
			c.acquire(idem.BeginRequest{Key: lost})
			fin, err := sdk.FinishBatch(bg, []idem.FinishParams{
				{Key: fresh[0], Token: res[0].Lease.LeaseToken, Response: idem.Response{Body: []byte("one")}},
				{Key: fresh[1], Token: res[4].Lease.LeaseToken, Fail: &idem.FailParams{Terminal: true, Error: "declined"}},
				{Key: lost, Token: old.LeaseToken, Response: idem.Response{Body: []byte("late")}},
				{Key: fresh[2], Token: "not-a-token"},
			})
			if err != nil {
				t.Fatalf("finish batch: %v", err)
			}
			if fin[0].Err != nil || fin[0].Status != idem.FinishedStateCompleted || fin[0].Attempt != 1 {
				t.Errorf("complete item: %+v", fin[0])
			}
			if fin[1].Err != nil || fin[1].Status != idem.FinishedStateFailed || fin[1].Retryable == nil || *fin[1].Retryable {
				t.Errorf("fail item: %+v", fin[1])
			}
			if !errors.Is(fin[2].Err, idem.ErrLeaseLost) {
				t.Errorf("lost lease item: %v", fin[2].Err)
			}
			if !errors.Is(fin[3].Err, idem.ErrInvalid) {
				t.Errorf("bad token item: %v", fin[3].Err)
			}
			if r := c.begin(idem.BeginRequest{Key: fresh[0]}); r.JSON200 == nil || *r.JSON200.Response.Body != "one" {
				t.Errorf("replay after a batch complete: %d %s", r.StatusCode(), r.Body)
			}
			if r := c.begin(idem.BeginRequest{Key: fresh[1]}); r.JSON200 == nil || r.JSON200.Status != idem.FinishedStateFailed {
				t.Errorf("replay after a batch fail: %d %s", r.StatusCode(), r.Body)
			}
			// A retried finish batch answers as the first did.
			fin2, err := sdk.FinishBatch(bg, []idem.FinishParams{{Key: fresh[0], Token: res[0].Lease.LeaseToken, Response: idem.Response{Body: []byte("one")}}})
			if err != nil || fin2[0].Err != nil || !fin2[0].CompletedAt.Equal(fin[0].CompletedAt.Time) {
				t.Errorf("retried finish: %v %+v", err, fin2)
			}
			results = e.batchResults(t, "/v1/finish/batch", `{"items":[{"key":"a","lease_token":"00"},{"kind":"complete","key":"a","lease_token":"00","retryable":true}]}`)
			for i, field := range []string{"kind", "retryable"} {
				var p idem.Problem
				_ = json.Unmarshal(results[i].Body, &p)
				if results[i].Status != http.StatusBadRequest || p.Field == nil || *p.Field != field {
					t.Errorf("invalid finish item %d: %d %s, want 400 naming %s", i, results[i].Status, results[i].Body, field)
				}
			}
		})
	}
}

// A batch over the configured size, or with an invalid envelope, gets 400
// and changes nothing.
func TestE2EBatchEnvelope(t *testing.T) {
	t.Parallel()
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), MaxBatch: 3})
	c := e.as(t, "")
	keys := []string{idemtest.Unique("k"), idemtest.Unique("k"), idemtest.Unique("k"), idemtest.Unique("k")}
	items := make([]idem.BeginBatchItem, len(keys))
	for i, k := range keys {
		items[i], _ = json.Marshal(idem.BeginRequest{Key: k})
	}
	over, err := json.Marshal(idem.BeginBatchRequest{Items: items})
	must(t, err)
	for _, body := range []string{
		string(over),
		`{}`, `{"items":{}}`, `{"items":[],"more":1}`, `[]`,
	} {
		resp, b := e.raw(t, http.MethodPost, "/v1/begin/batch", "application/json", strings.NewReader(body))
		requireProblem(t, resp, b, http.StatusBadRequest, "invalid-request")
		resp, b = e.raw(t, http.MethodPost, "/v1/finish/batch", "application/json", strings.NewReader(body))
		requireProblem(t, resp, b, http.StatusBadRequest, "invalid-request")
	}
	for _, k := range keys {
		c.requireAbsent(k)
	}
	r, err := e.sdk(t, "").BeginBatch(bg, make([]idem.BeginParams, 4))
	if !errors.Is(err, idem.ErrInvalid) || r != nil {
		t.Errorf("SDK batch over the size: %v", err)
	}
	if got := e.batchResults(t, "/v1/begin/batch", `{"items":[]}`); len(got) != 0 {
		t.Errorf("empty batch: %v", got)
	}
}

// Every item counts against the tenant's begin rate.
func TestE2EBatchTenantRate(t *testing.T) {
	t.Parallel()
	keyring, names, keys := limitedTenants(t, map[string]string{"rate": "{begins_per_s: 1, burst: 3}"})
	l := quota.NewMemory(quota.Options{FlushInterval: testFlush})
	t.Cleanup(l.Close)
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: keyring, Limiter: l})
	sdk := e.sdk(t, keys["rate"])
	params := make([]idem.BeginParams, 5)
	for i := range params {
		params[i].Key = idemtest.Unique("k")
	}
	res, err := sdk.BeginBatch(bg, params)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if i < 3 && r.Lease == nil {
			t.Errorf("item %d within the burst: %v", i, r.Err)
		}
		if i >= 3 && !errors.Is(r.Err, idem.ErrRateLimited) {
			t.Errorf("item %d over the burst: %+v, want rate-limited", i, r)
		}
	}
	if r := e.as(t, keys["rate"]).begin(idem.BeginRequest{Key: idemtest.Unique("k")}); r.StatusCode() != http.StatusTooManyRequests {
		t.Errorf("single begin after the batch spent the burst: %d", r.StatusCode())
	}
	// Each item counts in idemsvc_begins_total as a single begin does.
	for outcome, want := range map[string]float64{"acquired": 3, "rate-limited": 3} {
		if got := e.labelled(t, "idemsvc_begins_total", `outcome="`+outcome+`",tenant="`+names["rate"]+`"`); got != want {
			t.Errorf("begins metric (%s) = %v, want %v", outcome, got, want)
		}
	}
}

// Every item counts against the tenant's in_progress limit, in order, and
// the items' leases are counted in Redis together: one round trip of
// slot.lua's for the batch, not one per item.
func TestE2EBatchTenantInProgress(t *testing.T) {
	t.Parallel()
	keyring, _, keys := limitedTenants(t, map[string]string{"held": "{in_progress: 4}"})
	rdb := redistest.SharedServer(t).Client(t)
	slots := &slotCalls{}
	rdb.AddHook(slots)
	l := quota.NewRedis(rdb, quota.Options{FlushInterval: time.Hour})
	t.Cleanup(l.Close)
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: keyring, Limiter: l})
	sdk := e.sdk(t, keys["held"])
	// The first lease held, slot.lua loaded (Redis may not have had it).
	if res, err := sdk.BeginBatch(bg, []idem.BeginParams{{Key: idemtest.Unique("k")}}); err != nil || res[0].Lease == nil {
		t.Fatalf("first batch: %+v, %v", res, err)
	}
	slots.mu.Lock()
	slots.roundTrips = 0
	slots.mu.Unlock()
	params := make([]idem.BeginParams, 5)
	for i := range params {
		params[i].Key = idemtest.Unique("k")
	}
	res, err := sdk.BeginBatch(bg, params)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if i < 3 && r.Lease == nil {
			t.Errorf("item %d within in_progress: %v", i, r.Err)
		}
		if i >= 3 && !errors.Is(r.Err, idem.ErrRateLimited) {
			t.Errorf("item %d over in_progress: %+v, want rate-limited", i, r)
		}
	}
	slots.mu.Lock()
	defer slots.mu.Unlock()
	if slots.roundTrips != 1 {
		t.Errorf("the items' leases were counted in %d round trips, want 1", slots.roundTrips)
	}
}

// slotCalls counts the round trips (single commands and pipelines) that
// run slot.lua.
type slotCalls struct {
	mu         sync.Mutex
	roundTrips int
}

func isSlot(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	script, _ := args[1].(string)
	return args[0] == "evalsha" && script == lua.Slot.Hash() || args[0] == "eval" && strings.HasPrefix(script, "-- slot.lua")
}

func (*slotCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *slotCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isSlot(cmd) {
			c.mu.Lock()
			c.roundTrips++
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (c *slotCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, isSlot) {
			c.mu.Lock()
			c.roundTrips++
			c.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// roundTrips counts the pipelines and single commands a Redis client sends,
// by node.
type roundTrips struct {
	mu        sync.Mutex
	pipelines map[string]int
	singles   int
}

func (c *roundTrips) hook(addr string) redis.Hook { return roundTripHook{c, addr} }

type roundTripHook struct {
	c    *roundTrips
	addr string
}

func (roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.mu.Lock()
		h.c.singles++
		h.c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.mu.Lock()
		h.c.pipelines[h.addr]++
		h.c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// A batch takes one round trip per master: one pipeline to each master
// that holds an item's key and no command of its own, on one node and on
// a Cluster, with and without WAIT; after Redis lost its scripts too.
func TestE2EBatchRoundTrips(t *testing.T) {
	t.Parallel()
	type setup struct {
		name    string
		client  func(t *testing.T, c *roundTrips) redis.UniversalClient
		masters int
		flush   func(t *testing.T)
		wait    int
	}
	cluster := func(t *testing.T, c *roundTrips) redis.UniversalClient {
		rdb := redistest.SharedCluster(t).Client(t)
		rdb.OnNewNode(func(n *redis.Client) { n.AddHook(c.hook(n.Options().Addr)) })
		return rdb
	}
	one := func(t *testing.T, c *roundTrips) redis.UniversalClient {
		rdb := redistest.SharedServer(t).Client(t)
		rdb.AddHook(c.hook(rdb.Options().Addr))
		return rdb
	}
	for _, s := range []setup{
		{name: "redis", client: one, masters: 1, flush: func(t *testing.T) {
			if err := redistest.SharedServer(t).Client(t).ScriptFlush(bg).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "cluster", client: cluster, masters: 3},
		{name: "cluster-wait", client: cluster, masters: 3, wait: 1},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			counts := &roundTrips{pipelines: map[string]int{}}
			store := redisstore.New(s.client(t, counts), redisstore.Options{WaitReplicas: s.wait})
			sdk := startOn(t, store).sdk(t, "")
			batch := func() []idem.BeginParams {
				p := make([]idem.BeginParams, 60) // on every master, most likely many times over
				for i := range p {
					p[i].Key = idemtest.Unique("rt")
				}
				return p
			}
			if _, err := sdk.BeginBatch(bg, batch()); err != nil { // loads the scripts
				t.Fatal(err)
			}
			if s.flush != nil {
				s.flush(t)
				res, err := sdk.BeginBatch(bg, batch())
				if err != nil || res[0].Lease == nil || res[59].Lease == nil {
					t.Fatalf("batch after SCRIPT FLUSH: %v %+v", err, res)
				}
			}
			counts.mu.Lock()
			clear(counts.pipelines)
			counts.singles = 0
			counts.mu.Unlock()
			res, err := sdk.BeginBatch(bg, batch())
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Lease == nil {
					t.Fatalf("item %d: %v", i, r.Err)
				}
			}
			counts.mu.Lock()
			defer counts.mu.Unlock()
			t.Logf("pipelines by node: %v; single commands: %d", counts.pipelines, counts.singles)
			if len(counts.pipelines) != s.masters || counts.singles != 0 {
				t.Errorf("round trips: pipelines by node %v and %d single commands, want one pipeline on each of %d masters", counts.pipelines, counts.singles, s.masters)
			}
			for addr, n := range counts.pipelines {
				if n != 1 {
					t.Errorf("%s: %d pipelines, want 1", addr, n)
				}
			}
		})
	}
}
