// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemsvc/idemsvc/internal/cowmap"
	"github.com/idemsvc/idemsvc/internal/quota"
)

// metrics are the service's Prometheus collectors.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	beginTime   *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	waiters     prometheus.Gauge
	waitPolls   prometheus.Counter
	begins      *prometheus.CounterVec

	seriesOf    cowmap.Map[seriesKey, *requestSeries]
	windows     cowmap.Map[string, *beginWindow] // by tenant
	windowsKept atomic.Int32
	seriesKept  atomic.Int32
	// windowed reports whether tenant may have a window: only the tenants
	// of the tenants file (or DefaultTenant without one), so that callers
	// cannot grow the windows by naming tenants.
	windowed func(tenant string) bool
	// tenantLabel is a tenant's label: bounded by quota.MaxTenantLabels,
	// the limiter's when there is one.
	tenantLabel func(tenant string) string
}

// maxSeriesKept bounds the series kept by series: without a tenants file,
// an admin may name any tenant, and each name adds to the begins' series.
const maxSeriesKept = 4096

// requestSeries are the series that requests of one route, outcome, status
// and tenant count in. They are looked up once and kept: WithLabelValues
// hashes and checks its label values on every call, about 3,600
// instructions per begin. Routes, outcomes and statuses are bounded by the
// code, tenants by the tenants file; past maxSeriesKept, series are looked
// up on every request again.
type requestSeries struct {
	requests  prometheus.Counter
	duration  prometheus.Observer
	beginTime prometheus.Observer // begins only
	begins    prometheus.Counter  // begins for a tenant only
}

type seriesKey struct {
	route, outcome, tenant string
	status                 int
}

// series returns the series of a request, made on its first use.
func (m *metrics) series(route, outcome string, status int, tenant string) *requestSeries {
	if route != beginRoute {
		tenant = "" // counted by tenant for begins only
	}
	key := seriesKey{route: route, outcome: outcome, tenant: tenant, status: status}
	if s, ok := m.seriesOf.Load(key); ok {
		return s
	}
	s := &requestSeries{
		requests: m.requests.WithLabelValues(route, outcome, strconv.Itoa(status)),
		duration: m.duration.WithLabelValues(route),
	}
	if route == beginRoute {
		s.beginTime = m.beginTime.WithLabelValues(outcome)
		if tenant != "" {
			s.begins = m.begins.WithLabelValues(m.tenantLabel(tenant), outcome)
		}
	}
	if m.seriesKept.Load() >= maxSeriesKept {
		return s
	}
	got, loaded := m.seriesOf.LoadOrStore(key, s)
	if !loaded {
		m.seriesKept.Add(1)
	}
	return got
}

// countBegin counts one begin of tenant, an item of a batch too, in its
// window, at the second it is counted.
func (m *metrics) countBegin(tenant string) {
	if w := m.window(tenant); w != nil {
		w.add(time.Now().Unix())
	}
}

// window returns tenant's begins of the last minute, made on first use;
// nil for a tenant not windowed, or past quota.MaxTenantLabels windows
// (a tenants file reloaded with new names).
func (m *metrics) window(tenant string) *beginWindow {
	if w, ok := m.windows.Load(tenant); ok {
		return w
	}
	if m.windowed == nil || !m.windowed(tenant) || m.windowsKept.Load() >= quota.MaxTenantLabels {
		return nil
	}
	w, loaded := m.windows.LoadOrStore(tenant, new(beginWindow))
	if !loaded {
		m.windowsKept.Add(1)
	}
	return w
}

// beginWindow counts one tenant's begins by second over the last minute,
// for GET /v1/usage: a ring of one-second buckets, each holding its
// Unix second and its count in one word, updated by a CAS loop. A bucket
// only moves forward in time: a begin counted late for a second its
// bucket has left behind is dropped, never counted in a newer second.
type beginWindow struct {
	// One more bucket than the window's seconds: the current second,
	// still counting, is not in the rate.
	buckets [windowSeconds + 1]atomic.Uint64
}

