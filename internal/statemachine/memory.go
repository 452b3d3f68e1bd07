// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"context"
	"math"
	"sync"
	"time"
)

// MemoryStore keeps records in this process: the embedded store for
// development and a reference for tests. It follows the Lua scripts of
// redisstore.Store transition for transition, with the process's clock.
type MemoryStore struct {
	limits  Limits
	mu      sync.Mutex
	records map[memoryKey]*Stored
	watches WatchSet[memoryKey] // memory_watch.go
}

type memoryKey struct{ tenant, key string }

// expirySample is how many records a write inspects for expiry, as Redis's
// active expiry samples keys, so that memory is reclaimed without a sweeper.
const expirySample = 20

// NewMemoryStore returns an empty MemoryStore enforcing limits.
func NewMemoryStore(limits Limits) *MemoryStore {
	return &MemoryStore{limits: limits.WithDefaults(), records: make(map[memoryKey]*Stored)}
}

var _ Store = (*MemoryStore)(nil)

// get returns the live record under k, dropping it if its retention ended
// (as in Redis, a record expires once the time is past its expiry).
// The caller holds m.mu.
func (m *MemoryStore) get(k memoryKey, now int64) *Stored {
	s := m.records[k]
	if s != nil && s.expires < now {
		delete(m.records, k)
		return nil
	}
	return s
}

// put stores s under k and drops a sample of expired records. The caller holds m.mu.
func (m *MemoryStore) put(k memoryKey, s *Stored, now int64) {
	n := 0
	for other, rec := range m.records {
		if rec.expires < now {
			delete(m.records, other)
		}
		if n++; n == expirySample {
			break
		}
	}
	m.records[k] = s
}

// Begin implements Store; see internal/lua/begin.lua.
func (m *MemoryStore) Begin(_ context.Context, tenant string, req BeginRequest) (BeginResult, error) {
	lease, retention, tok, err := m.limits.CheckBegin(tenant, &req)
	if err != nil {
		return BeginResult{}, err
	}
	k := memoryKey{tenant, req.Key}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := nowMs()
	old := m.get(k, now)
	if old != nil {
		if req.Fingerprint != "" && old.fingerprint != "" && old.fingerprint != req.Fingerprint {
			return BeginResult{}, ErrFingerprintMismatch
		}
		if old.state == StateInProgress {
			if old.lease > now {
				if req.Owner != "" && old.owner == req.Owner {
					return Acquired(tenant, old, now)
				}
				return BeginResult{}, Busy(old, now)
			}
		} else if !old.retryable {
			if req.NoReplay {
				return BeginResult{}, ErrReplayRefused
			}
			return Replay(tenant, old, now, m.limits.MaxResponseBytes)
		}
	}
	if req.NoAcquire {
		return BeginResult{}, ErrAcquireRefused
	}

	s := &Stored{
		state:       StateInProgress,
		attempt:     1,
		created:     now,
		updated:     now,
		lease:       now + lease.Milliseconds(),
		retention:   int64(retention / time.Second),
		owner:       req.Owner,
		fingerprint: req.Fingerprint,
		key:         req.Key,
	}
	s.expires = s.lease + retention.Milliseconds()
	s.token = tok
	if old != nil {
		s.attempt, s.created = old.attempt+1, old.created
		s.recovered = old.state == StateInProgress
		if s.recovered {
			m.watches.Ended(k) // as begin.lua announces a takeover
		}
		if s.fingerprint == "" {
			s.fingerprint = old.fingerprint
		}
	}
	m.put(k, s, now)
	return Acquired(tenant, s, now)
}

// Complete implements Store; see internal/lua/complete.lua.
func (m *MemoryStore) Complete(_ context.Context, tenant string, req CompleteRequest) (Record, error) {
	tok, err := m.limits.CheckFinish(tenant, req.Key, req.Token, req.Retention, &req.Response, "")
	if err != nil {
		return Record{}, err
	}
	response := m.keptForm(&req.Response)
	rec, err := m.finish(tenant, req.Key, tok, StateCompleted, func(s *Stored) {
		s.response = response
	}, req.Retention)
	rec.StoredBytes = StoredSize(response, &req.Response)
	return rec, err
}

