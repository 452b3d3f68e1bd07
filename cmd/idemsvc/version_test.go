// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// idemsvc --version prints one line with the version stamped at build time
// and exits 0.
func TestVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemsvc")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || strings.Count(string(out), "\n") != 1 || !strings.HasPrefix(string(out), "idemsvc v9.8.7 (") {
		t.Fatalf("idemsvc --version = %q, %v", out, err)
	}
}

// The Go runtime's and the process's metrics keep their standard names,
// and idemsvc_build_info says which build serves.
func TestMetricNames(t *testing.T) {
	in := start(t, nil, nil)
	metrics := get(t, in.url+"/metrics")
	for _, want := range []string{"\ngo_goroutines ", "\nprocess_resident_memory_bytes ", "\nidemsvc_build_info{goversion=\"go"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("no %q in /metrics", strings.TrimSpace(want))
		}
	}
	if strings.Contains(metrics, "idemsvc_go_") || strings.Contains(metrics, "idemsvc_process_") {
		t.Error("the runtime's metrics carry idemsvc's prefix")
	}
}

// idemsvc healthcheck exits 0 while an idemsvc listens where
// IDEMSVC_LISTEN says, and 1 when none does.
func TestHealthcheck(t *testing.T) {
	in := start(t, nil, nil)
	addr := strings.TrimPrefix(in.url, "http://")
	var out strings.Builder
	if code := healthcheck(nil, []string{"IDEMSVC_LISTEN=" + addr}, &out); code != 0 {
		t.Errorf("healthcheck of a serving idemsvc = %d: %s", code, out.String())
	}
	_, port, _ := net.SplitHostPort(addr)
	if code := healthcheck([]string{"--listen", ":" + port}, nil, &out); code != 0 {
		t.Errorf("healthcheck with --listen :%s = %d: %s", port, code, out.String())
	}
	in.stop()
	<-in.done
	in.done <- nil
	if code := healthcheck(nil, []string{"IDEMSVC_LISTEN=" + addr}, &out); code != 1 {
		t.Errorf("healthcheck with nothing listening = %d", code)
	}
}
