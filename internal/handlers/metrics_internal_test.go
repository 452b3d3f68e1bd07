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

// The window's rate is the begins of the 60 full seconds before now,
// divided by 60: not the current second, not the 61st second back.
func TestBeginWindowRate(t *testing.T) {
	var w beginWindow
	const now = 1_700_000_000
	for s := int64(now - 61); s <= now; s++ {
		w.add(s)
		w.add(s)
	}
	if got := w.perSecond(now); got != 2 {
		t.Errorf("rate = %v, want 2 (120 begins in the 60 s before now)", got)
	}
}

// A begin counted late, for a second its bucket has left behind, is
// dropped: it neither moves the bucket back nor erases the newer count.
func TestBeginWindowNeverMovesBack(t *testing.T) {
	var w beginWindow
	const now = 1_700_000_000
	for range 5 {
		w.add(now - 1)
	}
	w.add(now - 1 - int64(len(w.buckets))) // the same bucket, a lap before
	if got := w.perSecond(now); got != 5.0/windowSeconds {
		t.Errorf("rate = %v, want 5 begins in the window", got)
	}
}

// Windows are kept only for the tenants windowed, and at most
// quota.MaxTenantLabels of them.
func TestBeginWindowsAreBounded(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), new(quota.TenantLabels).Of)
	m.windowed = func(tenant string) bool { return tenant != "stranger" }
	m.countBegin("stranger")
	if _, ok := m.windows.Load("stranger"); ok {
		t.Error("a window was made for a tenant not windowed")
	}
	for i := range quota.MaxTenantLabels + 10 {
		m.countBegin("t" + strconv.Itoa(i))
	}
	n := 0
	m.windows.Range(func(string, *beginWindow) bool { n++; return true })
	if n != quota.MaxTenantLabels {
		t.Errorf("%d windows, want %d", n, quota.MaxTenantLabels)
	}
}
