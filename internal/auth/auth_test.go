// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAndLookup(t *testing.T) {
	file := `
tenants:
  - name: payments
    api_key_sha256: ["` + Digest("pay-old") + `", "` + Digest("pay-new") + `"]
  - name: ops
    admin: true
    api_key_sha256: ["` + strings.ToUpper(Digest("ops-key")) + `"]
`
	k, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		key  string
		want Principal
		ok   bool
	}{
		{"pay-old", Principal{Tenant: "payments"}, true},
		{"pay-new", Principal{Tenant: "payments"}, true}, // rotation: both keys work
		{"ops-key", Principal{Tenant: "ops", Admin: true}, true},
		{"pay-ol", Principal{}, false},
		{"", Principal{}, false},
		{Digest("pay-old"), Principal{}, false}, // the digest is not a key
	} {
		got, ok := k.Lookup(tt.key)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseJSON(t *testing.T) {
	k, err := Parse([]byte(`{"tenants":[{"name":"a_b-1","api_key_sha256":["` + Digest("k") + `"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := k.Lookup("k"); !ok || p.Tenant != "a_b-1" {
		t.Errorf("Lookup = %+v, %v", p, ok)
	}
}

func TestParseRefuses(t *testing.T) {
	d := Digest("k")
	for name, file := range map[string]string{
		"empty":           ``,
		"no tenants":      `tenants: []`,
		"unknown field":   "tenants:\n  - name: a\n    api_keys: [\"" + d + "\"]",
		"typo at the top": "tenant:\n  - name: a",
		"bad name":        "tenants:\n  - name: Payments\n    api_key_sha256: [\"" + d + "\"]",
		"long name":       "tenants:\n  - name: " + strings.Repeat("a", 65) + "\n    api_key_sha256: [\"" + d + "\"]",
		"no keys":         "tenants:\n  - name: a",
		"short digest":    "tenants:\n  - name: a\n    api_key_sha256: [\"" + d[:62] + "\"]",
		"not hex":         "tenants:\n  - name: a\n    api_key_sha256: [\"" + strings.Repeat("g", 64) + "\"]",
		"shared digest":   "tenants:\n  - name: a\n    api_key_sha256: [\"" + d + "\"]\n  - name: b\n    api_key_sha256: [\"" + d + "\"]",
		"tenant twice":    "tenants:\n  - name: a\n    api_key_sha256: [\"" + d + "\"]\n  - name: a\n    api_key_sha256: [\"" + Digest("j") + "\"]",
		"not yaml":        "tenants: [",
	} {
		if _, err := Parse([]byte(file)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if _, _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "tenants file") {
		t.Errorf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("tenants:\n  - name: a\n    api_key_sha256: [\""+Digest("secret-key")+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, _, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Lookup("secret-key"); !ok {
		t.Error("key not found")
	}
}

// A key where its digest belongs is refused with a hint, and never printed.
func TestKeyInPlaceOfDigest(t *testing.T) {
	const apiKey = "sk_live_0123456789abcdef"
	_, err := Parse([]byte("tenants:\n  - name: a\n    api_key_sha256: [\"" + apiKey + "\"]\n"))
	if err == nil || !strings.Contains(err.Error(), "SHA-256 digest") || !strings.Contains(err.Error(), "never the key") {
		t.Fatalf("err = %v; want a hint that a digest belongs there", err)
	}
	if strings.Contains(err.Error(), apiKey) {
		t.Errorf("the error prints the value: %v", err)
	}
}
