// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// startAPI serves an in-process idemsvc and, in front of it, the payment
// API, both on real loopback ports, and returns the API's URL and ledger.
func startAPI(t *testing.T) (string, *ledger) {
	t.Helper()
	idemsvc := idemtest.Serve(t, handlers.Config{})

	client, err := idem.New(idemsvc.URL)
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger()
	api := httptest.NewServer(newServer(client, l))
	t.Cleanup(api.Close)
	return api.URL, l
}

// reply is one answer of the API.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, key, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/charges", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return reply{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, req)
}

func get(t *testing.T, url string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

// do sends req; it reports errors with t.Error, so that it may run in
// other goroutines.
func do(t *testing.T, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func TestRetriedChargeIsCreatedOnce(t *testing.T) {
	url, l := startAPI(t)
	const body = `{"amount":1000,"currency":"eur","description":"order 42"}`

	first := post(t, url, "order-42", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST: %d %s", first.status, first.body)
	}
	if got := first.header.Get(idem.ReplayedHeader); got != "" {
		t.Errorf("first POST has %s: %q", idem.ReplayedHeader, got)
	}
	var charge Charge
	if err := json.Unmarshal(first.body, &charge); err != nil || !strings.HasPrefix(charge.ID, "ch_") ||
		charge.Amount != 1000 || charge.Currency != "eur" {
		t.Fatalf("first POST body %s (%v)", first.body, err)
	}

	// The client did not get the answer, say, and retries.
	for range 3 {
		retry := post(t, url, "order-42", body)
		if retry.status != http.StatusCreated {
			t.Fatalf("retried POST: %d %s", retry.status, retry.body)
		}
		if !bytes.Equal(retry.body, first.body) {
			t.Errorf("retried POST body\n%s\nwant the first one\n%s", retry.body, first.body)
		}
		if got := retry.header.Get(idem.ReplayedHeader); got != "true" {
			t.Errorf("retried POST: %s = %q, want true", idem.ReplayedHeader, got)
		}
		for _, h := range []string{"Content-Type", "Location"} {
			if retry.header.Get(h) != first.header.Get(h) {
				t.Errorf("retried POST: %s = %q, want %q", h, retry.header.Get(h), first.header.Get(h))
			}
		}
	}
	charges := l.list()
	if len(charges) != 1 || charges[0].ID != charge.ID {
		t.Fatalf("ledger holds %+v, want the one charge %s", charges, charge.ID)
	}

	// The charge is there to read; reads need no key.
	if r := get(t, url+"/charges/"+charge.ID); r.status != http.StatusOK || !bytes.Equal(r.body, first.body) {
		t.Errorf("GET the charge: %d %s", r.status, r.body)
	}

	// Another key is another charge.
	other := post(t, url, "order-43", body)
	if other.status != http.StatusCreated || other.header.Get(idem.ReplayedHeader) != "" || bytes.Equal(other.body, first.body) {
		t.Errorf("POST with another key: %d %s %v", other.status, other.body, other.header)
	}
	if n := len(l.list()); n != 2 {
		t.Errorf("%d charges after a second key, want 2", n)
	}
}

func TestKeyReusedOrMissing(t *testing.T) {
	url, l := startAPI(t)
	if r := post(t, url, "order-44", `{"amount":1000,"currency":"eur"}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	// The same key for another charge is refused, and charges nothing.
	if r := post(t, url, "order-44", `{"amount":99999,"currency":"eur"}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("key reused for another body: %d %s, want 422", r.status, r.body)
	}
	// A POST without a key is refused: it could not be retried safely.
	if r := post(t, url, "", `{"amount":1000,"currency":"eur"}`); r.status != http.StatusBadRequest {
		t.Errorf("POST without a key: %d %s, want 400", r.status, r.body)
	}
	// A bad request is answered by the handler, and replayed like any other
	// answer below 500.
	bad := post(t, url, "order-45", `{"amount":-1,"currency":"eur"}`)
	again := post(t, url, "order-45", `{"amount":-1,"currency":"eur"}`)
	if bad.status != http.StatusBadRequest || again.status != http.StatusBadRequest ||
		again.header.Get(idem.ReplayedHeader) != "true" || !bytes.Equal(bad.body, again.body) {
		t.Errorf("bad charge: %d %s, then %d %s %v", bad.status, bad.body, again.status, again.body, again.header)
	}
	if n := len(l.list()); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

func TestConcurrentDuplicatesCreateOneCharge(t *testing.T) {
	url, l := startAPI(t)
	const n = 12
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = post(t, url, "order-46", `{"amount":2500,"currency":"usd"}`) })
	}
	wg.Wait()

	charges := l.list()
	if len(charges) != 1 {
		t.Fatalf("%d concurrent duplicates created %d charges, want 1", n, len(charges))
	}
	fresh := 0
	for i, r := range replies {
		if r.status != http.StatusCreated || !bytes.Equal(r.body, replies[0].body) {
			t.Errorf("reply %d: %d %s, want 201 with the one charge %s", i, r.status, r.body, replies[0].body)
		}
		if r.header.Get(idem.ReplayedHeader) != "true" {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d replies not replayed, want exactly 1", fresh)
	}
	var c Charge
	if err := json.Unmarshal(replies[0].body, &c); err != nil || c.ID != charges[0].ID {
		t.Errorf("replies carry %s, the ledger %s (%v)", replies[0].body, charges[0].ID, err)
	}
}
