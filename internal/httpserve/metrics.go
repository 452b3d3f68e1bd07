// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// edgeMetrics count what happens at the edge, before any handler.
type edgeMetrics struct {
	handshakeFailures prometheus.Counter
	refused           prometheus.Counter
}

func newEdgeMetrics(reg prometheus.Registerer, prefix string) *edgeMetrics {
	m := &edgeMetrics{
		handshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "_tls_handshake_failures_total",
			Help: "TLS handshakes that failed (a plain-HTTP request to the HTTPS port is not counted: it gets its answer).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "_connections_refused_total",
			Help: "Connections refused at once because the connection cap was reached and no connection was idle.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.handshakeFailures, m.refused)
	}
	return m
}

// handshakeLogEvery is how often at most a failed TLS handshake is
// logged; those in between are counted, and the next line says how many.
const handshakeLogEvery = 10 * time.Second

// handshakeLog logs failed TLS handshakes, at most one line per
// handshakeLogEvery, so that a client failing a thousand handshakes a
// second cannot flood the log; every failure is counted in the metric.
type handshakeLog struct {
	log     *slog.Logger
	count   prometheus.Counter
	every   time.Duration
	mu      sync.Mutex
	last    time.Time
	dropped int
}

func newHandshakeLog(log *slog.Logger, count prometheus.Counter) *handshakeLog {
	return &handshakeLog{log: log, count: count, every: handshakeLogEvery}
}

func (h *handshakeLog) failed(client string, err error) {
	h.count.Inc()
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < h.every {
		h.dropped++
		h.mu.Unlock()
		return
	}
	dropped := h.dropped
	h.last, h.dropped = now, 0
	h.mu.Unlock()
	h.log.Warn("TLS handshake failed", "client", client, "error", err.Error(), "suppressed", dropped)
}
