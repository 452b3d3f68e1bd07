// SPDX-License-Identifier: Apache-2.0

package millitime_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/clients/go/millitime"
)

// Instants go out as RFC 3339 in UTC with exactly three fractional digits,
// and come back equal.
func TestTime(t *testing.T) {
	zone := time.FixedZone("x", 3600)
	for in, want := range map[time.Time]string{
		time.Date(2026, 11, 21, 13, 0, 0, 0, zone):             `"2026-11-21T12:00:00.000Z"`,
		time.Date(2026, 11, 21, 12, 0, 0, 120e6, time.UTC):     `"2026-11-21T12:00:00.120Z"`,
		time.Date(2026, 11, 21, 12, 0, 0, 123456789, time.UTC): `"2026-11-21T12:00:00.123Z"`,
	} {
		m := millitime.New(in)
		got, err := json.Marshal(m)
		if err != nil || string(got) != want {
			t.Errorf("Marshal(%v) = %s, %v; want %s", in, got, err, want)
		}
		var back millitime.Time
		if err := json.Unmarshal(got, &back); err != nil || !back.Equal(m.Time) {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", got, back, err, m)
		}
	}
	var m millitime.Time
	for _, bad := range []string{`12`, `"yesterday"`, `"2026-11-21"`} {
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("Unmarshal(%s) accepted", bad)
		}
	}
}
