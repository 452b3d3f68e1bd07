// SPDX-License-Identifier: Apache-2.0

package millitime_test

import (
	"encoding/json"
	"math/rand/v2"
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

// AppendJSON writes what the layout "2006-01-02T15:04:05.000Z" gives, in
// UTC, for instants from year 1 to 9999 and every millisecond digit.
func TestAppendJSONMatchesTheLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zone := time.FixedZone("x", -5*3600-30*60)
	span := time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC).Unix() - time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC).Unix()
	for i := range 100_000 {
		in := time.Unix(time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC).Unix()+rng.Int64N(span), rng.Int64N(1e9))
		if i%2 == 0 {
			in = in.In(zone)
		}
		want := `"` + in.UTC().Format("2006-01-02T15:04:05.000Z") + `"`
		if got := string(millitime.Time{Time: in}.AppendJSON(nil)); got != want {
			t.Fatalf("AppendJSON(%v) = %s, want %s", in, got, want)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	t := millitime.New(time.Now())
	buf := make([]byte, 0, 32)
	b.Run("millitime", func(b *testing.B) {
		for b.Loop() {
			buf = t.AppendJSON(buf[:0])
		}
	})
	b.Run("layout", func(b *testing.B) { // the general formatter, the baseline
		for b.Loop() {
			buf = t.UTC().AppendFormat(buf[:0], "2006-01-02T15:04:05.000Z")
		}
	})
}