const windowSeconds = 60

// A bucket is second<<countBits | count.
const (
	countBits = 32
	countMask = 1<<countBits - 1
)

func (w *beginWindow) add(second int64) {
	b := &w.buckets[uint64(second)%uint64(len(w.buckets))]
	for {
		old := b.Load()
		var next uint64
		switch s := int64(old >> countBits); {
		case s == second:
			if old&countMask == countMask {
				return // saturated
			}
			next = old + 1
		case s < second:
			next = uint64(second)<<countBits | 1
		default:
			return // the bucket counts a later second
		}
		if b.CompareAndSwap(old, next) {
			return
		}
	}
}

// perSecond is the mean rate over the windowSeconds full seconds before
// now.
func (w *beginWindow) perSecond(now int64) float64 {
	var sum uint64
	for i := range w.buckets {
		v := w.buckets[i].Load()
		if s := int64(v >> countBits); s < now && s >= now-windowSeconds {
			sum += v & countMask
		}
	}
	return float64(sum) / windowSeconds
}

// newMetrics registers the collectors, and the Go runtime's and the
// process's, with reg. tenantLabel gives a tenant's label.
func newMetrics(reg prometheus.Registerer, tenantLabel func(string) string) *metrics {
	m := &metrics{
		tenantLabel: tenantLabel,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemsvc_http_requests_total",
			Help: "HTTP requests by route, outcome and status code.",
		}, []string{"route", "outcome", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemsvc_http_request_duration_seconds",
			Help:    "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route"}),
		beginTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemsvc_begin_duration_seconds",
			Help:    "Begin latency by outcome, so that waits and errors do not blur acquisitions and replays.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemsvc_store_errors_total",
			Help: "Requests that failed on the store, by route: unreachable or slow (store-unavailable) or unexpected (internal).",
		}, []string{"route", "kind"}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemsvc_waiters",
			Help: "Begins waiting (wait_ms) for an attempt in progress to finish.",
		}),
		waitPolls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemsvc_wait_polls_total",
			Help: "Status reads of waited keys: when a push of the attempt's end may have been missed, at the lease's end, and as a slow fallback; shared by every waiter of a key.",
		}),
		begins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemsvc_begins_total",
			Help: "Begins by tenant and outcome (acquired, replayed-completed, replayed-failed, or the problem kind: in-progress, rate-limited, quota-exceeded...).",
		}, []string{"tenant", "outcome"}),
	}
	reg.MustRegister(m.requests, m.duration, m.beginTime, m.storeErrors, m.waiters, m.waitPolls, m.begins)
	// The Go runtime's and the process's metrics keep their standard names
	// (go_goroutines, process_resident_memory_bytes...), which dashboards
	// and alerts for any Go service expect.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// admitting is a store that bounds its calls in flight, as
// redisstore.Store does.
type admitting interface {
	InFlight() int
	Queued() int
	Shed() uint64
}

// registerAdmission exports the calls a's admission lets through and
// refuses.
func registerAdmission(reg prometheus.Registerer, a admitting) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemsvc_store_calls_in_flight",
			Help: "Scripts running on Redis now; at IDEMSVC_REDIS_MAX_IN_FLIGHT, more calls wait or are refused.",
		}, func() float64 { return float64(a.InFlight()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemsvc_store_calls_queued",
			Help: "Calls waiting for one of the IDEMSVC_REDIS_MAX_IN_FLIGHT slots now.",
		}, func() float64 { return float64(a.Queued()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemsvc_store_overload_refusals_total",
			Help: "Begins, statuses and deletes refused with 503 (store-unavailable) because the queue for IDEMSVC_REDIS_MAX_IN_FLIGHT slots was standing (not empty for 100 ms, while it let through 8 times that many calls, or none); they did not take effect.",
		}, func() float64 { return float64(a.Shed()) }),
	)
}
