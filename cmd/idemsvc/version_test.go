// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make build stamps the version and revision into the three commands:
// each prints them with --version, one line, exit status 0, and idemsvc
// and idemproxy log them in their first line at start.
func TestVersion(t *testing.T) {
	bin := t.TempDir()
	make := exec.Command("make", "-C", "../..", "build", "BIN="+bin, "VERSION=v9.8.7", "REVISION=0123abc")
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, command := range []string{"idemsvc", "idemproxy", "idemctl"} {
		out, err := exec.Command(filepath.Join(bin, command), "--version").Output()
		if want := command + " v9.8.7 (revision 0123abc, go"; err != nil || strings.Count(string(out), "\n") != 1 || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version = %q, %v; want %q...", command, out, err, want)
		}
	}
	for command, env := range map[string][]string{
		"idemsvc":   {"IDEMSVC_LISTEN=127.0.0.1:0"},
		"idemproxy": {"IDEMPROXY_LISTEN=127.0.0.1:0", "IDEMPROXY_UPSTREAM=http://127.0.0.1:9"},
	} {
		cmd := exec.Command(filepath.Join(bin, command))
		cmd.Env = env
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		first, _ := bufio.NewReader(stderr).ReadString('\n')
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		var line struct{ Msg, Version, Revision, Goversion string }
		if json.Unmarshal([]byte(first), &line) != nil || line.Msg != command+" starting" ||
			line.Version != "v9.8.7" || line.Revision != "0123abc" || !strings.HasPrefix(line.Goversion, "go") {
			t.Errorf("%s's first log line: %q; want its version, revision and Go version", command, first)
		}
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
