// SPDX-License-Identifier: Apache-2.0

package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemsvc/idemsvc/internal/auth"
)

// NewMemory returns a Limiter whose counts live in this process, for the
// in-memory store (one process by definition).
func NewMemory(opts Options) Limiter {
	return newLimiter(&memoryBackend{
		rates: make(map[string]*rate.Limiter),
		bytes: make(map[string]map[int64]int64),
		sets:  make(map[string]map[string]time.Time),
	}, opts)
}

// memoryBackend keeps the counts in maps. The rate is a token bucket of
// golang.org/x/time/rate, the standard library's companion, which allows
// what the GCRA in Redis allows: burst at once, then the rate.
type memoryBackend struct {
	mu    sync.Mutex
	rates map[string]*rate.Limiter
	bytes map[string]map[int64]int64      // tenant -> expiry minute -> bytes
	sets  map[string]map[string]time.Time // tenant and set -> member -> when it is over
}

func (m *memoryBackend) take(_ context.Context, tenant string, l auth.Limits, n int) (int, time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rates[tenant]
	if r == nil {
		r = rate.NewLimiter(rate.Limit(l.BeginsPerS), int(l.Burst))
		m.rates[tenant] = r
	} else if r.Limit() != rate.Limit(l.BeginsPerS) || r.Burst() != int(l.Burst) {
		r.SetLimit(rate.Limit(l.BeginsPerS)) // the tenants file changed
		r.SetBurst(int(l.Burst))
	}
	now := time.Now()
	got := min(n, int(r.TokensAt(now)))
	if got < 1 {
		res := r.ReserveN(now, 1)
		wait := res.DelayFrom(now)
		res.CancelAt(now)
		return 0, wait, nil
	}
	r.AllowN(now, got)
	return got, 0, nil
}

func (m *memoryBackend) addBytes(_ context.Context, tenant string, deltas map[int64]int64) (int64, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	buckets := m.bytes[tenant]
	if buckets == nil {
		buckets = make(map[int64]int64)
		m.bytes[tenant] = buckets
	}
	for minute, b := range deltas {
		buckets[minute] += b
	}
	now := time.Now().UnixMilli()
	var total, first int64
	for minute, b := range buckets {
		ends := minute * bucketMs
		if ends <= now {
			delete(buckets, minute)
			continue
		}
		total += b
		if first == 0 || ends < first {
			first = ends
		}
	}
	if first == 0 {
		return total, time.Time{}, nil
	}
	return total, time.UnixMilli(first), nil
}

// set returns the live members of tenant's set, dropping those that are
// over. The caller holds m.mu.
func (m *memoryBackend) set(tenant, name string, now time.Time) map[string]time.Time {
	k := tenant + "\x00" + name
	members := m.sets[k]
	if members == nil {
		members = make(map[string]time.Time)
		m.sets[k] = members
	}
	for id, over := range members {
		if !now.Before(over) {
			delete(members, id)
		}
	}
	return members
}

func (m *memoryBackend) addSlots(_ context.Context, tenant, set string, ids []string, limit int64, ttl time.Duration) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	members := m.set(tenant, set, now)
	room := limit - int64(len(members))
	n := 0
	for _, id := range ids {
		if _, counted := members[id]; !counted {
			if room <= 0 {
				break
			}
			room--
		}
		members[id] = now.Add(ttl)
		n++
	}
	return n, nil
}

func (m *memoryBackend) removeSlot(_ context.Context, tenant, set, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.set(tenant, set, time.Now()), id)
	return nil
}

func (m *memoryBackend) countSlots(_ context.Context, tenant, set string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.set(tenant, set, time.Now()))), nil
}

func (m *memoryBackend) settleLeases(_ context.Context, tenant string, ends map[string]int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	members := m.set(tenant, setLeases, time.Now())
	for token, ms := range ends {
		if _, counted := members[token]; !counted {
			continue
		}
		if ms == 0 {
			delete(members, token)
		} else {
			members[token] = time.UnixMilli(ms)
		}
	}
	return nil
}

// newToken is a random lease token in the store's form: 16 bytes in
// lower-case hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return hex.EncodeToString(b[:])
}

// newID is a random waiter id.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return hex.EncodeToString(b[:])
}