// Fail implements Store; see internal/lua/fail.lua.
func (m *MemoryStore) Fail(_ context.Context, tenant string, req FailRequest) (Record, error) {
	tok, err := m.limits.CheckFinish(tenant, req.Key, req.Token, req.Retention, &req.Response, req.Error)
	if err != nil {
		return Record{}, err
	}
	response := m.keptForm(&req.Response)
	rec, err := m.finish(tenant, req.Key, tok, StateFailed, func(s *Stored) {
		s.retryable, s.errMsg, s.response = req.Retryable, req.Error, response
	}, req.Retention)
	rec.StoredBytes = StoredSize(response, &req.Response)
	return rec, err
}

// keptForm is r's form as the memory store keeps it: the body as sent,
// never compressed. Every replay of a record then shares its one stored
// body, where decompressing would give each replay a copy of its own (300
// slow readers of a 6 MiB answer would hold 1.8 GB: TestBoundedMemory).
func (m *MemoryStore) keptForm(r *Response) string {
	if r.Zstd != "" && r.Body != "" { // compressed beside its body: the body is kept
		plain := *r
		plain.Zstd, plain.ZstdSize = "", 0
		return EncodeResponse(&plain, math.MaxInt)
	}
	return EncodeResponse(r, math.MaxInt)
}

// finish moves the in-progress record fenced by tok to state, as complete.lua
// and fail.lua do; a second call with the same token answers as the first.
func (m *MemoryStore) finish(tenant, key string, tok Token, state State, set func(*Stored), retention time.Duration) (Record, error) {
	k := memoryKey{tenant, key}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := nowMs()
	old := m.get(k, now)
	switch {
	case old == nil:
		return Record{}, ErrNotFound
	case old.token != tok:
		return Record{}, ErrLeaseLost
	case old.state == state:
		return old.Record(tenant, now, false, 0)
	case old.state != StateInProgress:
		return Record{}, ErrLeaseLost
	}
	s := *old
	set(&s)
	if retention != 0 {
		s.retention = int64(retention / time.Second)
	}
	s.state, s.updated, s.expires = state, now, now+s.retention*1000
	m.put(k, &s, now)
	m.watches.Ended(k)
	return s.Record(tenant, now, false, 0)
}

// Extend implements Store; see internal/lua/extend.lua.
func (m *MemoryStore) Extend(_ context.Context, tenant string, req ExtendRequest) (Lease, error) {
	tok, lease, err := m.limits.CheckExtend(tenant, &req)
	if err != nil {
		return Lease{}, err
	}
	k := memoryKey{tenant, req.Key}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := nowMs()
	old := m.get(k, now)
	if old == nil {
		return Lease{}, ErrNotFound
	}
	if old.token != tok || old.state != StateInProgress {
		return Lease{}, ErrLeaseLost
	}
	s := *old
	s.updated, s.lease = now, now+lease.Milliseconds()
	s.expires = s.lease + s.retention*1000
	m.put(k, &s, now)
	return s.Lease(), nil
}

// Status implements Store.
func (m *MemoryStore) Status(_ context.Context, tenant, key string, withResponse bool) (Record, error) {
	if err := m.limits.CheckKey(tenant, key); err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := nowMs()
	s := m.get(memoryKey{tenant, key}, now)
	if s == nil {
		return Record{}, ErrNotFound
	}
	return s.Record(tenant, now, withResponse, m.limits.MaxResponseBytes)
}

// Delete implements Store.
func (m *MemoryStore) Delete(_ context.Context, tenant, key string) error {
	if err := m.limits.CheckKey(tenant, key); err != nil {
		return err
	}
	k := memoryKey{tenant, key}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.records[k]; s != nil && s.state == StateInProgress {
		m.watches.Ended(k)
	}
	delete(m.records, k)
	return nil
}

// Limits implements Store.
func (m *MemoryStore) Limits() Limits { return m.limits }

// Ping implements Store; memory is always there.
func (m *MemoryStore) Ping(context.Context) error { return nil }

// Readiness implements Store: the memory store is always ready.
func (*MemoryStore) Readiness(context.Context) []Failure { return nil }

func nowMs() int64 { return time.Now().UnixMilli() }
