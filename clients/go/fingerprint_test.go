// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write the computed fingerprints and stored keys into conformance/fingerprints.json")

// vectorsFile is shared with the TypeScript SDK's tests.
const vectorsFile = "../../conformance/fingerprints.json"

type vectors struct {
	Description string `json:"description"`
	Canonical   []struct {
		JSON      string  `json:"json"`
		Canonical *string `json:"canonical"`
	} `json:"canonical"`
	RawCanonical []struct {
		Base64    string  `json:"base64"`
		Canonical *string `json:"canonical"`
	} `json:"raw_canonical"`
	Requests []struct {
		Name              string            `json:"name"`
		Method            string            `json:"method"`
		Target            string            `json:"target"`
		Headers           map[string]string `json:"headers"`
		Body              string            `json:"body"`
		Secret            string            `json:"secret"`
		CredentialCookies []string          `json:"credential_cookies"`
		Fingerprint       string            `json:"fingerprint"`
		LegacyFingerprint string            `json:"legacy_fingerprint"`
	} `json:"requests"`
	ScopedKeys []struct {
		Scope     string `json:"scope"`
		Key       string `json:"key"`
		StoredKey string `json:"stored_key"`
	} `json:"scoped_keys"`
}

// The fingerprints and stored keys of conformance/fingerprints.json, which
// the TypeScript SDK's tests hold it to as well.
func TestFingerprintVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Canonical {
		got, ok := canonicalJSON([]byte(c.JSON))
		switch {
		case c.Canonical == nil && ok:
			t.Errorf("canonicalJSON(%.40q) = %q, want refused", c.JSON, got)
		case c.Canonical != nil && (!ok || string(got) != *c.Canonical):
			t.Errorf("canonicalJSON(%.40q) = %q, %v; want %q", c.JSON, got, ok, *c.Canonical)
		}
	}
	for _, c := range v.RawCanonical {
		b, _ := base64.StdEncoding.DecodeString(c.Base64)
		got, ok := canonicalJSON(b)
		if ok != (c.Canonical != nil) || ok && string(got) != *c.Canonical {
			t.Errorf("canonicalJSON(%q) = %q, %v; want %v", b, got, ok, c.Canonical)
		}
	}
	seen := make(map[string]string)
	for i, c := range v.Requests {
		r := httptest.NewRequest(c.Method, c.Target, strings.NewReader(c.Body))
		for name, value := range c.Headers {
			r.Header.Set(name, value)
		}
		fp := fingerprint(r, []byte(c.Body), credentialDigest(r, credentialKey([]byte(c.Secret)), c.CredentialCookies))
		legacy := legacyFingerprint(r, []byte(c.Body))
		if *update {
			v.Requests[i].Fingerprint, v.Requests[i].LegacyFingerprint = fp, legacy
		} else if fp != c.Fingerprint || legacy != c.LegacyFingerprint {
			t.Errorf("%s: fingerprint %s, legacy %s; want %s, %s", c.Name, fp, legacy, c.Fingerprint, c.LegacyFingerprint)
		}
		seen[fp] += c.Name + "; "
	}
	// What the vectors show: order and spacing of JSON do not matter; the
	// media type and the caller's credentials do.
	same := [][]string{
		{"JSON", "the same JSON, members reordered and spaced", "JSON with a charset"},
	}
	for _, group := range same {
		if want := strings.Join(group, "; ") + "; "; !strings.Contains(strings.Join(values(seen), "|"), want) {
			t.Errorf("want one fingerprint for %q; fingerprints: %q", group, seen)
		}
	}
	if len(seen) != len(v.Requests)-2 {
		t.Errorf("%d fingerprints of %d requests, want every other request's its own: %q", len(seen), len(v.Requests), seen)
	}
	for i, c := range v.ScopedKeys {
		got, ok := scopedKey(c.Scope, c.Key)
		if !ok || len(got) > maxKeyBytes {
			t.Errorf("scopedKey(%q, %q) = %q, %v", c.Scope, c.Key, got, ok)
		}
		if *update {
			v.ScopedKeys[i].StoredKey = got
		} else if got != c.StoredKey {
			t.Errorf("scopedKey(%q, %.20q) = %q, want %q", c.Scope, c.Key, got, c.StoredKey)
		}
	}
	if *update {
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsFile, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func values(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// Two users, one client key: two stored keys; a key with a byte idemsvc
// refuses is refused.
func TestScopedKey(t *testing.T) {
	a, _ := scopedKey("alice", "k")
	b, _ := scopedKey("bob", "k")
	if a == b || !strings.HasSuffix(a, "~k") {
		t.Errorf("alice's %q, bob's %q", a, b)
	}
	if _, ok := scopedKey("alice", "a b"); ok {
		t.Error("a key with a space was accepted")
	}
	long, _ := scopedKey("alice", strings.Repeat("k", 255))
	if len(long) != 1+43+1+43 || !strings.Contains(long, "#") {
		t.Errorf("the scoped key of a 255-byte key: %q", long)
	}
}

func BenchmarkFingerprintJSON(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"Order 42","metadata":{"order_id":"6735","shipping":"express"}}`)
	r := httptest.NewRequest("POST", "/v1/charges", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl")
	key := credentialKey([]byte("sk_test"))
	b.ReportAllocs()
	for b.Loop() {
		_ = fingerprint(r, body, credentialDigest(r, key, nil))
	}
}
