// SPDX-License-Identifier: Apache-2.0

package cowmap_test

import (
	"sync"
	"testing"

	"github.com/idemsvc/idemsvc/internal/cowmap"
)

// Goroutines that store a key at once all get the one value stored first.
func TestLoadOrStoreKeepsTheFirst(t *testing.T) {
	var m cowmap.Map[string, *int]
	if _, ok := m.Load("a"); ok {
		t.Fatal("a zero Map holds a key")
	}
	got := make([]*int, 16)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			v := i
			got[i], _ = m.LoadOrStore("a", &v)
		})
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("goroutine %d got %d, goroutine 0 got %d", i, *got[i], *got[0])
		}
	}
	if v, ok := m.Load("a"); !ok || v != got[0] {
		t.Fatalf("Load = %v, %v; want the value stored", v, ok)
	}
	if _, loaded := m.LoadOrStore("b", new(int)); loaded {
		t.Fatal("a new key reported as loaded")
	}
	n := 0
	m.Range(func(string, *int) bool { n++; return true })
	if n != 2 {
		t.Fatalf("Range saw %d keys, want 2", n)
	}
}

type seriesKey struct {
	route, outcome, tenant string
	status                 int
}

// BenchmarkLoad reads a warm key, as a request reads its tenant's state
// and its metric series, from a Map and from a sync.Map (the baseline).
func BenchmarkLoad(b *testing.B) {
	key := seriesKey{"/v1/begin", "acquired", "acme", 201}
	b.Run("string", func(b *testing.B) {
		var m cowmap.Map[string, *int]
		m.LoadOrStore("acme", new(int))
		for b.Loop() {
			m.Load("acme")
		}
	})
	b.Run("string-sync.Map", func(b *testing.B) {
		var m sync.Map
		m.Store("acme", new(int))
		for b.Loop() {
			m.Load("acme")
		}
	})
	b.Run("struct", func(b *testing.B) {
		var m cowmap.Map[seriesKey, *int]
		m.LoadOrStore(key, new(int))
		for b.Loop() {
			m.Load(key)
		}
	})
	b.Run("struct-sync.Map", func(b *testing.B) {
		var m sync.Map
		m.Store(key, new(int))
		for b.Loop() {
			m.Load(key)
		}
	})
}
