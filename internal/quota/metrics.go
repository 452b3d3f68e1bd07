// SPDX-License-Identifier: Apache-2.0

package quota

import "github.com/prometheus/client_golang/prometheus"

// metrics are the per-tenant collectors of the limits.
type metrics struct {
	rejections  *prometheus.CounterVec
	storedBytes *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemsvc_limit_rejections_total",
			Help: "Begins refused with 429, by tenant and by the limit they were over (begins_per_s, stored_bytes, waiters).",
		}, []string{"tenant", "limit"}),
		storedBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemsvc_stored_bytes",
			Help: "Response bytes the tenant's records hold within their retention (counted up to the end of the minute each expires in), as last read from the store.",
		}, []string{"tenant"}),
	}
	return m
}

// tenantMetrics are one tenant's collectors, looked up once.
type tenantMetrics struct {
	rejectedRate, rejectedBytes, rejectedWaiters prometheus.Counter
	storedBytes                                  prometheus.Gauge
}

func (m *metrics) forTenant(tenant string) tenantMetrics {
	return tenantMetrics{
		rejectedRate:    m.rejections.WithLabelValues(tenant, LimitRate),
		rejectedBytes:   m.rejections.WithLabelValues(tenant, LimitStoredBytes),
		rejectedWaiters: m.rejections.WithLabelValues(tenant, LimitWaiters),
		storedBytes:     m.storedBytes.WithLabelValues(tenant),
	}
}
