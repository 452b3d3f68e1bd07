// SPDX-License-Identifier: Apache-2.0

package quota

import "github.com/prometheus/client_golang/prometheus"

// metrics are the per-tenant collectors of the limits.
type metrics struct {
	rejections  *prometheus.CounterVec
	storedBytes *prometheus.GaugeVec
	labels      TenantLabels
}

func newMetrics() *metrics {
	m := &metrics{
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemsvc_limit_rejections_total",
			Help: "Begins refused with 429, by tenant and by the limit they were over (begins_per_s, stored_bytes, waiters, in_progress), or reads refused for read_bytes_per_s or for the tenant's large answers in flight on this instance (reads_in_flight, IDEMSVC_READS_IN_FLIGHT).",
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
	rejectedRate, rejectedBytes, rejectedWaiters, rejectedInProgress, rejectedReads, rejectedReadsInFlight prometheus.Counter
	storedBytes                                                                                            prometheus.Gauge
}

func (m *metrics) forTenant(tenant string) tenantMetrics {
	label := m.labels.Of(tenant)
	t := tenantMetrics{
		rejectedRate:          m.rejections.WithLabelValues(label, LimitRate),
		rejectedBytes:         m.rejections.WithLabelValues(label, LimitStoredBytes),
		rejectedWaiters:       m.rejections.WithLabelValues(label, LimitWaiters),
		rejectedInProgress:    m.rejections.WithLabelValues(label, LimitInProgress),
		rejectedReads:         m.rejections.WithLabelValues(label, LimitReadBytes),
		rejectedReadsInFlight: m.rejections.WithLabelValues(label, LimitReadsInFlight),
	}
	if label != OtherTenant { // a gauge of several tenants would be any one's
		t.storedBytes = m.storedBytes.WithLabelValues(label)
	}
	return t
}
