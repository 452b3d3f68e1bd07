// SPDX-License-Identifier: Apache-2.0

package main

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is the release, stamped at build time:
//
//	go build -ldflags "-X main.version=v0.1.0" ./cmd/idemsvc
//
// Without it, the module version Go recorded ("(devel)" in a work tree).
var version = ""

// buildInfo returns the version, the VCS revision Go recorded (or
// "unknown") and the Go version the binary was built with.
func buildInfo() (ver, revision, goVersion string) {
	ver, revision = version, "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		if ver == "" {
			ver = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	if ver == "" {
		ver = "unknown"
	}
	return ver, revision, runtime.Version()
}

// versionLine is what idemsvc --version prints.
func versionLine() string {
	ver, revision, goVersion := buildInfo()
	return "idemsvc " + ver + " (revision " + revision + ", " + goVersion + ")"
}

// registerBuildInfo exports idemsvc_build_info{version,revision,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer) {
	ver, revision, goVersion := buildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idemsvc_build_info",
		Help:        "Always 1; its labels say which build of idemsvc serves.",
		ConstLabels: prometheus.Labels{"version": ver, "revision": revision, "goversion": goVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}
