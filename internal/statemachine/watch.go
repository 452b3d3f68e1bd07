// SPDX-License-Identifier: Apache-2.0

package statemachine

import "sync"

// Watcher is a store that pushes the end of a key's attempts to whoever
// watches the key, so that waiting for an attempt costs no reads while
// nothing changes. redisstore.Store and MemoryStore implement it.
type Watcher interface {
	// Watch watches tenant's key until Stop. It does not block on the store:
	// when the watch cannot be set up, or news may have been lost, Missed
	// tells the caller to read the key instead.
	Watch(tenant, key string) *Watch
}

// Watch is one watch of a key. Its channels hold at most one pending
// signal each: signals that come while one is pending merge into it.
type Watch struct {
	ended  chan struct{}
	missed chan struct{}
	stop   func(*Watch)
	once   sync.Once
}

func NewWatch(stop func(*Watch)) *Watch {
	return &Watch{ended: make(chan struct{}, 1), missed: make(chan struct{}, 1), stop: stop}
}

// Ended receives when an attempt of the key ended: completed, failed,
// released, taken over after its lease ran out, or deleted. It may be an
// attempt other than the one the caller waits for; a lease that runs out
// with nobody taking over sends nothing.
func (w *Watch) Ended() <-chan struct{} { return w.ended }

// Missed receives when the watch comes into force (news from before it
// would be lost) and whenever news may have been lost since (a lost
// connection, a failover): the caller should read the key.
func (w *Watch) Missed() <-chan struct{} { return w.missed }

// SignalMissed signals Missed, for the store that feeds the watch.
func (w *Watch) SignalMissed() { signal(w.missed) }

// Stop ends the watch. It may be called more than once.
func (w *Watch) Stop() { w.once.Do(func() { w.stop(w) }) }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// WatchSet is the watches of a store's keys, by key.
type WatchSet[K comparable] map[K]map[*Watch]struct{}

// Add adds w under k and reports whether it is k's first watch.
func (s WatchSet[K]) Add(k K, w *Watch) bool {
	ws := s[k]
	if ws == nil {
		ws = make(map[*Watch]struct{})
		s[k] = ws
	}
	ws[w] = struct{}{}
	return len(ws) == 1
}

// Remove removes w from k and reports whether k has no watch left.
func (s WatchSet[K]) Remove(k K, w *Watch) bool {
	ws := s[k]
	if ws == nil {
		return false
	}
	delete(ws, w)
	if len(ws) == 0 {
		delete(s, k)
		return true
	}
	return false
}

// Ended signals k's watches that an attempt Ended.
func (s WatchSet[K]) Ended(k K) {
	for w := range s[k] {
		signal(w.ended)
	}
}

// Missed signals k's watches to read the key.
func (s WatchSet[K]) Missed(k K) {
	for w := range s[k] {
		signal(w.missed)
	}
}
