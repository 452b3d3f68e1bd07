// SPDX-License-Identifier: Apache-2.0

package idemtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Binary is the binary named by the environment variable envVar (to
// measure another build the same way), or the command of the package in
// the working directory, built into a temporary directory of tb without
// the race detector, which would inflate its memory.
func Binary(tb testing.TB, envVar, name string) string {
	tb.Helper()
	if bin := os.Getenv(envVar); bin != "" {
		return bin
	}
	bin := filepath.Join(tb.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		tb.Fatalf("idemtest: go build: %v\n%s", err, out)
	}
	return bin
}

// Memory is the resident set of process pid now and its peak (VmRSS and
// VmHWM of /proc/<pid>/status), in bytes.
func Memory(tb testing.TB, pid int) (rss, peak float64) {
	tb.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), ":")
		kB, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		switch {
		case err != nil:
		case name == "VmRSS":
			rss = kB * 1024
		case name == "VmHWM":
			peak = kB * 1024
		}
	}
	return rss, peak
}

// Dial dials addr over TCP, for Exchange.
func Dial(addr string) func() (net.Conn, error) {
	return func() (net.Conn, error) { return net.Dial("tcp", addr) }
}

// Exchange writes raw to a new connection from dial and reads one answer,
// and whether the connection was closed after it: for the requests an
// http.Client would not send.
func Exchange(tb testing.TB, dial func() (net.Conn, error), raw string) (*http.Response, []byte, bool) {
	tb.Helper()
	conn, err := dial()
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		tb.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		tb.Fatalf("idemtest: read the answer to %.40q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = br.ReadByte()
	// EOF, or a reset where the server closed with part of a request unread.
	var timeout net.Error
	return resp, body, err != nil && !(errors.As(err, &timeout) && timeout.Timeout())
}
