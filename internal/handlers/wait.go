package handlers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// waiters parks begins that wait for an attempt in progress. The waiters of
// one key share one poller, which reads the key's status every interval and
// wakes them all once the attempt is over: finished, released, its lease
// run out, or the record gone. The store thus sees one read per waited key
// per interval, whatever the number of waiters.
type waiters struct {
	store    statemachine.Store
	interval time.Duration
	metrics  *metrics

	mu     sync.Mutex
	keys   map[waitKey]*waitedKey
	closed bool
	stop   chan struct{} // closed by close: every waiter answers now
}

type waitKey struct{ tenant, key string }

// waitedKey is one key's waiters and the poller that watches it for them.
type waitedKey struct {
	attempt int64         // the attempt being waited out
	count   int           // waiters; the poller quits at zero
	over    chan struct{} // closed when the attempt is over
}

func newWaiters(store statemachine.Store, interval time.Duration, m *metrics) *waiters {
	return &waiters{store: store, interval: interval, metrics: m,
		keys: make(map[waitKey]*waitedKey), stop: make(chan struct{})}
}

// wait blocks until attempt of (tenant, key) is over, d has passed, ctx is
// done or the hub closes. It reports whether the attempt is over, in which
// case the caller begins again.
func (w *waiters) wait(ctx context.Context, tenant, key string, attempt int64, d time.Duration) bool {
	k := waitKey{tenant, key}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	wk := w.keys[k]
	if wk == nil || wk.attempt != attempt {
		// A poller for another attempt keeps serving its own waiters; the
		// newer attempt gets the map entry and a poller of its own.
		wk = &waitedKey{attempt: attempt, over: make(chan struct{})}
		w.keys[k] = wk
		go w.poll(k, wk)
	}
	wk.count++
	w.mu.Unlock()
	w.metrics.waiters.Inc()
	defer func() {
		w.metrics.waiters.Dec()
		w.mu.Lock()
		wk.count--
		w.mu.Unlock()
	}()

	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-wk.over:
		return true
	case <-timer.C:
	case <-ctx.Done():
	case <-w.stop:
	}
	return false
}

// poll watches one waited attempt until it is over or nobody waits.
func (w *waiters) poll(k waitKey, wk *waitedKey) {
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
		case <-w.stop:
			return
		}
		// Whether nobody waits is decided, and the entry removed, under
		// one lock: a waiter arriving later makes a new entry and poller.
		w.mu.Lock()
		idle := wk.count == 0
		if idle {
			w.forget(k, wk)
		}
		w.mu.Unlock()
		if idle {
			return
		}
		if w.isOver(k, wk.attempt) {
			w.mu.Lock()
			w.forget(k, wk)
			w.mu.Unlock()
			close(wk.over) // waiters that found the entry before see this
			return
		}
	}
}

// forget removes wk from the map unless a newer attempt replaced it.
// Called with mu held.
func (w *waiters) forget(k waitKey, wk *waitedKey) {
	if w.keys[k] == wk {
		delete(w.keys, k)
	}
}

// isOver reads the key's status. A read that fails counts as not over: the
// waiters keep waiting, and answer 409 when their wait ends.
func (w *waiters) isOver(k waitKey, attempt int64) bool {
	w.metrics.waitPolls.Inc()
	ctx, cancel := context.WithTimeout(context.Background(), w.interval*4)
	defer cancel()
	rec, err := w.store.Status(ctx, k.tenant, k.key, false)
	if errors.Is(err, statemachine.ErrNotFound) {
		return true
	}
	if err != nil {
		return false
	}
	return rec.State != statemachine.StateInProgress || rec.Attempt != attempt || rec.LeaseExpired
}

// close wakes every waiter, to answer now, and refuses new ones.
func (w *waiters) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
}
