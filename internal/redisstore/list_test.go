// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// fill makes n records of tenant in the given shape and returns their keys.
func fill(t *testing.T, store sm.Store, tenant, prefix string, n int, finish func(key, token string) error) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if finish != nil {
			if err := finish(key, res.Lease.Token); err != nil {
				t.Fatal(err)
			}
		}
		keys[key] = true
	}
	return keys
}

// listAll follows a listing to its end and counts how often each key came.
func listAll(t *testing.T, store sm.Store, tenant string, req sm.ListRequest) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for pages := 0; ; pages++ {
		page, err := store.List(ctx, tenant, req)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(page.Records) > req.Limit && req.Limit > 0 {
			t.Fatalf("page %d has %d records, over the limit %d", pages, len(page.Records), req.Limit)
		}
		for _, r := range page.Records {
			if r.Tenant != tenant || r.State != req.State || !r.Response.IsZero() {
				t.Fatalf("listed %+v", r)
			}
			seen[r.Key]++
		}
		if page.NextCursor == "" {
			return seen
		}
		if pages > 10_000 {
			t.Fatal("the listing does not end")
		}
		req.Cursor = page.NextCursor
	}
}

// TestList: each state lists exactly the tenant's records in it, page by
// page, while other records of the tenant come and go, on every store
// (the Cluster's records spread over its three masters).
func TestList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		tenant, other := idemtest.Unique("t"), idemtest.Unique("t")
		completed := fill(t, store, tenant, "done", 230, func(key, token string) error {
			_, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: token, Response: sm.Response{Body: "paid"}})
			return err
		})
		inProgress := fill(t, store, tenant, "busy", 40, nil)
		failed := fill(t, store, tenant, "failed", 30, func(key, token string) error {
			_, err := store.Fail(ctx, tenant, sm.FailRequest{Key: key, Token: token, Error: "declined"})
			return err
		})
		fill(t, store, tenant, "released", 10, func(key, token string) error {
			_, err := store.Fail(ctx, tenant, sm.FailRequest{Key: key, Token: token, Retryable: true})
			return err
		})
		fill(t, store, other, "done", 20, func(key, token string) error {
			_, err := store.Complete(ctx, other, sm.CompleteRequest{Key: key, Token: token})
			return err
		})

		// Records of the tenant come and go while it is listed.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("churn-%d", i)
				if res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key}); err == nil {
					_, _ = store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token})
				}
				if i%2 == 0 {
					_ = store.Delete(ctx, tenant, key)
				}
			}
		})
		for _, tt := range []struct {
			state sm.State
			limit int
			want  map[string]bool
		}{
			{sm.StateCompleted, 0, completed},
			{sm.StateCompleted, 7, completed},
			{sm.StateInProgress, 1000, inProgress},
			{sm.StateFailed, 13, failed},
		} {
			seen := listAll(t, store, tenant, sm.ListRequest{State: tt.state, Limit: tt.limit})
			for key := range tt.want {
				if seen[key] == 0 {
					t.Errorf("%v, limit %d: %s not listed", tt.state, tt.limit, key)
				}
			}
			for key := range seen {
				// Churning keys are in progress, then completed, as they come and go.
				if !tt.want[key] && (tt.state == sm.StateFailed || !strings.HasPrefix(key, "churn-")) {
					t.Errorf("%v, limit %d: %s listed", tt.state, tt.limit, key)
				}
			}
		}
		close(stop)
		wg.Wait()

		if seen := listAll(t, store, tenant, sm.ListRequest{State: sm.StateCompleted, OlderThan: time.Hour}); len(seen) != 0 {
			t.Errorf("older than an hour: %d records listed", len(seen))
		}
		seen := listAll(t, store, tenant, sm.ListRequest{State: sm.StateInProgress})
		if len(seen) != len(inProgress) {
			t.Errorf("in progress, default limit: %d listed, want %d", len(seen), len(inProgress))
		}

		for _, req := range []sm.ListRequest{
			{State: 0},
			{State: sm.StateCompleted, Limit: 1001},
			{State: sm.StateCompleted, Limit: -1},
			{State: sm.StateCompleted, OlderThan: -time.Second},
			{State: sm.StateCompleted, Cursor: "not a cursor"},
			{State: sm.StateCompleted, Cursor: "eyJ4IjoxfQ"}, // {"x":1}
		} {
			var invalid *sm.InvalidError
			if _, err := store.List(ctx, tenant, req); !errors.As(err, &invalid) {
				t.Errorf("List(%+v) = %v, want an invalid request", req, err)
			}
		}
	})
}

// TestListCursorOutlivingItsNode: a cursor of a node that restarted since
// (its SCAN positions mean nothing on the new process) is refused, naming
// the cursor, rather than followed.
func TestListCursorOutlivingItsNode(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t)
	store := redisstore.New(redis.NewClient(&redis.Options{Addr: srv.Addr()}), redisstore.Options{})
	tenant := idemtest.Unique("t")
	fill(t, store, tenant, "busy", 30, nil)
	page, err := store.List(ctx, tenant, sm.ListRequest{State: sm.StateInProgress, Limit: 10})
	if err != nil || page.NextCursor == "" {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	srv.Restart(t)
	fill(t, store, tenant, "busy", 30, nil)
	_, err = store.List(ctx, tenant, sm.ListRequest{State: sm.StateInProgress, Limit: 10, Cursor: page.NextCursor})
	var invalid *sm.InvalidError
	if !errors.As(err, &invalid) || invalid.Field != "cursor" {
		t.Fatalf("next page after a restart: %v, want the cursor refused", err)
	}
}
