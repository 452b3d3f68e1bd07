// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/auth"
)

// tenantsPoll is how often the tenants file is read again without a change
// notice; the contract's bound for a change to take effect is 5 s.
var tenantsPoll = 4 * time.Second

// watchTenants keeps keyring in step with the tenants file at path, read
// again on SIGHUP and when it changes, and exports the outcomes. It returns
// a function that stops it and waits for it to end.
func watchTenants(ctx context.Context, path string, keyring *auth.Keyring, data []byte, registry *prometheus.Registry, log *slog.Logger) (stop func()) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemsvc_tenants_reloads_total",
		Help: "Readings of the tenants file after start, by result: reloaded, unchanged (SIGHUP, same content) or refused (unreadable or invalid; the tenants before stay in force).",
	}, []string{"result"})
	invalid := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemsvc_tenants_file_invalid",
		Help: "1 while the tenants file on disk is refused and the tenants read before stay in force.",
	})
	registry.MustRegister(reloads, invalid)
	for _, r := range []string{auth.Reloaded, auth.Unchanged, auth.Refused} {
		reloads.WithLabelValues(r)
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		auth.Watch(ctx, path, keyring, data, hup, auth.WatchOptions{Poll: tenantsPoll, Report: func(outcome string, err error) {
			reloads.WithLabelValues(outcome).Inc()
			switch outcome {
			case auth.Refused:
				invalid.Set(1)
				log.Error("tenants file refused; the tenants read before stay in force", "error", err.Error())
			case auth.Reloaded:
				invalid.Set(0)
				log.Info("tenants file reloaded", "path", path)
			default:
				invalid.Set(0)
				log.Info("tenants file read again: unchanged", "path", path)
			}
		}})
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
}
