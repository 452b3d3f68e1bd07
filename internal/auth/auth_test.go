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

// A key of the recipe of docs/configuration.md (idemsvc_ and 64 hex characters) where its
// digest belongs is refused, saying it is a key, without printing it.
func TestPrefixedKeyInPlaceOfDigest(t *testing.T) {
	apiKey := KeyPrefix + strings.Repeat("0123456789abcdef", 4)
	_, err := Parse([]byte("tenants:\n  - name: a\n    api_key_sha256: [\"" + Digest("other") + "\", \"" + apiKey + "\"]\n"))
	if err == nil || !strings.Contains(err.Error(), "api_key_sha256[1] is an API key") || !strings.Contains(err.Error(), "SHA-256 digest") {
		t.Fatalf("err = %v; want api_key_sha256[1] named as a key, with a hint", err)
	}
	if strings.Contains(err.Error(), apiKey) || strings.Contains(err.Error(), apiKey[len(KeyPrefix):]) {
		t.Errorf("the error prints the value: %v", err)
	}
}

// A key of 64 hex characters has a digest's shape, so the file cannot
// tell it from one: it is read, its key gets no access, and Pasted finds
// the entry that holds it when the key is presented. A digest listed as it
// should be is no paste.
func TestPastedHexKey(t *testing.T) {
	pasted := strings.Repeat("9f86d081884c7d65", 4)
	k, err := Parse([]byte("tenants:\n  - name: a\n    api_key_sha256: [\"" + Digest("a-key") + "\"]\n" +
		"  - name: b\n    api_key_sha256: [\"" + Digest("b-key") + "\", \"" + pasted + "\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Lookup(pasted); ok {
		t.Fatal("the pasted key was accepted as a key")
	}
	if tenant, index, ok := k.Pasted(pasted); !ok || tenant != "b" || index != 1 {
		t.Errorf("Pasted = %q, %d, %v; want b, 1, true", tenant, index, ok)
	}
	if tenant, _, ok := k.Pasted(strings.ToUpper(pasted)); !ok || tenant != "b" {
		t.Errorf("Pasted of the key in capitals = %q, %v; want b, true", tenant, ok)
	}
	for _, key := range []string{"a-key", "b-key", Digest("a-key")[:63] + "x", strings.Repeat("0", 64)} {
		if _, _, ok := k.Pasted(key); ok {
			t.Errorf("Pasted(%q) = true", key)
		}
	}
}
