// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// The console is on by default; IDEMSVC_CONSOLE=off (or --console off)
// turns it off, and another value is refused.
func TestConsoleConfig(t *testing.T) {
	if c, err := parseConfig(nil, nil); err != nil || !c.console {
		t.Errorf("default: console %v, %v", c.console, err)
	}
	if c, err := parseConfig(nil, []string{"IDEMSVC_CONSOLE=off"}); err != nil || c.console {
		t.Errorf("IDEMSVC_CONSOLE=off: console %v, %v", c.console, err)
	}
	if c, err := parseConfig([]string{"--console", "on"}, []string{"IDEMSVC_CONSOLE=off"}); err != nil || !c.console {
		t.Errorf("--console on over the variable: console %v, %v", c.console, err)
	}
	if _, err := parseConfig(nil, []string{"IDEMSVC_CONSOLE=maybe"}); err == nil || !strings.Contains(err.Error(), "console") {
		t.Errorf("IDEMSVC_CONSOLE=maybe: %v, want an error naming console", err)
	}
}

// The binary serves the console on the memory store, with its headers,
// and not with IDEMSVC_CONSOLE=off; the API is served either way.
func TestConsoleServed(t *testing.T) {
	bin := idemtest.Binary(t, "IDEMSVC_TEST_BINARY", "idemsvc")
	for _, on := range []bool{true, false} {
		env := []string{}
		if !on {
			env = append(env, "IDEMSVC_CONSOLE=off")
		}
		p := startBinary(t, bin, env)
		resp, err := http.Get("http://" + p.addr + "/console/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if on {
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "idemsvc console") ||
				!strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
				t.Errorf("console on: %d %v", resp.StatusCode, resp.Header)
			}
		} else if resp.StatusCode != http.StatusNotFound {
			t.Errorf("IDEMSVC_CONSOLE=off: /console/ answered %d, want 404", resp.StatusCode)
		}
		resp, err = http.Get("http://" + p.addr + "/v1/usage")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("console %v: /v1/usage answered %d", on, resp.StatusCode)
		}
	}
}
