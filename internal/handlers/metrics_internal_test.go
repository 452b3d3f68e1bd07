// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/quota"
)

// The series kept for requests stay bounded however many tenants are
// named, and every request is counted past the bound too.
func TestSeriesKeptAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, new(quota.TenantLabels).Of)
	for i := range maxSeriesKept + 100 {
		s := m.series(beginRoute, "acquired", 201, "t"+strconv.Itoa(i))
		s.begins.Inc()
		s.requests.Inc()
	}
	if n := m.seriesKept.Load(); n != maxSeriesKept {
		t.Errorf("%d series kept, want %d", n, maxSeriesKept)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			sums[f.GetName()] += metric.GetCounter().GetValue()
		}
		if f.GetName() == "idemsvc_begins_total" && len(f.GetMetric()) != quota.MaxTenantLabels+1 {
			t.Errorf("idemsvc_begins_total has %d series, want %d tenants and %q", len(f.GetMetric()), quota.MaxTenantLabels, quota.OtherTenant)
		}
	}
	for _, name := range []string{"idemsvc_begins_total", "idemsvc_http_requests_total"} {
		if sums[name] != maxSeriesKept+100 {
			t.Errorf("%s sums to %v, want %d", name, sums[name], maxSeriesKept+100)
		}
	}
}
