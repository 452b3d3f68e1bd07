// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/handlers"
)

// IDEMSVC_ACCESS_LOG (or --access-log) is all by default, errors or off;
// anything else is refused, naming the setting.
func TestAccessLogConfig(t *testing.T) {
	for env, want := range map[string]handlers.AccessLog{
		"": handlers.AccessLogAll, "IDEMSVC_ACCESS_LOG=all": handlers.AccessLogAll,
		"IDEMSVC_ACCESS_LOG=errors": handlers.AccessLogErrors, "IDEMSVC_ACCESS_LOG=off": handlers.AccessLogOff,
	} {
		if c, err := parseConfig(nil, []string{env}); err != nil || c.accessLog != want {
			t.Errorf("%q: access log %v, %v; want %v", env, c.accessLog, err, want)
		}
	}
	if _, err := parseConfig(nil, []string{"IDEMSVC_ACCESS_LOG=some"}); err == nil || !strings.Contains(err.Error(), "access-log") {
		t.Errorf("IDEMSVC_ACCESS_LOG=some: %v, want an error naming access-log", err)
	}
}
