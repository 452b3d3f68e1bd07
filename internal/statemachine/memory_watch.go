// SPDX-License-Identifier: Apache-2.0

package statemachine

// Watch implements Watcher: the transitions that end an attempt signal the
// key's watches in process, as the Redis scripts publish them.
func (m *MemoryStore) Watch(tenant, key string) *Watch {
	k := memoryKey{tenant, key}
	w := NewWatch(func(w *Watch) {
		m.mu.Lock()
		m.watches.Remove(k, w)
		m.mu.Unlock()
	})
	m.mu.Lock()
	if m.watches == nil {
		m.watches = make(WatchSet[memoryKey])
	}
	m.watches.Add(k, w)
	m.mu.Unlock()
	// In force at once; an attempt that ended before it is the caller's to read.
	w.SignalMissed()
	return w
}

var _ Watcher = (*MemoryStore)(nil)
