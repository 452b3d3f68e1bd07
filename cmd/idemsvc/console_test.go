// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
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
