// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// Shedding: the store runs at most MaxInFlight scripts at a time, and a call
// that finds every slot taken queues for one. A queue that forms after the
// queue was empty is a burst: it drains by itself, and every call in it may
// wait for a slot up to the store's timeout. A queue that has not emptied for
// ShedInterval, while at least shedDepth×MaxInFlight calls went through it,
// is standing: calls keep arriving faster than the store serves them. A begin, status or delete that
// joins a standing queue waits at most ShedTarget, and is refused
// (ErrOverloaded) when no slot frees by then, so that overload is refused at
// once instead of queueing for seconds. Complete, fail and extend, a begin
// that waited for another attempt, and calls made with
// statemachine.WithQueueWait are
// never refused for a standing queue: they wait up to the timeout (or their
// own wait).
//
// This is CoDel's rule as Facebook's RPC servers apply it ("Fail at Scale",
// ACM Queue 13(8), 2015: a queue that has not emptied for N ms limits the
// wait to M ms, with N = 100 and M = 5), with one change: the queue must
// also have let shedDepth×MaxInFlight calls through. Wall time alone mistakes
// a burst on a slow or loaded machine for overload: 1,000 begins drain in
// about 130 ms on an idle 2-core machine, and in seconds under the race
// detector on a loaded one; counted in calls served, both are the same
// burst. (A Redis that hangs lets no call through: calls then wait for a
// slot up to the timeout, and fail closed as for any Redis that does not
// answer; on a loaded machine a burst too can let none through for half a
// second, which a rule on time alone would shed.) It is written here rather than taken from a library: the Go port of
// Netflix's concurrency-limits (platinummonkey/go-concurrency-limits) adapts
// a limit on calls in flight and refuses past it (or queues for a fixed
// time), which sheds the burst above; it has no standing-queue rule, and it
// sees few changes.
const (
	// DefaultShedInterval is RedisOptions.ShedInterval's default.
	DefaultShedInterval = 100 * time.Millisecond
	// DefaultShedTarget is RedisOptions.ShedTarget's default.
	DefaultShedTarget = 5 * time.Millisecond
	// shedDepth: a standing queue has let through at least this many times
	// MaxInFlight calls since it formed (1,024 with the default 128, which
	// on 2 idle cores is about 130 ms of begins).
	shedDepth = 8
)

// admission is the slots of the scripts in flight and the queue for them.
type admission struct {
	slots    chan struct{} // one per script in flight
	interval time.Duration // ShedInterval
	target   time.Duration // ShedTarget
	depth    uint64        // shedDepth × MaxInFlight
	shed     atomic.Uint64 // calls refused for a standing queue

	mu     sync.Mutex
	queued int       // calls waiting for a slot
	since  time.Time // when the queue last formed (queued went from 0 to 1)
	base   uint64    // passed, when it formed
	passed uint64    // calls that got a slot after queueing, ever
}

func newAdmission(maxInFlight int, interval, target time.Duration) *admission {
	if interval <= 0 {
		interval = DefaultShedInterval
	}
	if target <= 0 {
		target = DefaultShedTarget
	}
	return &admission{slots: make(chan struct{}, maxInFlight), interval: interval, target: target,
		depth: shedDepth * uint64(maxInFlight)}
}

// acquire takes a slot for one call: at once when one is free; else it
// queues, for up to timeout, or ShedTarget for a call that may be shed
// (shed) and joins a standing queue. A call that gets none did not run.
// The caller gives the slot back with release.
func (a *admission) acquire(ctx context.Context, shed bool, timeout time.Duration) error {
	select {
	case a.slots <- struct{}{}:
		return nil
	default:
	}
	wait := timeout
	if shed {
		if d, ok := statemachine.QueueWait(ctx); ok {
			shed, wait = false, min(max(d, 0), timeout)
		}
	}
	if a.join(shed) {
		wait = a.target
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		a.leave(true)
		return nil
	case <-t.C:
		a.leave(false)
		if shed {
			a.shed.Add(1)
		}
		return statemachine.ErrOverloaded
	case <-ctx.Done():
		a.leave(false)
		return fmt.Errorf("%w: %w", statemachine.ErrOverloaded, context.Cause(ctx))
	}
}

// join adds a call to the queue and reports whether it may wait only
// ShedTarget: it may be shed, and the queue is standing.
func (a *admission) join(shed bool) bool {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.queued++
	if a.queued == 1 {
		a.since, a.base = now, a.passed
		return false
	}
	return shed && now.Sub(a.since) >= a.interval && a.passed-a.base >= a.depth
}

// leave takes a call off the queue: it got a slot (passed) or gave up.
func (a *admission) leave(passed bool) {
	a.mu.Lock()
	a.queued--
	if passed {
		a.passed++
	}
	a.mu.Unlock()
}

// release gives back a slot taken by acquire.
func (a *admission) release() { <-a.slots }
