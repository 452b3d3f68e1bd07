// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The error counters exist at zero before the first error, so that an
// alert on their rate (and a dashboard panel) sees the first burst: store
// errors for every route and kind, limit rejections for every tenant of
// the file and every limit.
func TestE2EErrorCountersStartAtZero(t *testing.T) {
	t.Parallel()
	limiter := quota.NewMemory(quota.Options{})
	t.Cleanup(limiter.Close)
	e := start(t, handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()),
		Keyring: tenantsKeyring(t), Limiter: limiter})
	resp, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var want []string
	for _, route := range []string{"/v1/begin", "/v1/complete", "/v1/fail", "/v1/extend", "/v1/status", "/v1/keys", "/healthz", "/readyz", "/metrics"} {
		for _, kind := range []string{"internal", "store-unavailable"} {
			want = append(want, `idemsvc_store_errors_total{kind="`+kind+`",route="`+route+`"} 0`)
		}
	}
	for _, tenant := range []string{"billing", "ops", "payments"} {
		for _, limit := range []string{"begins_per_s", "stored_bytes", "waiters"} {
			want = append(want, `idemsvc_limit_rejections_total{limit="`+limit+`",tenant="`+tenant+`"} 0`)
		}
	}
	for _, series := range want {
		if !strings.Contains(string(body), "\n"+series+"\n") {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
