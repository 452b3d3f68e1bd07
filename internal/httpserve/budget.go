// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrOverBudget is a request body refused because the bodies held at once
// would pass the budget, after waiting BudgetWait for room.
var ErrOverBudget = errors.New("httpserve: request bodies in flight over the budget")

// BudgetWait is how long a body waits for room in the budget before
// ErrOverBudget: long enough for a burst of bodies to be served, short
// enough that a refused caller learns it at once.
const BudgetWait = 250 * time.Millisecond

// Budget bounds the bytes of request bodies held in memory at once. The
// bytes are taken as the buffer that holds a body grows, so a body
// declared large but sent slowly holds only what it sent; each is taken
// as many times as its request holds copies of the body.
//
// With shares (idemsvc, whose callers are authenticated tenants), two
// rules keep one tenant's bodies from starving another's, and a caller's
// complete from losing its place: bodies that finish an operation
// (complete, fail, extend: Claim.Finish) may use the whole budget, others
// only what is left above a reserve of a quarter of it; and the bodies of
// one tenant hold at most half the budget at once. A tenant that stalls
// its bodies thus holds at most half, the other half stays for the
// others, and a quarter of it only for outcomes: a complete waits for
// room only while other tenants' outcomes fill it. Stalled bodies give
// their room back within seconds, as ReadBody cuts a body that arrives
// slower than MinBodyRate.
type Budget struct {
	limit   int64
	reserve int64 // of limit, for Finish bodies only
	share   int64 // the most one tenant's bodies hold; 0 for no bound
	copies  int64
	held    atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{}    // closed, and replaced, when bytes are given back while some wait
	tenants map[string]int64 // bytes held per tenant, under mu
	refused prometheus.Counter
}

// Claim says whose body takes room, and which part of the budget it may
// use. The zero Claim is a body of no tenant that does not finish an
// operation.
type Claim struct {
	Tenant string // "" when unauthenticated or in a single-tenant setup
	Finish bool   // the body finishes an operation: complete, fail, extend
}

// NewBudget is a budget of limit bytes, for requests that each hold
// copies copies of their body at most (the bytes read, and what they are
// decoded or copied into). With shares, a quarter of it is reserved for
// Finish bodies and one tenant holds at most half of it. Its metrics,
// named with prefix, go to reg unless it is nil.
func NewBudget(limit int64, copies int, shares bool, reg prometheus.Registerer, prefix string) *Budget {
	b := &Budget{limit: limit, copies: int64(max(copies, 1)), freed: make(chan struct{}),
		tenants: make(map[string]int64),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "_body_budget_refused_total",
			Help: "Request bodies refused (503) because the bodies held at once were at the budget.",
		})}
	if shares {
		b.reserve, b.share = limit/4, limit/2
	}
	if reg != nil {
		reg.MustRegister(b.refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: prefix + "_body_bytes_in_flight",
			Help: "Bytes held for request bodies now, against the budget (max-body-bytes-in-flight).",
		}, func() float64 { return float64(b.held.Load()) }))
	}
	return b
}

// Limit is the budget in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Held is the bytes taken now, each body's as many times as its copies.
func (b *Budget) Held() int64 { return b.held.Load() }

