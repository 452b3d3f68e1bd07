// SPDX-License-Identifier: Apache-2.0

// Package idemtest is the kit that idemsvc's tests share: idemsvc served
// in process on a real loopback port, the stores to run against, tenants
// files, polling, unique names, and reading a metric. It is for tests only.
package idemtest

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// Tenant is one tenant of a tenants file.
type Tenant struct {
	Name string
	Key  string // the API key; the file holds its SHA-256 digest
	// MoreKeys are further keys of the tenant, as while one is rotated.
	MoreKeys []string
	// Admin keys may act for any tenant.
	Admin bool
	// Limits is a YAML flow mapping, e.g. "{begins_per_s: 1, burst: 1}";
	// empty for none.
	Limits string
}

// TenantsYAML is the tenants file that lists tenants.
func TenantsYAML(tenants ...Tenant) string {
	return TenantsYAMLWithDefaults("", tenants...)
}

// TenantsYAMLWithDefaults is the tenants file that lists tenants, with
// defaultLimits (a YAML flow mapping) for those without their own.
func TenantsYAMLWithDefaults(defaultLimits string, tenants ...Tenant) string {
	var b strings.Builder
	if defaultLimits != "" {
		fmt.Fprintf(&b, "defaults:\n  limits: %s\n", defaultLimits)
	}
	b.WriteString("tenants:\n")
	for _, t := range tenants {
		digests := []string{strconv.Quote(auth.Digest(t.Key))}
		for _, k := range t.MoreKeys {
			digests = append(digests, strconv.Quote(auth.Digest(k)))
		}
		fmt.Fprintf(&b, "  - name: %s\n    api_key_sha256: [%s]\n", t.Name, strings.Join(digests, ", "))
		if t.Admin {
			b.WriteString("    admin: true\n")
		}
		if t.Limits != "" {
			fmt.Fprintf(&b, "    limits: %s\n", t.Limits)
		}
	}
	return b.String()
}

// Keyring is the keyring of tenants.
func Keyring(tb testing.TB, tenants ...Tenant) *auth.Keyring {
	tb.Helper()
	k, err := auth.Parse([]byte(TenantsYAML(tenants...)))
	if err != nil {
		tb.Fatalf("idemtest: tenants: %v", err)
	}
	return k
}

// TenantsFile writes the tenants file of tenants into a temporary
// directory of tb and returns its path.
func TenantsFile(tb testing.TB, tenants ...Tenant) string {
	tb.Helper()
	return WriteTenantsFile(tb, TenantsYAML(tenants...))
}

// WriteTenantsFile writes a tenants file of the given text into a
// temporary directory of tb and returns its path.
func WriteTenantsFile(tb testing.TB, text string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		tb.Fatalf("idemtest: %v", err)
	}
	return path
}

// Idemsvc is idemsvc served in process.
type Idemsvc struct {
	URL     string
	Service *handlers.Service
	Server  *httptest.Server // to close its connections, say
}

// Serve serves idemsvc with cfg (a nil Store is a new memory store with
// the default limits) on a loopback port until tb ends, through wrap when
// given (to count or inspect requests, say). Waiting begins are answered
// before the server closes, so that closing does not wait for them.
func Serve(tb testing.TB, cfg handlers.Config, wrap ...func(http.Handler) http.Handler) *Idemsvc {
	tb.Helper()
	if cfg.Store == nil {
		cfg.Store = statemachine.NewMemoryStore(statemachine.DefaultLimits())
	}
	svc := handlers.New(cfg)
	var h http.Handler = svc
	for _, w := range wrap {
		h = w(h)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	tb.Cleanup(svc.StopWaiting) // runs first
	return &Idemsvc{URL: srv.URL, Service: svc, Server: srv}
}

// Eventually polls cond every 10 ms until it holds, and fails tb, naming
// what it waited for, when it does not within d.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(d, cond) {
		tb.Fatalf("idemtest: %s: not within %v", what, d)
	}
}

// Poll polls cond every 10 ms until it holds, and reports whether it did
// within d. Unlike Eventually it may run on any goroutine.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Unique returns prefix and 12 random hex digits: a key or name no other
// test uses, so that tests share servers safely.
func Unique(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", prefix, b)
}

// Metric is the value of the metric name with labels, as the exposition
// format writes them (`outcome="acquired",tenant="a"`; "" for none), at
// baseURL's /metrics; 0 when it is absent.
func Metric(tb testing.TB, baseURL, name, labels string) float64 {
	tb.Helper()
	resp, err := http.Get(baseURL + "/metrics")
	if err != nil {
		tb.Fatalf("idemtest: /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("idemtest: /metrics: %d %v", resp.StatusCode, err)
	}
	series := name
	if labels != "" {
		series += "{" + labels + "}"
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				tb.Fatalf("idemtest: metric %s: %q", series, v)
			}
			return f
		}
	}
	return 0
}

// Backend is one kind of store the tests run against.
type Backend struct {
	Name string
	// Open returns a store over the backend. Every call gives a store
	// with a client of its own, as separate idemsvc replicas have; the
	// memory backend gives the same store to every call of one Backends
	// list, as its replicas would share one.
	Open func(tb testing.TB) statemachine.Store
}

// Backends are the memory store, one Redis node and a Redis Cluster (the
// test binary's shared ones: tests use unique keys, and the package's
// TestMain calls redistest.Main).
func Backends() []Backend {
	var once sync.Once
	var memory *statemachine.MemoryStore
	return []Backend{
		{"memory", func(testing.TB) statemachine.Store {
			once.Do(func() { memory = statemachine.NewMemoryStore(statemachine.DefaultLimits()) })
			return memory
		}},
		{"redis", func(tb testing.TB) statemachine.Store {
			return redisstore.New(redistest.SharedServer(tb).Client(tb), redisstore.Options{})
		}},
		{"cluster", func(tb testing.TB) statemachine.Store {
			return redisstore.New(redistest.SharedCluster(tb).Client(tb), redisstore.Options{})
		}},
	}
}
