// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The large answers a tenant has in flight on this instance are bounded:
// a replay or a status whose stored response is large holds one of its
// tenant's read slots from before the store reads the response (the
// GETRANGE of a record its script sent by its head only; see largeRead)
// until it is written. The read budget bounds the bytes
// a tenant reads a second, not when: refilled, it admitted a tenant's many
// concurrent replays of 1 MiB at once, which took every CPU idemsvc runs
// on for tens of milliseconds, and another tenant's begins queued behind
// them (make load-reads: its p99 from 2.6 ms to 47.6 ms on an idle
// machine, to hundreds of ms on a loaded one). With at most half of
// GOMAXPROCS of them at once, another tenant's begin always finds a CPU.
//
// A read past the slots waits for one, up to readSlotWait, as one of at
// most readSlotWaiters × slots waiting (so that the records held waiting
// stay bounded), and is then refused with 429 rate-limited.
const (
	readSlotWait    = time.Second
	readSlotWaiters = 8
)

// DefaultReadsInFlight is the large answers in flight per tenant and
// instance by default: half of GOMAXPROCS, at least one.
func DefaultReadsInFlight() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// readSlots are every tenant's read slots on this instance. A tenant has
// an entry only while it has a large answer in flight or waiting, so that
// tenant names never seen again take no memory.
type readSlots struct {
	slots int
	// refusedOf counts a refusal (idemsvc_limit_rejections_total with
	// limit reads_in_flight); nil counts none.
	refusedOf func(tenant string)
	mu        sync.Mutex
	of        map[string]*tenantReads
}

type tenantReads struct {
	held    chan struct{} // one element per slot held
	users   int           // holding or waiting; under readSlots.mu
	waiting int           // under readSlots.mu
}

func newReadSlots(slots int) *readSlots {
	return &readSlots{slots: slots, of: make(map[string]*tenantReads)}
}

// acquire takes one of tenant's read slots, waiting for one if need be and
// wait allows; it returns the function that gives it back, or the
// refusal.
func (r *readSlots) acquire(ctx context.Context, tenant string, wait bool) (func(), error) {
	r.mu.Lock()
	tr := r.of[tenant]
	if tr == nil {
		tr = &tenantReads{held: make(chan struct{}, r.slots)}
		r.of[tenant] = tr
	}
	tr.users++
	r.mu.Unlock()
	release := func() {
		<-tr.held
		r.leave(tenant, tr, false)
	}
	select {
	case tr.held <- struct{}{}:
		return release, nil
	default:
	}
	r.mu.Lock()
	if !wait || tr.waiting >= readSlotWaiters*r.slots {
		r.mu.Unlock()
		r.leave(tenant, tr, false)
		return nil, r.refused(tenant)
	}
	tr.waiting++
	r.mu.Unlock()
	timer := time.NewTimer(readSlotWait)
	defer timer.Stop()
	select {
	case tr.held <- struct{}{}:
		r.mu.Lock()
		tr.waiting--
		r.mu.Unlock()
		return release, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	r.leave(tenant, tr, true)
	return nil, r.refused(tenant)
}

// leave ends a use of tr (a wait, when waited), dropping the tenant's
// entry with its last user.
func (r *readSlots) leave(tenant string, tr *tenantReads, waited bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if waited {
		tr.waiting--
	}
	if tr.users--; tr.users == 0 {
		delete(r.of, tenant)
	}
}

func (r *readSlots) refused(tenant string) error {
	if r.refusedOf != nil {
		r.refusedOf(tenant)
	}
	return &quota.Error{Limit: quota.LimitReadsInFlight, RetryAfter: time.Second,
		Detail: fmt.Sprintf("the tenant has %d large stored responses being read on this instance, its limit (IDEMSVC_READS_IN_FLIGHT), and more waiting: replays and statuses with the response are refused until they are written", r.slots)}
}

// largeRead is one request's read slot. The Redis store takes it through
// statemachine.WithReadGate before it reads a large response (from the
// GETRANGE on); otherwise the handler takes it once the store answered
// with a large response (a store that reads records whole, a record read
// whole by its script whose response decodes to 64 KiB or more). The
// answer that writes the response gives it back.
//
// Taken after the store's read, as it once was, a tenant's reads waiting
// for a slot had each already read its response: a reader's 8 replays of
// 1 MiB at once read 8 MiB from Redis and decoded it, on every CPU, while
// one was written, and another tenant's begins waited behind them
// (BenchmarkReaderLeavesOthersTheirShare).
type largeRead struct {
	slots   *readSlots
	tenant  string
	wait    bool
	release func()
}

// readGate returns the read slot of tenant's begin or status, and the
// context to call the store with so that the store takes it before a
// large read. A request's context answers for the slot itself
// (requestCtx.Value), so a begin allocates nothing for it; any other
// context gets it added.
func (s *Service) readGate(ctx context.Context, tenant string) (*largeRead, context.Context) {
	if info := infoFrom(ctx); info != nil {
		info.reads = largeRead{slots: s.reads, tenant: tenant, wait: true}
		return &info.reads, ctx
	}
	l := &largeRead{slots: s.reads, tenant: tenant, wait: true}
	return l, statemachine.WithReadGate(ctx, l)
}

// EnterRead implements statemachine.ReadGate: it takes the slot, once.
func (l *largeRead) EnterRead(ctx context.Context) error {
	if l.release != nil {
		return nil
	}
	release, err := l.slots.acquire(ctx, l.tenant, l.wait)
	if err != nil {
		return err
	}
	l.release = release
	return nil
}

// take hands the slot over to the answer that writes the response,
// taking it first if the store did not and size says the answer is
// large; it returns nil for a small answer.
func (l *largeRead) take(ctx context.Context, size int64) (func(), error) {
	if l.release == nil && size >= largeAnswer {
		if err := l.EnterRead(ctx); err != nil {
			return nil, err
		}
	}
	release := l.release
	l.release = nil
	return release, nil
}

// drop gives the slot back if it is still held: the request failed, or
// answers without the response.
func (l *largeRead) drop() {
	if l.release != nil {
		l.release()
		l.release = nil
	}
}
