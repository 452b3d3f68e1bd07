package httpserve

import (
	"context"
	"errors"
	"io"
	"runtime/debug"
	"strings"
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
type Budget struct {
	limit   int64
	copies  int64
	held    atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{} // closed, and replaced, when bytes are given back while some wait
	refused prometheus.Counter
}

// NewBudget is a budget of limit bytes, for requests that each hold
// copies copies of their body at most (the bytes read, and what they are
// decoded or copied into). Its metrics, named with prefix, go to reg
// unless it is nil.
func NewBudget(limit int64, copies int, reg prometheus.Registerer, prefix string) *Budget {
	b := &Budget{limit: limit, copies: int64(max(copies, 1)), freed: make(chan struct{}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "_body_budget_refused_total",
			Help: "Request bodies refused (503) because the bodies held at once were at the budget.",
		})}
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

func (b *Budget) tryTake(n int64) bool {
	n *= b.copies
	for {
		held := b.held.Load()
		if held+n > b.limit {
			return false
		}
		if b.held.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// Take takes n bytes of a body (n times the copies): at once when there is room, else as soon as there
// is, within BudgetWait or until ctx ends; then ErrOverBudget.
func (b *Budget) Take(ctx context.Context, n int64) error {
	if b.tryTake(n) {
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
		if b.tryTake(n) {
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

// Give gives back n bytes taken.
func (b *Budget) Give(n int64) {
	if n == 0 {
		return
	}
	b.held.Add(-n * b.copies)
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

// ReadBody reads a body as it arrives, under the budget: its declared
// length (-1 when unknown) is allocated at once only up to firstRead, and
// beyond that the buffer doubles as bytes fill it, each allocation taken
// from b first (ErrOverBudget when it cannot be). It returns the body and
// the bytes taken, which the caller gives back once done with the body,
// also on error (then the body is nil).
func (b *Budget) ReadBody(ctx context.Context, r io.Reader, length int64) (body []byte, taken int64, err error) {
	size := length
	if size < 0 || size > firstRead {
		size = firstRead
	}
	if err := b.Take(ctx, size); err != nil {
		return nil, 0, err
	}
	taken = size
	buf := make([]byte, 0, size)
	for int64(len(buf)) != length {
		if len(buf) == cap(buf) {
			grown := int64(2 * cap(buf))
			if length > 0 {
				grown = min(grown, length)
			}
			// The old buffer is garbage once copied: its bytes are
			// given back then.
			if err := b.Take(ctx, grown); err != nil {
				return nil, taken, err
			}
			buf = append(make([]byte, 0, grown), buf...)
			b.Give(taken)
			taken = grown
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

// memoryHeadroom is what a process needs beyond its bodies in flight: its
// code, stacks, connections' buffers and the records it encodes.
const memoryHeadroom = 64 << 20

// LimitMemory sets the Go runtime's soft memory limit to the budget plus
// memoryHeadroom, unless GOMEMLIMIT (in env, KEY=value entries) sets one.
// Without it the runtime lets the heap grow to twice what was live at the
// last collection, and the bodies refused or served since are garbage
// counted in the resident set: up to twice the budget. It returns the
// limit in force.
func LimitMemory(budget int64, env []string) int64 {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMEMLIMIT=") {
			return debug.SetMemoryLimit(-1)
		}
	}
	limit := budget + memoryHeadroom
	debug.SetMemoryLimit(limit)
	return limit
}
