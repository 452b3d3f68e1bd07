// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"strings"
	"testing"
)

func TestParseLimits(t *testing.T) {
	d := func(k string) string { return `["` + Digest(k) + `"]` }
	file := `
defaults:
  limits: {begins_per_s: 1000, burst: 2000, stored_bytes: 1073741824, waiters: 1000, in_progress: 500}
tenants:
  - name: payments
    api_key_sha256: ` + d("p") + `
    limits: {begins_per_s: 5000, burst: 10000, stored_bytes: 10737418240, read_bytes_per_s: 67108864}
  - name: ops
    admin: true
    api_key_sha256: ` + d("o") + `
  - name: steady
    api_key_sha256: ` + d("s") + `
    limits: {begins_per_s: 7}
`
	k, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		tenant string
		want   Quota
	}{
		{"payments", Quota{BeginsPerS: 5000, Burst: 10000, StoredBytes: 10737418240, ReadBytesPerS: 64 << 20}}, // its own replace the defaults
		{"ops", Quota{BeginsPerS: 1000, Burst: 2000, StoredBytes: 1 << 30, Waiters: 1000, InProgress: 500}},
		{"unlisted", Quota{BeginsPerS: 1000, Burst: 2000, StoredBytes: 1 << 30, Waiters: 1000, InProgress: 500}},
		{"steady", Quota{BeginsPerS: 7, Burst: 7}}, // a burst of one second's worth
	} {
		if got := k.Quota(tt.tenant); got != tt.want {
			t.Errorf("Limits(%q) = %+v, want %+v", tt.tenant, got, tt.want)
		}
	}

	k, err = Parse([]byte("tenants:\n  - name: a\n    api_key_sha256: " + d("a")))
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Quota("a"); !got.IsZero() {
		t.Errorf("without limits: %+v, want unlimited", got)
	}
	if got := (*Keyring)(nil).Quota("a"); !got.IsZero() {
		t.Errorf("nil keyring: %+v, want unlimited", got)
	}
}

func TestParseLimitsRefuses(t *testing.T) {
	tenant := "tenants:\n  - name: a\n    api_key_sha256: [\"" + Digest("k") + "\"]\n"
	for name, tt := range map[string]struct{ file, says string }{
		"unknown limit":       {tenant + "    limits: {begins_per_sec: 5}", "begins_per_sec"},
		"zero rate":           {tenant + "    limits: {begins_per_s: 0}", "begins_per_s must be a whole number from 1"},
		"negative bytes":      {tenant + "    limits: {stored_bytes: -1}", "stored_bytes must be a whole number from 1"},
		"zero waiters":        {tenant + "    limits: {waiters: 0}", "waiters must be a whole number from 1"},
		"zero in_progress":    {tenant + "    limits: {in_progress: 0}", "in_progress must be a whole number from 1"},
		"fractional reads":    {tenant + "    limits: {read_bytes_per_s: 1.5}", "read_bytes_per_s must be a whole number from 1"},
		"huge rate":           {tenant + "    limits: {begins_per_s: 100000000}", "begins_per_s must be a whole number from 1"},
		"burst without rate":  {tenant + "    limits: {burst: 5}", "burst needs begins_per_s"},
		"not a number":        {tenant + "    limits: {waiters: many}", "many"},
		"fraction":            {tenant + "    limits: {begins_per_s: 1.5}", "begins_per_s"},
		"bad defaults":        {"defaults:\n  limits: {waiters: 0}\n" + tenant, "defaults"},
		"unknown in defaults": {"defaults:\n  limit: {waiters: 1}\n" + tenant, "limit"},
	} {
		_, err := Parse([]byte(tt.file))
		if err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: err = %v, want one saying %q", name, err, tt.says)
		}
	}
}
