// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// listRSSBound is the bound on idemsvc's resident set while it
// lists records whose responses are large: listing reads heads only.
const listRSSBound = 60e6

// TestListingReadsNoResponse fills a Redis with 200 failed records, each
// with an owner and a fingerprint of 256 bytes, an error of 1 KiB (a head
// of about 1.9 KB, over the first read of a listing) and a response of
// 1 MiB, then lists them in one page on a fresh idemsvc and holds its peak
// resident set (VmHWM) under 60 MB: the 200 MiB of responses are never
// read. Before listing read a head past 512 bytes with GETRANGE, it read
// such records whole (220 MB).
func TestListingReadsNoResponse(t *testing.T) {
	bin := idemsvcBinary(t)
	const apiKey = "list-memory-key"
	tenants := idemtest.TenantsFile(t, idemtest.Tenant{Name: "lister", Key: apiKey})
	env := []string{"IDEMSVC_TENANTS_FILE=" + tenants, "IDEMSVC_REDIS_URL=redis://" + redistest.NewServer(t).Addr()}

	const records = 200
	filler := startBinary(t, bin, env)
	owner, fingerprint, errMsg := strings.Repeat("o", 256), strings.Repeat("f", 256), strings.Repeat("e", 1024)
	response := strings.Repeat("r", 1<<20-64)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range records {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			key := fmt.Sprintf("listed-%03d", i)
			status, out := post(t, "http://"+filler.addr+"/v1/begin", apiKey,
				fmt.Sprintf(`{"key":%q,"owner":%q,"fingerprint":%q}`, key, owner, fingerprint))
			if status != http.StatusCreated {
				t.Errorf("begin %s: %d %v", key, status, out)
				return
			}
			status, out = post(t, "http://"+filler.addr+"/v1/fail", apiKey,
				fmt.Sprintf(`{"key":%q,"lease_token":%q,"retryable":false,"error":%q,"response":{"status_code":500,"body":%q}}`,
					key, out["lease_token"], errMsg, response))
			if status != http.StatusOK {
				t.Errorf("fail %s: %d %v", key, status, out)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// A timeout long enough for a build that reads the responses to answer
	// too, so that its memory is measured rather than its 503.
	p := startBinary(t, bin, append(env, "IDEMSVC_REDIS_TIMEOUT_MS=30000"))
	req, err := http.NewRequest(http.MethodGet, "http://"+p.addr+"/v1/keys?state=failed&limit=1000", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("list: %d %v %.200s", resp.StatusCode, err, body)
	}
	var page struct {
		Items []struct {
			Key, Owner, Fingerprint, Error string
		} `json:"items"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != records || page.NextCursor != nil {
		t.Fatalf("listed %d records (next cursor %v), want all %d in one page", len(page.Items), page.NextCursor, records)
	}
	for _, it := range page.Items {
		if it.Owner != owner || it.Fingerprint != fingerprint || it.Error != errMsg {
			t.Fatalf("record %s listed without its whole head: owner %d B, fingerprint %d B, error %d B",
				it.Key, len(it.Owner), len(it.Fingerprint), len(it.Error))
		}
	}
	rss, peak := p.memory(t)
	t.Logf("listing %d records of 1 MiB with heads of about 1.9 KB: VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB)",
		records, rss/1e6, peak/1e6, p.startRSS/1e6)
	if peak > listRSSBound {
		t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, listRSSBound/1e6)
	}
}
