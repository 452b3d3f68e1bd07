// SPDX-License-Identifier: Apache-2.0

// Package buildinfo says which build of a command runs (idemsvc,
// idemproxy, idemctl): the version and revision stamped at build time, or
// what Go recorded. make build stamps both:
//
//	go build -ldflags "-X github.com/idemsvc/idemsvc/internal/buildinfo.Version=v0.1.0 \
//	  -X github.com/idemsvc/idemsvc/internal/buildinfo.Revision=$(git rev-parse HEAD)" ./cmd/idemsvc
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Version and Revision are stamped at build time. Without them, the
// module version Go recorded ("(devel)" in a work tree) and the VCS
// revision it recorded (none under go run, or with -buildvcs=false).
var (
	Version  = ""
	Revision = ""
)

// Get returns the version, the revision ("unknown" when neither is known)
// and the Go version the binary was built with.
func Get() (version, revision, goVersion string) {
	version, revision = Version, Revision
	if info, ok := debug.ReadBuildInfo(); ok {
		if version == "" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && revision == "" {
				revision = s.Value
			}
		}
	}
	if version == "" {
		version = "unknown"
	}
	if revision == "" {
		revision = "unknown"
	}
	return version, revision, runtime.Version()
}

// Line is what command --version prints: "idemsvc v0.1.0 (revision 1a2b…,
// go1.26.0)".
func Line(command string) string {
	version, revision, goVersion := Get()
	return command + " " + version + " (revision " + revision + ", " + goVersion + ")"
}

// IsVersionFlag reports whether args (without the program name) ask for
// the version alone: --version or -version.
func IsVersionFlag(args []string) bool {
	return len(args) == 1 && (args[0] == "--version" || args[0] == "-version")
}
