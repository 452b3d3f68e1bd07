// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestOverloadIsRefusedFast hangs Redis while idemsvc has as many calls in
// flight as it allows (4 completes), then storms it with begins, each on a
// connection of its own: every begin is refused at once with 503
// store-unavailable and Retry-After, long before the store's timeout,
// while completes wait for their turn and all succeed once Redis answers
// again.
func TestOverloadIsRefusedFast(t *testing.T) {
	const (
		inFlight = 4
		timeout  = 5 * time.Second
		storm    = 100
		// bound is generous: a refused begin waits DefaultShedWait (20ms)
		// for a slot; one that was not refused would wait out the timeout.
		bound = time.Second
	)
	srv := redistest.NewServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: inFlight + 4})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redisstore.Options{MaxInFlight: inFlight, Timeout: timeout})
	svc := idemtest.Serve(t, handlers.Config{Store: store})

	post := func(hc *http.Client, path string, body any) (*http.Response, []byte) {
		t.Helper()
		data, _ := json.Marshal(body)
		resp, err := hc.Post(svc.URL+path, "application/json", bytes.NewReader(data))
		if err != nil {
			t.Errorf("POST %s: %v", path, err)
			return nil, nil
		}
		defer resp.Body.Close()
		reply, _ := io.ReadAll(resp.Body)
		return resp, reply
	}
	// Six attempts in progress: four completes will fill the slots, two
	// more will wait for them.
	tokens := make([]string, inFlight+2)
	for i := range tokens {
		resp, reply := post(http.DefaultClient, "/v1/begin", map[string]string{"key": fmt.Sprint("c", i)})
		var lease struct {
			LeaseToken string `json:"lease_token"`
		}
		if resp == nil || resp.StatusCode != http.StatusCreated || json.Unmarshal(reply, &lease) != nil {
			t.Fatalf("begin c%d: %v %s", i, resp, reply)
		}
		tokens[i] = lease.LeaseToken
	}

	resume := srv.Pause(t)
	completes := make([]int, len(tokens))
	var done sync.WaitGroup
	complete := func(i int) {
		done.Go(func() {
			resp, reply := post(http.DefaultClient, "/v1/complete", map[string]any{"key": fmt.Sprint("c", i),
				"lease_token": tokens[i], "response": map[string]any{"status_code": 201}})
			if resp != nil {
				completes[i] = resp.StatusCode
				if resp.StatusCode != http.StatusOK {
					t.Errorf("complete c%d: %d %s", i, resp.StatusCode, reply)
				}
			}
		})
	}
	for i := range inFlight {
		complete(i)
	}
	idemtest.Eventually(t, 5*time.Second, "the completes in flight", func() bool { return store.InFlight() == inFlight })
	complete(inFlight)
	complete(inFlight + 1)

	type answer struct {
		status     int
		kind       string
		retryAfter string
		took       time.Duration
	}
	answers := make([]answer, storm)
	var stormed sync.WaitGroup
	for i := range storm {
		stormed.Go(func() {
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // a connection per request
			start := time.Now()
			resp, reply := post(hc, "/v1/begin", map[string]string{"key": fmt.Sprint("storm", i)})
			if resp == nil {
				return
			}
			var p struct{ Type string }
			_ = json.Unmarshal(reply, &p)
			answers[i] = answer{resp.StatusCode, p.Type, resp.Header.Get("Retry-After"), time.Since(start)}
		})
	}
	stormed.Wait()
	resume()
	done.Wait()

	for i, a := range answers {
		if a.status != http.StatusServiceUnavailable || a.kind != "https://idemsvc.dev/problems/store-unavailable" ||
			a.retryAfter == "" || a.took > bound {
			t.Errorf("begin %d in the storm: %d %s, Retry-After %q, after %v; want 503 store-unavailable with Retry-After within %v",
				i, a.status, a.kind, a.retryAfter, a.took, bound)
		}
	}
	if got := idemtest.Metric(t, svc.URL, "idemsvc_store_overload_refusals_total", ""); got != storm {
		t.Errorf("idemsvc_store_overload_refusals_total = %v, want %d", got, storm)
	}
	for i, status := range completes {
		if status != http.StatusOK {
			t.Errorf("complete c%d: %d, want 200", i, status)
		}
	}
}
