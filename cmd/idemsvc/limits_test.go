// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// The tenants file's limits reach the running service, on the memory
// store and on Redis: a begin over the rate is refused with 429.
func TestTenantLimitsWired(t *testing.T) {
	for name, env := range map[string]func(t *testing.T) []string{
		"memory": func(*testing.T) []string { return nil },
		"standalone": func(t *testing.T) []string {
			return []string{"IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(t).Addr()}
		},
	} {
		t.Run(name, func(t *testing.T) {
			tenant := fmt.Sprintf("limited-%d", time.Now().UnixNano())
			tenants := idemtest.WriteTenantsFile(t, idemtest.TenantsYAMLWithDefaults("{begins_per_s: 1, burst: 2}",
				idemtest.Tenant{Name: tenant, Key: "s3cret-key"}))
			in := start(t, []string{"--tenants-file", tenants}, env(t))
			codes := make([]int, 3)
			for i := range codes {
				codes[i], _ = post(t, in.url+"/v1/begin", "s3cret-key", fmt.Sprintf(`{"key":"k%d"}`, i))
			}
			if codes[0] != http.StatusCreated || codes[1] != http.StatusCreated || codes[2] != http.StatusTooManyRequests {
				t.Errorf("three begins at once with a burst of 2 = %v, want 201, 201, 429", codes)
			}
			resp, err := http.Get(in.url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			want := `idemsvc_limit_rejections_total{limit="begins_per_s",tenant="` + tenant + `"} 1`
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		})
	}
}
