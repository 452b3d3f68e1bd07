// SPDX-License-Identifier: Apache-2.0

package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/buildinfo"
)

// registerBuildInfo exports idemsvc_build_info{version,revision,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer) {
	ver, revision, goVersion := buildinfo.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idemsvc_build_info",
		Help:        "Always 1; its labels say which build of idemsvc serves.",
		ConstLabels: prometheus.Labels{"version": ver, "revision": revision, "goversion": goVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}
