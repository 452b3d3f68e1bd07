// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// waiters parks begins that wait for an attempt in progress. The waiters of
// one key share one watcher goroutine, which wakes them all once the
// attempt is over: finished, released, taken over, its lease run out, or
// the record gone. With a store that pushes the end of attempts
// (statemachine.Watcher) the watcher reads the key only when the push may
// have been missed, at the lease's end, and every fallback interval; with
// another store it reads the key every interval.
type waiters struct {
	store    statemachine.Store
	watcher  statemachine.Watcher // nil: poll
	interval time.Duration        // between reads of a waited key
	metrics  *metrics

	mu     sync.Mutex
	keys   map[waitKey]*waitedKey
	closed bool
	stop   chan struct{} // closed by close: every waiter answers now
}

type waitKey struct{ tenant, key string }

// waitedKey is one key's waiters and the goroutine that watches it for them.
type waitedKey struct {
	attempt int64         // the attempt being waited out
	lease   time.Time     // when its lease ends, as its 409 said
	count   int           // waiters; the watcher quits at zero
	idle    chan struct{} // signalled when count drops to zero
	over    chan struct{} // closed when the attempt is over
}

// leaseRecheck is how soon the key is read again when, at the lease's end
// by this process's clock, Redis's clock says the lease still runs.
const leaseRecheck = 5 * time.Millisecond

// storeRetry is how soon a read that failed past the lease's end is tried
// again.
const storeRetry = 250 * time.Millisecond

// newWaiters returns the hub. With a store that pushes, interval is the
// fallback read of a waited key (at most one per second, per the contract);
// with another store it is the poll interval.
func newWaiters(store statemachine.Store, interval, fallback time.Duration, m *metrics) *waiters {
	w := &waiters{store: store, interval: interval, metrics: m,
		keys: make(map[waitKey]*waitedKey), stop: make(chan struct{})}
	if watcher, ok := store.(statemachine.Watcher); ok {
		w.watcher, w.interval = watcher, max(fallback, time.Second)
	}
	return w
}

// wait blocks until attempt of (tenant, key), whose lease ends at lease, is
// over, d has passed, ctx is done or the hub closes. It reports whether the
// attempt is over, in which case the caller begins again.
func (w *waiters) wait(ctx context.Context, tenant, key string, attempt int64, lease time.Time, d time.Duration) bool {
	k := waitKey{tenant, key}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	wk := w.keys[k]
	if wk == nil || wk.attempt != attempt {
		// A watcher for another attempt keeps serving its own waiters; the
		// newer attempt gets the map entry and a watcher of its own.
		wk = &waitedKey{attempt: attempt, lease: lease,
			idle: make(chan struct{}, 1), over: make(chan struct{})}
		w.keys[k] = wk
		go w.watch(k, wk)
	}
	wk.count++
	w.mu.Unlock()
	w.metrics.waiters.Inc()
	defer func() {
		w.metrics.waiters.Dec()
		w.mu.Lock()
		wk.count--
		if wk.count == 0 {
			select {
			case wk.idle <- struct{}{}:
			default:
			}
		}
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

// watch watches one waited attempt until it is over or nobody waits.
func (w *waiters) watch(k waitKey, wk *waitedKey) {
	var ended, missed <-chan struct{}
	if w.watcher != nil {
		watch := w.watcher.Watch(k.tenant, k.key)
		defer watch.Stop()
		ended, missed = watch.Ended(), watch.Missed()
	}
	// The reads of many keys are spread evenly over the interval: a
	// polled key's first read comes within it; a watched key's a whole
	// interval or more after the read its watch makes as it comes into
	// force.
	first := rand.N(w.interval) + 1
	if w.watcher != nil {
		first += w.interval
	}
	poll := time.NewTimer(first)
	defer poll.Stop()
	leaseEnd := time.NewTimer(max(time.Until(wk.lease), 0))
	defer leaseEnd.Stop()
	for {
		select {
		case <-ended:
			w.end(k, wk)
			return
		case <-missed:
		case <-poll.C:
			poll.Reset(w.interval)
		case <-leaseEnd.C:
		case <-wk.idle:
			// Whether nobody waits is decided, and the entry removed, under
			// one lock: a waiter arriving later makes a new entry and watcher.
			w.mu.Lock()
			idle := wk.count == 0
			if idle {
				w.forget(k, wk)
			}
			w.mu.Unlock()
			if idle {
				return
			}
			continue
		case <-w.stop:
			return
		}
		over, lease := w.isOver(k, wk.attempt)
		if over {
			w.end(k, wk)
			return
		}
		switch {
		case lease.IsZero():
			if !time.Now().Before(wk.lease) {
				leaseEnd.Reset(storeRetry) // the read failed past the lease's end
			}
		case !lease.Equal(wk.lease):
			wk.lease = lease // extended: wake at its new end
			leaseEnd.Reset(max(time.Until(lease), 0))
		case !time.Now().Before(lease):
			// Our clock is ahead of Redis's: look again shortly.
			leaseEnd.Reset(leaseRecheck)
		}
	}
}

// end wakes the waiters of wk: they begin again.
func (w *waiters) end(k waitKey, wk *waitedKey) {
	w.mu.Lock()
	w.forget(k, wk)
	w.mu.Unlock()
	close(wk.over) // waiters that found the entry before see this
}

// forget removes wk from the map unless a newer attempt replaced it.
// Called with mu held.
func (w *waiters) forget(k waitKey, wk *waitedKey) {
	if w.keys[k] == wk {
		delete(w.keys, k)
	}
}

// isOver reads the key's status. A read that fails counts as not over: the
// waiters keep waiting, and answer 409 when their wait ends. While the
// attempt runs, it returns the lease's end.
func (w *waiters) isOver(k waitKey, attempt int64) (bool, time.Time) {
	w.metrics.waitPolls.Inc()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// Its waiters wait anyway: the read is queued, not shed as overload.
	rec, err := w.store.Status(statemachine.WithQueueWait(ctx, time.Second), k.tenant, k.key, false)
	if errors.Is(err, statemachine.ErrNotFound) {
		return true, time.Time{}
	}
	if err != nil {
		return false, time.Time{}
	}
	if rec.State != statemachine.StateInProgress || rec.Attempt != attempt || rec.LeaseExpired {
		return true, time.Time{}
	}
	return false, rec.LeaseExpiresAt
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