// tryTake takes n bytes (copies included) for c if there is room.
func (b *Budget) tryTake(n int64, c Claim) bool {
	limit := b.limit
	if !c.Finish {
		limit -= b.reserve
	}
	if b.share == 0 || c.Tenant == "" {
		return b.tryHeld(n, limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.tenants[c.Tenant]
	if t+n > b.share || !b.tryHeld(n, limit) {
		return false
	}
	b.tenants[c.Tenant] = t + n
	return true
}

func (b *Budget) tryHeld(n, limit int64) bool {
	for {
		held := b.held.Load()
		if held+n > limit {
			return false
		}
		if b.held.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// Take takes n bytes of a body (n times the copies) for c: at once when
// there is room, else as soon as there is, within BudgetWait or until ctx
// ends; then ErrOverBudget.
func (b *Budget) Take(ctx context.Context, n int64, c Claim) error {
	return b.TakeBytes(ctx, n*b.copies, c)
}

// TakeBytes is Take of n bytes, copies included: for memory a request
// holds other than its body (an answer it records, say), in the same
// budget. Give them back with GiveBytes.
func (b *Budget) TakeBytes(ctx context.Context, n int64, c Claim) error {
	if b.tryTake(n, c) {
		return nil
	}
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	timer := time.NewTimer(BudgetWait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		if b.tryTake(n, c) {
			return nil
		}
		select {
		case <-freed:
		case <-timer.C:
			b.refused.Inc()
			return ErrOverBudget
		case <-ctx.Done():
			return ErrOverBudget
		}
	}
}

// Hold counts n bytes, copies included, without waiting or refusing: for
// memory a request already holds and must not be cut short for (an
// answer under way), so that new bodies wait while it is held. Give them
// back with GiveBytes.
func (b *Budget) Hold(n int64) { b.held.Add(n) }

// Give gives back n bytes of a body taken for c.
func (b *Budget) Give(n int64, c Claim) { b.GiveBytes(n*b.copies, c) }

// GiveBytes gives back n bytes taken with TakeBytes.
func (b *Budget) GiveBytes(n int64, c Claim) {
	if n == 0 {
		return
	}
	if b.share > 0 && c.Tenant != "" {
		b.mu.Lock()
		if t := b.tenants[c.Tenant] - n; t > 0 {
			b.tenants[c.Tenant] = t
		} else {
			delete(b.tenants, c.Tenant)
		}
		b.mu.Unlock()
	}
	b.held.Add(-n)
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

// firstRead is how much of a body is allocated before its bytes arrive:
// a body that declares no more is read in one allocation; a longer one
// grows as its bytes come, so a client that declares a large body and
// sends little holds little memory.
const firstRead = 16 << 10

// The minimum pace of a body that does not arrive with its request's
// head: after bodyRateGrace, at least MinBodyRate bytes a second on
// average since the body began, and never a pause of bodyStall. A body
// slower than that has its connection cut (its read fails), so that a
// client stalling its bodies gives their room in the budget back within
// seconds rather than at the end of the read timeout. 64 KiB/s is far
// below what a service sends over any network it calls idemsvc on, and
// a 2 MiB body may take 33 s at that pace (the read timeout, 30 s by
// default, still bounds it).
const (
	MinBodyRate   = 64 << 10
	bodyRateGrace = time.Second
	bodyStall     = 2 * time.Second
)

// ReadBody reads a body as it arrives, under the budget: its declared
// length (-1 when unknown) is allocated at once only up to firstRead, and
// beyond that the buffer doubles as bytes fill it, up to max+1 bytes
// (the reader is expected to refuse more than max), each allocation taken
// from b for c first (ErrOverBudget when it cannot be). A body that does
// not arrive in its first read is held to MinBodyRate, when ctx is a
// request's of a Server. It returns the body and the bytes taken, which
// the caller gives back (Give, with c) once done with the body, also on
// error (then the body is nil).
func (b *Budget) ReadBody(ctx context.Context, r io.Reader, length, max int64, c Claim) (body []byte, taken int64, err error) {
	size := length
	if size < 0 || size > firstRead {
		size = firstRead
	}
	if err := b.Take(ctx, size, c); err != nil {
		return nil, 0, err
	}
	taken = size
	buf := make([]byte, 0, size)
	var pace *bodyPace
	defer func() {
		if pace != nil {
			pace.end()
		}
	}()
	for reads := 0; int64(len(buf)) != length; reads++ {
		if len(buf) == cap(buf) {
			grown := int64(2 * cap(buf))
			if length > 0 {
				grown = min(grown, length)
			} else {
				grown = min(grown, max+1)
			}
			if grown <= int64(cap(buf)) { // a reader that does not stop at max
				grown = int64(2 * cap(buf))
			}
			// The old buffer is garbage once copied: its bytes are
			// given back then.
			if err := b.Take(ctx, grown, c); err != nil {
				return nil, taken, err
			}
			buf = append(make([]byte, 0, grown), buf...)
			b.Give(taken, c)
			taken = grown
		}
		if reads == 1 { // not all there at once: from now on, paced
			pace = startPace(ctx)
		}
		if pace != nil {
			pace.next(int64(len(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, taken, err
		}
	}
	return buf, taken, nil
}

// bodyPace holds a body's reads to MinBodyRate through its connection's
// read deadline, and restores the deadline net/http set when done.
type bodyPace struct {
	c     *conn
	start time.Time
}

func startPace(ctx context.Context) *bodyPace {
	c, _ := ctx.Value(connKey{}).(*conn)
	if c == nil {
		return nil
	}
	return &bodyPace{c: c, start: time.Now()}
}

// next sets the deadline of the read after got bytes.
func (p *bodyPace) next(got int64) {
	deadline := min(p.start.Add(bodyRateGrace+time.Duration(got*int64(time.Second)/MinBodyRate)).UnixNano(),
		time.Now().Add(bodyStall).UnixNano())
	if set := p.c.readDeadline.Load(); set != 0 {
		deadline = min(deadline, set)
	}
	_ = p.c.Conn.SetReadDeadline(time.Unix(0, deadline))
}

func (p *bodyPace) end() {
	var t time.Time
	if set := p.c.readDeadline.Load(); set != 0 {
		t = time.Unix(0, set)
	}
	_ = p.c.Conn.SetReadDeadline(t)
}
