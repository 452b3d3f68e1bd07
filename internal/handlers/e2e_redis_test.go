// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"net/http"
	"testing"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// Every endpoint, through a real server, on one Redis node and on a Redis
// Cluster: begin (acquire, in progress, replay), extend, complete, fail
// (retryable and terminal), status, listing and delete. The other HTTP
// tests run on the memory store.
func TestE2EEveryEndpointOnRedis(t *testing.T) {
	t.Parallel()
	for _, b := range idemtest.Backends()[1:] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := startOn(t, b.Open(t)).as(t, "")

			paid := idemtest.Unique("paid")
			l := c.acquire(idem.BeginRequest{Key: paid, Owner: ptr("worker-1")})
			if r := c.begin(idem.BeginRequest{Key: paid, Owner: ptr("worker-2")}); r.StatusCode() != http.StatusConflict {
				t.Errorf("begin in progress: %d %s", r.StatusCode(), r.Body)
			}
			if r := c.extend(idem.ExtendRequest{Key: paid, LeaseToken: l.LeaseToken, LeaseMs: ptr[int64](60000)}); r.StatusCode() != http.StatusOK {
				t.Errorf("extend: %d %s", r.StatusCode(), r.Body)
			}
			c.mustComplete(idem.CompleteRequest{Key: paid, LeaseToken: l.LeaseToken,
				Response: &idem.StoredResponse{StatusCode: ptr(201), Body: ptr("paid")}})
			if r := c.begin(idem.BeginRequest{Key: paid}); r.StatusCode() != http.StatusOK || *r.JSON200.Response.Body != "paid" {
				t.Errorf("replay: %d %s", r.StatusCode(), r.Body)
			}
			if rec := c.record(paid); rec.State != idem.StateCompleted || *rec.Response.Body != "paid" {
				t.Errorf("status: %+v", rec)
			}

			retried := idemtest.Unique("retried")
			l = c.acquire(idem.BeginRequest{Key: retried})
			c.mustFail(idem.FailRequest{Key: retried, LeaseToken: l.LeaseToken, Retryable: ptr(true)})
			l = c.acquire(idem.BeginRequest{Key: retried}) // released: acquired again
			c.mustFail(idem.FailRequest{Key: retried, LeaseToken: l.LeaseToken, Retryable: ptr(false), Error: ptr("declined")})
			if r := c.begin(idem.BeginRequest{Key: retried}); r.StatusCode() != http.StatusOK || r.JSON200.Status != idem.FinishedStateFailed {
				t.Errorf("replay of a terminal failure: %d %s", r.StatusCode(), r.Body)
			}

			r, err := c.c.ListKeysWithResponse(bg, &idem.ListKeysParams{State: idem.StateCompleted, Limit: ptr[int32](1000)})
			c.check(err)
			found := false
			for page := r.JSON200; page != nil && !found; {
				for _, item := range page.Items {
					found = found || item.Key == paid
				}
				if page.NextCursor == nil {
					break
				}
				r, err = c.c.ListKeysWithResponse(bg, &idem.ListKeysParams{State: idem.StateCompleted, Limit: ptr[int32](1000), Cursor: page.NextCursor})
				c.check(err)
				page = r.JSON200
			}
			if !found {
				t.Errorf("listing completed records: %s is not listed", paid)
			}

			if r := c.del(idem.DeleteKeyParams{Key: paid}); r.StatusCode() != http.StatusNoContent {
				t.Errorf("delete: %d %s", r.StatusCode(), r.Body)
			}
			c.requireAbsent(paid)
		})
	}
}
