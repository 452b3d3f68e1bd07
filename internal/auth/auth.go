// SPDX-License-Identifier: Apache-2.0

// Package auth maps API keys to the tenants they act for. Keys are never
// stored: the tenants file holds their SHA-256 digests, a presented key is
// hashed, found by its digest and compared in constant time.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// Principal is who a request acts as.
type Principal struct {
	Tenant string // the key's own tenant
	Admin  bool   // may act for any tenant
}

// Keyring holds the API key digests of every tenant, and their limits. It
// is safe for concurrent use, and Replace swaps its tenants at once while
// it serves, so a reloaded tenants file takes effect without a restart.
type Keyring struct {
	cur atomic.Pointer[tenants]
}

// tenants is one reading of the tenants file; it never changes.
type tenants struct {
	keys     []key
	names    map[string]bool
	limits   map[string]Limits // tenants with their own limits
	defaults Limits            // every other tenant's
}

type key struct {
	digest    [sha256.Size]byte
	principal Principal
	index     int // in its tenant's api_key_sha256
}

// KeyPrefix starts the API keys the recipe of docs/configuration.md makes
// (idemsvc_ and 64 hex characters): a value with it in the tenants file is
// a key pasted where its digest belongs, and is refused.
const KeyPrefix = "idemsvc_"

// file is the tenants file's layout.
type file struct {
	Defaults struct {
		Limits *limitsFile `yaml:"limits"`
	} `yaml:"defaults"`
	Tenants []struct {
		Name         string      `yaml:"name"`
		Admin        bool        `yaml:"admin"`
		APIKeySHA256 []string    `yaml:"api_key_sha256"`
		Limits       *limitsFile `yaml:"limits"`
	} `yaml:"tenants"`
}

var tenantName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// ValidTenantName reports whether name is a well-formed tenant name.
func ValidTenantName(name string) bool { return tenantName.MatchString(name) }

// LoadFile reads the tenants file at path, and returns its content too
// (for Watch).
func LoadFile(path string) (*Keyring, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("tenants file: %w", err)
	}
	k, err := Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	return k, data, nil
}

// Parse reads a tenants file (YAML, or JSON, which is YAML too). Unknown
// fields, malformed names or digests, a tenant without keys, and a digest
// given twice are errors: a typo must not silently lock a tenant out or
// let a key act for two tenants.
func Parse(data []byte) (*Keyring, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f file
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if len(f.Tenants) == 0 {
		return nil, errors.New("no tenants")
	}
	k := &tenants{limits: make(map[string]Limits), names: make(map[string]bool, len(f.Tenants))}
	if f.Defaults.Limits != nil {
		var err error
		if k.defaults, err = f.Defaults.Limits.limits(); err != nil {
			return nil, fmt.Errorf("defaults: %w", err)
		}
	}
	for i, t := range f.Tenants {
		if !tenantName.MatchString(t.Name) {
			return nil, fmt.Errorf("tenant %d: name %q must match [a-z0-9_-]{1,64}", i+1, t.Name)
		}
		if k.names[t.Name] {
			return nil, fmt.Errorf("tenant %q: listed twice", t.Name)
		}
		k.names[t.Name] = true
		if t.Limits != nil {
			l, err := t.Limits.limits()
			if err != nil {
				return nil, fmt.Errorf("tenant %q: %w", t.Name, err)
			}
			k.limits[t.Name] = l
		}
		if len(t.APIKeySHA256) == 0 {
			return nil, fmt.Errorf("tenant %q: no api_key_sha256", t.Name)
		}
		for j, h := range t.APIKeySHA256 {
			if strings.HasPrefix(h, KeyPrefix) {
				// The value is not printed: it is the key itself.
				return nil, fmt.Errorf("tenant %q: api_key_sha256[%d] is an API key (it starts with %s), not its digest: "+
					"a SHA-256 digest (64 hex characters) belongs there, never the key: printf %%s \"$KEY\" | sha256sum", t.Name, j, KeyPrefix)
			}
			var d [sha256.Size]byte
			if n, err := hex.Decode(d[:], []byte(h)); err != nil || n != sha256.Size || len(h) != 2*sha256.Size {
				// The value is not printed: it may be the key itself.
				return nil, fmt.Errorf("tenant %q: api_key_sha256[%d] is not a SHA-256 digest (64 hex characters); "+
					"the file holds the digest of each API key, never the key: printf %%s \"$KEY\" | sha256sum", t.Name, j)
			}
			if _, dup := k.lookup(d); dup {
				return nil, fmt.Errorf("tenant %q: api_key_sha256[%d] is given more than once", t.Name, j)
			}
			k.keys = append(k.keys, key{d, Principal{Tenant: t.Name, Admin: t.Admin}, j})
		}
	}
	kr := &Keyring{}
	kr.cur.Store(k)
	return kr, nil
}

// Replace puts from's tenants in force in k, for every later call.
func (k *Keyring) Replace(from *Keyring) { k.cur.Store(from.cur.Load()) }

// Tenants lists the tenants of the file, sorted.
func (k *Keyring) Tenants() []string {
	return slices.Sorted(maps.Keys(k.cur.Load().names))
}

// Has reports whether the tenants file lists tenant.
func (k *Keyring) Has(tenant string) bool { return k.cur.Load().names[tenant] }

// Limits returns tenant's limits: its own, or the defaults. A nil Keyring
// (no tenants file) limits nobody.
func (k *Keyring) Limits(tenant string) Limits {
	if k == nil {
		return Limits{}
	}
	t := k.cur.Load()
	if l, ok := t.limits[tenant]; ok {
		return l
	}
	return t.defaults
}

// Lookup returns the principal of apiKey, or false for an unknown key.
func (k *Keyring) Lookup(apiKey string) (Principal, bool) {
	found, ok := k.cur.Load().lookup(sha256.Sum256([]byte(apiKey)))
	return found.principal, ok
}

// Pasted reports where the tenants file lists apiKey itself instead of
// its digest: a key of 64 hex characters (the shape of a digest) pasted
// into api_key_sha256, or a caller given the digest as its key. Such a
// key gets 401; the caller of Pasted tells the operator why. Unknown keys
// only are asked about, after Lookup refused them.
func (k *Keyring) Pasted(apiKey string) (tenant string, index int, ok bool) {
	var d [sha256.Size]byte
	if len(apiKey) != hex.EncodedLen(sha256.Size) {
		return "", 0, false
	}
	if _, err := hex.Decode(d[:], []byte(apiKey)); err != nil {
		return "", 0, false
	}
	found, ok := k.cur.Load().lookup(d)
	return found.principal.Tenant, found.index, ok
}

// lookup compares d with every digest in constant time, without stopping
// at a match: how long it takes tells nothing about which key matched, or
// how close a wrong one came.
func (k *tenants) lookup(d [sha256.Size]byte) (key, bool) {
	var found key
	match := 0
	for i := range k.keys {
		eq := subtle.ConstantTimeCompare(d[:], k.keys[i].digest[:])
		if eq == 1 {
			found = k.keys[i]
		}
		match |= eq
	}
	return found, match == 1
}

// Digest is the SHA-256 hex digest of apiKey, as the tenants file lists it.
func Digest(apiKey string) string {
	d := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(d[:])
}
