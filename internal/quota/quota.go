// SPDX-License-Identifier: Apache-2.0

// Package quota enforces the tenants' limits at begin: the begin rate and
// burst, the stored-bytes budget, the concurrent waiters and the attempts
// held at once (in_progress). Over Redis
// (NewRedis) the limits hold across every idemsvc instance sharing it; the
// in-memory store gets the same behaviour in this process (NewMemory).
//
// Only begin is ever refused. Complete and fail only report what they
// stored (Stored): once an operation ran, its outcome must be stored or its
// next duplicate would run it again.
package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/cowmap"
)

// The errors of a refused begin, tested with errors.Is; each comes as an
// *Error with its limit and when to retry.
var (
	// ErrRateLimited: over the begin rate, the concurrent waiters or the
	// attempts in progress.
	ErrRateLimited = errors.New("quota: rate limited")
	// ErrQuotaExceeded: over the stored-bytes budget, for a begin that
	// would acquire.
	ErrQuotaExceeded = errors.New("quota: quota exceeded")
)

// The limits, as the tenants file and the metrics name them.
const (
	LimitRate        = "begins_per_s"
	LimitStoredBytes = "stored_bytes"
	LimitWaiters     = "waiters"
	LimitInProgress  = "in_progress"
	LimitReadBytes   = "read_bytes_per_s"
	// LimitReadsInFlight: large stored responses a tenant has in flight
	// on one instance (IDEMSVC_READS_IN_FLIGHT), which the handlers
	// bound.
	LimitReadsInFlight = "reads_in_flight"
)

// Error is a begin refused for a limit.
type Error struct {
	Limit      string        // LimitRate, LimitStoredBytes, LimitWaiters, LimitInProgress or LimitReadBytes
	Detail     string        // says which limit, without internals
	RetryAfter time.Duration // when a retry is worth making; at least 1 s
}

func (e *Error) Error() string { return "quota: " + e.Detail }

// Is makes errors.Is(err, ErrRateLimited) or ErrQuotaExceeded hold.
func (e *Error) Is(target error) bool {
	if e.Limit == LimitStoredBytes {
		return target == ErrQuotaExceeded
	}
	return target == ErrRateLimited
}

// Limiter is what the handlers use.
type Limiter interface {
	// Begin admits a begin of tenant under its limits l, or refuses it with
	// an *Error. overBudget says the tenant is over its stored-bytes
	// budget: the begin must then acquire nothing (only replay), and Refused
	// makes the error when it would have.
	Begin(ctx context.Context, tenant string, l auth.Quota) (overBudget bool, err error)
	// Refused is the error of a begin refused because it would acquire
	// while the tenant is over its stored-bytes budget.
	Refused(tenant string, l auth.Quota) error
	// Stored counts bytes that a complete or terminal fail stored, until
	// expires (the end of the record's retention).
	Stored(tenant string, bytes int64, expires time.Time)
	// Wait counts a begin that is about to wait up to d on an attempt in
	// progress, or refuses it with an *Error over the waiters limit. Call
	// done when the wait is over.
	Wait(ctx context.Context, tenant string, l auth.Quota, d time.Duration) (done func(), err error)
	// Hold counts the lease that a begin of tenant is about to acquire,
	// for up to d, if the tenant holds fewer than its in_progress limit,
	// and gives the token the begin must acquire with ("" when nothing
	// was counted: no limit, or the backend could not be reached; the
	// store then picks the token). false: the tenant holds that many
	// already, and the begin must acquire nothing (HoldRefused makes the
	// error when it would have). Call Held once the begin answered, with
	// a token given.
	Hold(ctx context.Context, tenant string, l auth.Quota, d time.Duration) (token string, ok bool)
	// HoldAll is Hold for each of holds, in order: tokens[i] and ok[i] are
	// holds[i]'s answer.
	HoldAll(ctx context.Context, holds []Hold) (tokens []string, ok []bool)
	// Held settles the lease of token: acquired or extended, it is counted
	// until ends; completed, failed or not acquired (ends zero), it is over.
	// The store hears of it with the next flush.
	Held(tenant string, l auth.Quota, token string, ends time.Time)
	// HoldRefused is the error of a begin refused because it would acquire
	// while the tenant holds its in_progress limit.
	HoldRefused(tenant string, l auth.Quota) error
	// CanRead reports whether tenant may read a stored response now: not
	// while its reads took more than its read budget (ReadRefused makes
	// the error then). A read is admitted before its size is known, and
	// counted after with Read, so one read may take the budget below
	// zero: the reads after it wait until it is paid back.
	CanRead(tenant string, l auth.Quota) bool
	// Read counts a stored response of n bytes that tenant read.
	Read(tenant string, l auth.Quota, n int64)
	// ReadRefused is the error of a read refused for the read budget.
	ReadRefused(tenant string, l auth.Quota) error
	// ReadsInFlightRefused counts a large read of tenant refused because
	// the tenant had its large answers in flight on this instance
	// (IDEMSVC_READS_IN_FLIGHT, which the handlers bound).
	ReadsInFlightRefused(tenant string)
	// TenantLabel is tenant's label in metrics: its name, or OtherTenant
	// past MaxTenantLabels tenants. The handlers' series use it too, so
	// that a tenant has the same label in all of them.
	TenantLabel(tenant string) string
	// Known creates the rejection counters of tenants at zero, so that a
	// rate over them sees the first rejection.
	Known(tenants ...string)
	// Usage is tenant's usage now: its stored bytes, waiters and leases
	// held as the backend counts them (shared by every instance), and the
	// begins this instance refused since it started, by limit.
	Usage(ctx context.Context, tenant string) (Usage, error)
	// Close stops the background flushes and flushes what is pending.
	Close()
	// Collector exports idemsvc_limit_rejections_total{tenant,limit} and
	// idemsvc_stored_bytes{tenant}.
	prometheus.Collector
}

// backend keeps the counts that the instances share: in Redis, or in this
// process.
type backend interface {
	// take takes up to n begins of tenant's rate; with none left it says
	// when one will be.
	take(ctx context.Context, tenant string, l auth.Quota, n int) (got int, retryAfter time.Duration, err error)
	// addBytes adds deltas to tenant's stored bytes and returns the total
	// still retained and when the earliest of it expires.
	addBytes(ctx context.Context, tenant string, deltas map[int64]int64) (total int64, firstExpiry time.Time, err error)
	// addSlots counts the members ids in tenant's set (setWaiters,
	// setLeases) for up to ttl, as many as the set has room for under
	// limit: got, the first got of ids. A member counted already stays
	// counted without taking room. removeSlot uncounts one.
	addSlots(ctx context.Context, tenant, set string, ids []string, limit int64, ttl time.Duration) (got int, err error)
	removeSlot(ctx context.Context, tenant, set, id string) error
	// countSlots counts the members of tenant's set not over yet.
	countSlots(ctx context.Context, tenant, set string) (int64, error)
	// settleLeases moves each lease of tenant still counted to end at the
	// given Unix ms, or uncounts it for 0.
	settleLeases(ctx context.Context, tenant string, ends map[string]int64) error
}

// Hold is one lease a begin is about to acquire, for HoldAll: Hold's
// arguments.
type Hold struct {
	Tenant string
	Limits auth.Quota
	D      time.Duration
}

// The bounded sets of a tenant.
const (
	setWaiters = "waiters"
	setLeases  = "leases"
)

// Options tune a Limiter. Zero values take the defaults.
type Options struct {
	Logger *slog.Logger
	// FlushInterval is how often each tenant's stored-bytes deltas are sent
	// and its total read back (default 1 s).
	FlushInterval time.Duration
	// RateBatch bounds how many begins of rate an instance takes from the
	// shared limiter at once and then spends locally (default 64; 1 takes
	// each begin's in its own call). Measured with LIMITS=1
	// benchmarks/http-load.sh: a Redis call per begin cost about 30% of the
	// begin throughput (+38% idemsvc and +70% Redis CPU per begin), the
	// batches about 1%, inside the contract's 10%.
	RateBatch int
	// Timeout bounds each call to the backend (default 1 s).
	Timeout time.Duration
	// NewToken makes a lease token in the store's form, for the leases
	// an instance reserves ahead of its begins (default: 16 random bytes
	// in lower-case hex, statemachine.NewToken's form).
	NewToken func() string
}

// Defaults of Options.
const (
	DefaultFlushInterval = time.Second
	DefaultRateBatch     = 64
	DefaultTimeout       = time.Second
	// rateBatchTime is how many batches a second of a tenant's rate makes
	// at least: a batch is at most 50 ms worth, so that the begins the
	// instances hold but have not spent are a small part of any window
	// (with 3 instances at most 150 ms of the rate: 1.5% of the contract's
	// 10 s window, against its 10% margin).
	rateBatchTime = 20
	// localTokenTTL is how long an instance may hold a batch before it
	// spends it: tokens are not saved up across idle time. The same holds
	// for the leases it reserves: those unused after it are given back at
	// the next flush.
	localTokenTTL = time.Second
	// leaseBatchShare: an instance reserves at most 1/leaseBatchShare of a
	// tenant's in_progress at once (and at most RateBatch, and no more
	// than a twentieth of a second of its begin rate), so that the leases
	// reserved and not yet used on the other instances refuse few begins
	// the limit would admit.
	leaseBatchShare = 16
	// waiterMargin keeps a waiter counted a little past its wait, to be
	// safe, and drops it once that is over if its instance died.
	waiterMargin = 5 * time.Second
	// leaseMargin keeps a lease counted past its end as the record's store
	// gave it: the tenant's set and the record may be on two masters with
	// clocks apart, and an extend reaches the set at the next flush.
	leaseMargin = 5 * time.Second
	// maxQuotaRetryAfter caps the Retry-After of quota-exceeded, which is
	// when the earliest of the tenant's stored bytes expire: a budget
	// raised in the tenants file frees the tenant sooner than that.
	maxQuotaRetryAfter = time.Hour
	// bucketMs is the width of an expiry bucket of stored bytes: a
	// record's bytes count until the end of the minute it expires in.
	bucketMs = 60_000
	// DefaultReadBytesPerS is the read budget of a tenant without
	// read_bytes_per_s, on each instance: 16 replays of a 1 MiB response
	// a second, measured at about 4.5 ms of idemsvc's CPU each (7% of a
	// core), or 16,384 small ones. A read counts at least minReadBytes,
	// so that the budget also bounds many small reads.
	DefaultReadBytesPerS = 16 << 20
	minReadBytes         = 1024
)

// limiter is the Limiter over a backend; the backends differ only in where
// the counts live.
type limiter struct {
	backend  backend
	log      *slog.Logger
	batch    int
	timeout  time.Duration
	interval time.Duration
	metrics  *metrics
	newToken func() string
	// reserveTTL is how long a reserved lease counts in the backend before
	// the flush moves it: past the time an instance may hand it out
	// (localTokenTTL) and the flush that follows, with room for a slow one.
	reserveTTL time.Duration

	tenants cowmap.Map[string, *tenantState] // by tenant name; read on every begin

	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

// tenantState is what this instance knows of one tenant.
type tenantState struct {
	// rate: begins taken from the shared limiter, not yet spent.
	rateLock     chan struct{} // one fetch from the backend at a time
	mu           sync.Mutex
	tokens       int
	tokensExpire time.Time
	deniedUntil  time.Time // no begin is left before then: refuse without asking
	scarce       bool      // the last fetch got less than it asked: ask for one

	// stored bytes: the total the backend last gave, and the deltas of this
	// instance not sent yet.
	total       int64
	firstExpiry time.Time
	pending     map[int64]int64 // expiry minute -> bytes
	pendingSum  int64
	active      bool // begun since the last flush: refresh its total

	// leases: token -> Unix ms its lease ends (0: over), not sent yet.
	leases map[string]int64
	// leases reserved in the backend and not yet handed to a begin,
	// reserved at poolAt; one reservation at a time (leaseLock). leaseGen
	// counts the reservations, leaseFull says the last found the tenant
	// at its limit, leaseScarce that it got less than it asked.
	leaseLock   chan struct{}
	pool        []string
	poolAt      time.Time
	leaseGen    uint64
	leaseFull   bool
	leaseScarce bool

	// reads: the read budget left (bytes; below zero, owed), as of readAt.
	readLeft float64
	readAt   time.Time

	labels tenantMetrics
	// rejected counts the refusals of this instance by limit (the
	// metrics' counters may be shared with other tenants past
	// MaxTenantLabels).
	rejected rejections
}

// rejections count refusals by limit.
type rejections struct {
	rate, storedBytes, waiters, inProgress, reads atomic.Int64
}

// Usage is one tenant's usage, as the console and GET /v1/usage show it.
type Usage struct {
	// StoredBytes, Waiters and InProgress are the backend's counts, shared
	// by every instance (InProgress is counted only for a tenant with an
	// in_progress limit).
	StoredBytes, Waiters, InProgress int64
	// Rejections are this instance's refusals since it started, by limit
	// (LimitRate...).
	Rejections map[string]int64
}

// Usage implements Limiter. On an error from the backend, the Usage
// returned still holds this instance's Rejections. StoredBytes is the
// backend's count: this instance's changes not yet flushed are not in it
// (it lags at most one flush interval).
func (l *limiter) Usage(ctx context.Context, tenant string) (Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	// This instance's rejections first: they are given even when the
	// backend's counts cannot be read.
	u := Usage{Rejections: map[string]int64{LimitRate: 0, LimitStoredBytes: 0, LimitWaiters: 0, LimitInProgress: 0, LimitReadBytes: 0}}
	if v, ok := l.tenants.Load(tenant); ok {
		r := &v.rejected
		u.Rejections[LimitRate] = r.rate.Load()
		u.Rejections[LimitStoredBytes] = r.storedBytes.Load()
		u.Rejections[LimitWaiters] = r.waiters.Load()
		u.Rejections[LimitInProgress] = r.inProgress.Load()
		u.Rejections[LimitReadBytes] = r.reads.Load()
	}
	var err error
	if u.StoredBytes, _, err = l.backend.addBytes(ctx, tenant, nil); err != nil {
		return u, err
	}
	if u.Waiters, err = l.backend.countSlots(ctx, tenant, setWaiters); err != nil {
		return u, err
	}
	if u.InProgress, err = l.backend.countSlots(ctx, tenant, setLeases); err != nil {
		return u, err
	}
	return u, nil
}

func newLimiter(b backend, opts Options) *limiter {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.RateBatch <= 0 {
		opts.RateBatch = DefaultRateBatch
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.NewToken == nil {
		opts.NewToken = newToken
	}
	l := &limiter{
		reserveTTL: localTokenTTL + 2*opts.FlushInterval + 2*opts.Timeout + leaseMargin,
		backend:    b,
		log:        opts.Logger,
		batch:      opts.RateBatch,
		timeout:    opts.Timeout,
		interval:   opts.FlushInterval,
		metrics:    newMetrics(),
		newToken:   opts.NewToken,
		stop:       make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	go l.flushLoop()
	return l
}

func (l *limiter) tenant(name string) *tenantState {
	if ts, ok := l.tenants.Load(name); ok {
		return ts
	}
	ts, _ := l.tenants.LoadOrStore(name, &tenantState{rateLock: make(chan struct{}, 1), leaseLock: make(chan struct{}, 1), labels: l.metrics.forTenant(name)})
	return ts
}

// Known implements Limiter. Only the counters are made: a tenant's state,
// and its stored bytes, wait for its first call.
func (l *limiter) Known(tenants ...string) {
	for _, t := range tenants {
		for _, limit := range []string{LimitRate, LimitStoredBytes, LimitWaiters, LimitInProgress, LimitReadBytes, LimitReadsInFlight} {
			l.metrics.rejections.WithLabelValues(t, limit)
		}
	}
}

// Describe implements prometheus.Collector.
func (l *limiter) Describe(ch chan<- *prometheus.Desc) {
	l.metrics.rejections.Describe(ch)
	l.metrics.storedBytes.Describe(ch)
}

// Collect implements prometheus.Collector.
func (l *limiter) Collect(ch chan<- prometheus.Metric) {
	l.metrics.rejections.Collect(ch)
	l.metrics.storedBytes.Collect(ch)
}

// Begin implements Limiter.
func (l *limiter) Begin(ctx context.Context, tenant string, lim auth.Quota) (bool, error) {
	if lim.BeginsPerS == 0 && lim.StoredBytes == 0 {
		return false, nil
	}
	ts := l.tenant(tenant)
	// The common case, under one lock: a begin of the batch in hand.
	ts.mu.Lock()
	if lim.BeginsPerS == 0 || ts.tokens > 0 && time.Now().Before(ts.tokensExpire) {
		if lim.BeginsPerS > 0 {
			ts.tokens--
		}
		over := ts.overBudget(lim)
		ts.mu.Unlock()
		return over, nil
	}
	ts.mu.Unlock()
	if err := l.takeRate(ctx, tenant, ts, lim); err != nil {
		ts.labels.rejectedRate.Inc()
		ts.rejected.rate.Add(1)
		return false, err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.overBudget(lim), nil
}

// overBudget reports whether the tenant is over its stored-bytes budget as
// far as this instance knows, and marks it for a refresh at the next
// flush. The caller holds ts.mu.
func (ts *tenantState) overBudget(lim auth.Quota) bool {
	if lim.StoredBytes == 0 {
		return false
	}
	ts.active = true
	return ts.total+ts.pendingSum >= lim.StoredBytes
}

// takeRate spends one begin of the tenant's rate. The instance takes the
// begins from the shared limiter in batches and spends them here, so that
// a begin costs the shared limiter a call only once per batch. That can
// only admit fewer begins than the limit, never more: a batch taken is gone
// from the shared limit, whether or not this instance spends it all.
//
// While the tenant is at its limit, the instance asks for one begin at a
// time (and, refused, asks no more until the limiter says one is due):
// redis_rate's AllowAtMost charges the fraction of a begin it cannot grant,
// so batches asked of a nearly empty limit would waste part of the rate.
func (l *limiter) takeRate(ctx context.Context, tenant string, ts *tenantState, lim auth.Quota) error {
	if l.batch == 1 {
		return l.takeOne(ctx, tenant, lim)
	}
	for {
		ts.mu.Lock()
		now := time.Now()
		if ts.tokens > 0 && now.Before(ts.tokensExpire) {
			ts.tokens--
			ts.mu.Unlock()
			return nil
		}
		if now.Before(ts.deniedUntil) {
			wait := ts.deniedUntil.Sub(now)
			ts.mu.Unlock()
			return rateError(lim, wait)
		}
		ts.mu.Unlock()

		// One fetch at a time per tenant; the others wait for its batch.
		select {
		case ts.rateLock <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		ts.mu.Lock()
		refill := ts.tokens == 0 || !time.Now().Before(ts.tokensExpire)
		ts.mu.Unlock()
		if !refill {
			<-ts.rateLock
			continue // another fetched a batch meanwhile
		}
		n := 1
		if !ts.scarce {
			n = l.batchFor(lim)
		}
		cctx, cancel := context.WithTimeout(ctx, l.timeout)
		got, retryAfter, err := l.backend.take(cctx, tenant, lim, n)
		cancel()
		now = time.Now()
		ts.mu.Lock()
		switch {
		case err != nil:
			// The shared limiter cannot be reached: the begin goes on to
			// the store, which answers 503 if it cannot be reached either.
			ts.mu.Unlock()
			<-ts.rateLock
			l.log.Warn("quota: begin rate not checked", "tenant", tenant, "error", err.Error())
			return nil
		case got == 0:
			ts.scarce = true
			ts.deniedUntil = now.Add(retryAfter)
			ts.mu.Unlock()
			<-ts.rateLock
			return rateError(lim, retryAfter)
		}
		ts.tokens, ts.tokensExpire = got-1, now.Add(localTokenTTL)
		ts.scarce = got < n
		ts.mu.Unlock()
		<-ts.rateLock
		return nil
	}
}

// takeOne asks the shared limiter for this one begin: RateBatch 1, one
// call per begin, made concurrently.
func (l *limiter) takeOne(ctx context.Context, tenant string, lim auth.Quota) error {
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	got, retryAfter, err := l.backend.take(cctx, tenant, lim, 1)
	cancel()
	switch {
	case err != nil:
		l.log.Warn("quota: begin rate not checked", "tenant", tenant, "error", err.Error())
		return nil
	case got == 0:
		return rateError(lim, retryAfter)
	}
	return nil
}

// batchFor is how many begins to take at once: a twentieth of a second's
// worth of the rate, at most the configured batch, at least one.
func (l *limiter) batchFor(lim auth.Quota) int {
	return int(max(1, min(int64(l.batch), lim.BeginsPerS/rateBatchTime)))
}

func rateError(lim auth.Quota, wait time.Duration) error {
	return &Error{Limit: LimitRate, RetryAfter: atLeastASecond(wait),
		Detail: fmt.Sprintf("the tenant is over its begin rate (begins_per_s %d, burst %d)", lim.BeginsPerS, lim.Burst)}
}

// Refused implements Limiter.
func (l *limiter) Refused(tenant string, lim auth.Quota) error {
	ts := l.tenant(tenant)
	ts.labels.rejectedBytes.Inc()
	ts.rejected.storedBytes.Add(1)
	ts.mu.Lock()
	wait := min(time.Until(ts.firstExpiry), maxQuotaRetryAfter)
	ts.mu.Unlock()
	return &Error{Limit: LimitStoredBytes, RetryAfter: atLeastASecond(wait),
		Detail: fmt.Sprintf("the tenant's stored responses are over its budget of %d bytes: begins that would run an operation are refused until some expire; stored outcomes are still replayed", lim.StoredBytes)}
}

// Stored implements Limiter. The bytes are sent with the next flush.
func (l *limiter) Stored(tenant string, bytes int64, expires time.Time) {
	minute := (expires.UnixMilli() + bucketMs - 1) / bucketMs
	ts := l.tenant(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.pending == nil {
		ts.pending = make(map[int64]int64)
	}
	ts.pending[minute] += bytes
	ts.pendingSum += bytes
}

// Wait implements Limiter.
func (l *limiter) Wait(ctx context.Context, tenant string, lim auth.Quota, d time.Duration) (func(), error) {
	if lim.Waiters == 0 {
		return func() {}, nil
	}
	id := newID()
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	got, err := l.backend.addSlots(cctx, tenant, setWaiters, []string{id}, lim.Waiters, d+waiterMargin)
	cancel()
	ok := got == 1
	if err != nil {
		// As for the rate: the store decides whether the begin can go on.
		l.log.Warn("quota: waiters not checked", "tenant", tenant, "error", err.Error())
		return func() {}, nil
	}
	if !ok {
		ts := l.tenant(tenant)
		ts.labels.rejectedWaiters.Inc()
		ts.rejected.waiters.Add(1)
		return nil, &Error{Limit: LimitWaiters, RetryAfter: time.Second,
			Detail: fmt.Sprintf("the tenant has %d begins waiting already, its limit", lim.Waiters)}
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		defer cancel()
		if err := l.backend.removeSlot(ctx, tenant, setWaiters, id); err != nil {
			l.log.Warn("quota: waiter not uncounted; it lapses by itself", "tenant", tenant, "error", err.Error())
		}
	}, nil
}

// Hold implements Limiter. The instance reserves leases in the backend in
// batches, as tokens counted in the tenant's set, and hands one to each
// begin here, so that a begin costs the backend a call only once per
// batch; the flush then moves each token to its lease's end, or removes
// it (see Held), and gives back the tokens not handed out within
// localTokenTTL. A reservation never takes the set past the limit, so the
// leases a tenant holds, with the tokens reserved and not yet used, stay
// within in_progress across every instance; the cost is the other way: a
// begin may be refused while another instance holds unused tokens of the
// same tenant (at most leaseBatchFor each, for at most localTokenTTL and
// one flush).
func (l *limiter) Hold(ctx context.Context, tenant string, lim auth.Quota, d time.Duration) (string, bool) {
	token, ok, _ := l.hold(ctx, tenant, lim, d, 1)
	return token, ok
}

// hold is Hold for a begin with want-1 more of its tenant's begins right
// behind it (a batch): a reservation it makes takes at least want leases,
// and short tells that one it made got fewer than it asked for.
func (l *limiter) hold(ctx context.Context, tenant string, lim auth.Quota, d time.Duration, want int) (token string, ok, short bool) {
	if lim.InProgress == 0 {
		return "", true, false
	}
	ts := l.tenant(tenant)
	for {
		ts.mu.Lock()
		if token, ok := ts.takeLease(d, time.Now()); ok {
			ts.mu.Unlock()
			return token, true, false
		}
		gen := ts.leaseGen
		ts.mu.Unlock()

		// One reservation at a time per tenant; the others wait for its
		// batch.
		select {
		case ts.leaseLock <- struct{}{}:
		case <-ctx.Done():
			return "", true, false // the store call fails on the same context
		}
		token, ok, short, again := l.reserveLeases(ctx, tenant, ts, lim, d, gen, want)
		<-ts.leaseLock
		if !again {
			return token, ok, short
		}
	}
}

// reserveLeases reserves a batch of tenant's leases and takes one for a
// begin, with ts.leaseLock held. gen is the reservations the begin saw
// before it waited for the lock: when one made meanwhile found the tenant
// full, it is refused without a call of its own. again: another begin's
// batch came meanwhile: take from the pool.
func (l *limiter) reserveLeases(ctx context.Context, tenant string, ts *tenantState, lim auth.Quota, d time.Duration, gen uint64, want int) (token string, ok, short, again bool) {
	ts.mu.Lock()
	if len(ts.pool) > 0 && time.Since(ts.poolAt) < localTokenTTL {
		ts.mu.Unlock()
		return "", false, false, true
	}
	if ts.leaseGen != gen && ts.leaseFull {
		ts.mu.Unlock()
		return "", false, false, false
	}
	n := 1
	if !ts.leaseScarce {
		n = l.leaseBatchFor(lim)
	}
	n = max(n, min(want, int(lim.InProgress)))
	ts.mu.Unlock()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = l.newToken()
	}
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	got, err := l.backend.addSlots(cctx, tenant, setLeases, tokens, lim.InProgress, l.reserveTTL)
	cancel()
	now := time.Now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.leaseGen++
	if err != nil {
		// As for the rate: the store decides whether the begin can go on.
		// (A reservation that ran although its reply was lost lapses by
		// itself.)
		ts.leaseFull = false
		l.log.Warn("quota: attempts in progress not checked", "tenant", tenant, "error", err.Error())
		return "", true, false, false
	}
	ts.leaseFull, ts.leaseScarce = got == 0, got < n
	if got == 0 {
		return "", false, true, false
	}
	ts.releasePool() // expired ones, if any
	ts.pool, ts.poolAt = tokens[:got], now
	token, _ = ts.takeLease(d, now)
	return token, true, got < n, false
}

// takeLease hands a reserved lease to a begin that may hold it for up to
// d, if one is left and was reserved less than localTokenTTL ago; an
// expired pool is given back. Until the begin settles it, the lease counts
// for d (sent with the next flush). The caller holds ts.mu.
func (ts *tenantState) takeLease(d time.Duration, now time.Time) (string, bool) {
	if len(ts.pool) == 0 {
		return "", false
	}
	if now.Sub(ts.poolAt) >= localTokenTTL {
		ts.releasePool()
		return "", false
	}
	token := ts.pool[len(ts.pool)-1]
	ts.pool = ts.pool[:len(ts.pool)-1]
	ts.settle(token, now.Add(d+leaseMargin).UnixMilli())
	return token, true
}

// releasePool gives the reserved leases not handed out back at the next
// flush. The caller holds ts.mu.
func (ts *tenantState) releasePool() {
	for _, token := range ts.pool {
		ts.settle(token, 0)
	}
	ts.pool = nil
}

// settle records that token's lease ends at Unix ms ends (0: over), for
// the next flush. The caller holds ts.mu.
func (ts *tenantState) settle(token string, ends int64) {
	if ts.leases == nil {
		ts.leases = make(map[string]int64)
	}
	ts.leases[token] = ends
}

// leaseBatchFor is how many leases to reserve at once: a share of the
// in_progress limit, at most the configured batch and, with a begin rate,
// its batch; at least one.
func (l *limiter) leaseBatchFor(lim auth.Quota) int {
	n := max(1, min(int64(l.batch), lim.InProgress/leaseBatchShare))
	if lim.BeginsPerS > 0 {
		n = min(n, int64(l.batchFor(lim)))
	}
	return int(n)
}

// HoldAll implements Limiter: each hold is Hold's, in order, and a
// tenant's first reservation in the batch is sized to its holds in it, so
// that a batch of begins costs the backend one call per tenant, not one
// per begin; once that call came up short, the tenant's later holds in
// the batch that its pool cannot serve are refused without another.
func (l *limiter) HoldAll(ctx context.Context, holds []Hold) (tokens []string, ok []bool) {
	tokens, ok = make([]string, len(holds)), make([]bool, len(holds))
	left := make(map[string]int, 1)
	for _, h := range holds {
		left[h.Tenant]++
	}
	short := make(map[string]bool, 1)
	for i, h := range holds {
		if short[h.Tenant] {
			tokens[i], ok[i] = l.pooled(h.Tenant, h.Limits, h.D)
		} else {
			var s bool
			tokens[i], ok[i], s = l.hold(ctx, h.Tenant, h.Limits, h.D, left[h.Tenant])
			short[h.Tenant] = s
		}
		left[h.Tenant]--
	}
	return tokens, ok
}

// pooled hands a begin a lease already reserved, without asking the
// backend: false when none is left.
func (l *limiter) pooled(tenant string, lim auth.Quota, d time.Duration) (string, bool) {
	if lim.InProgress == 0 {
		return "", true
	}
	ts := l.tenant(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.takeLease(d, time.Now())
}

// Held implements Limiter.
func (l *limiter) Held(tenant string, lim auth.Quota, token string, ends time.Time) {
	if lim.InProgress == 0 {
		return
	}
	var ms int64
	if !ends.IsZero() {
		ms = ends.Add(leaseMargin).UnixMilli()
	}
	ts := l.tenant(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.settle(token, ms)
}

// HoldRefused implements Limiter.
func (l *limiter) HoldRefused(tenant string, lim auth.Quota) error {
	ts := l.tenant(tenant)
	ts.labels.rejectedInProgress.Inc()
	ts.rejected.inProgress.Add(1)
	return &Error{Limit: LimitInProgress, RetryAfter: time.Second,
		Detail: fmt.Sprintf("the tenant holds %d attempts in progress, its limit (in_progress): a begin that would start another is refused until one completes, fails or its lease expires", lim.InProgress)}
}

// flushLoop sends each tenant's stored-bytes deltas and reads its total
// back, every interval, for tenants that stored or began since the last.
func (l *limiter) flushLoop() {
	defer close(l.stopped)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.flush(false)
		case <-l.stop:
			l.flush(true)
			return
		}
	}
}

// flush sends what each tenant's counts changed by; last gives back every
// reserved lease not handed out (Close), otherwise those reserved too long
// ago.
func (l *limiter) flush(last bool) {
	var names []string
	var states []*tenantState
	l.tenants.Range(func(name string, ts *tenantState) bool {
		names = append(names, name)
		states = append(states, ts)
		return true
	})
	now := time.Now()
	for i, ts := range states {
		ts.mu.Lock()
		if len(ts.pool) > 0 && (last || now.Sub(ts.poolAt) >= localTokenTTL) {
			ts.releasePool()
		}
		deltas, sum, active, leases := ts.pending, ts.pendingSum, ts.active, ts.leases
		ts.pending, ts.pendingSum, ts.active, ts.leases = nil, 0, false, nil
		ts.mu.Unlock()
		if len(leases) > 0 {
			l.settleLeases(names[i], ts, leases)
		}
		if len(deltas) == 0 && !active {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		total, first, err := l.backend.addBytes(ctx, names[i], deltas)
		cancel()
		ts.mu.Lock()
		if err != nil {
			// Keep the deltas for the next flush. A call that ran although
			// its reply was lost counts them twice: more, never less.
			if ts.pending == nil {
				ts.pending = make(map[int64]int64)
			}
			for m, b := range deltas {
				ts.pending[m] += b
			}
			ts.pendingSum += sum
			ts.active = ts.active || active
			ts.mu.Unlock()
			l.log.Warn("quota: stored bytes not flushed; retrying", "tenant", names[i], "error", err.Error())
			continue
		}
		ts.total, ts.firstExpiry = total, first
		ts.mu.Unlock()
		if ts.labels.storedBytes != nil {
			ts.labels.storedBytes.Set(float64(total))
		}
	}
}

// settleLeases sends the lease changes of one flush; on failure they are
// kept for the next, unless a newer change of the same lease came meanwhile.
func (l *limiter) settleLeases(tenant string, ts *tenantState, leases map[string]int64) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	err := l.backend.settleLeases(ctx, tenant, leases)
	cancel()
	if err == nil {
		return
	}
	l.log.Warn("quota: leases in progress not settled; retrying", "tenant", tenant, "error", err.Error())
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.leases == nil {
		ts.leases = leases
		return
	}
	for token, ends := range leases {
		if _, newer := ts.leases[token]; !newer {
			ts.leases[token] = ends
		}
	}
}

// readRate is tenant's read budget per second under lim.
func readRate(lim auth.Quota) float64 {
	if lim.ReadBytesPerS > 0 {
		return float64(lim.ReadBytesPerS)
	}
	return DefaultReadBytesPerS
}

// readLeftNow refills ts's read budget for the time since it was last
// counted, up to a second's worth. The caller holds ts.mu.
func (ts *tenantState) readLeftNow(rate float64, now time.Time) float64 {
	if ts.readAt.IsZero() {
		ts.readLeft = rate
	} else {
		ts.readLeft = min(rate, ts.readLeft+now.Sub(ts.readAt).Seconds()*rate)
	}
	ts.readAt = now
	return ts.readLeft
}

// CanRead implements Limiter. The budget is this instance's: it bounds the
// work reads cost it (and, with every instance's, Redis), without a Redis
// call per read. A token bucket that may go below zero, as a read is
// counted once its size is known: golang.org/x/time/rate cannot take more
// than its burst at once, nor charge after the fact.
func (l *limiter) CanRead(tenant string, lim auth.Quota) bool {
	ts := l.tenant(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.readLeftNow(readRate(lim), time.Now()) > 0
}

// Read implements Limiter.
func (l *limiter) Read(tenant string, lim auth.Quota, n int64) {
	ts := l.tenant(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.readLeftNow(readRate(lim), time.Now())
	ts.readLeft -= float64(max(n, minReadBytes))
}

// ReadRefused implements Limiter.
func (l *limiter) ReadRefused(tenant string, lim auth.Quota) error {
	ts := l.tenant(tenant)
	ts.labels.rejectedReads.Inc()
	ts.rejected.reads.Add(1)
	rate := readRate(lim)
	ts.mu.Lock()
	owed := -ts.readLeftNow(rate, time.Now())
	ts.mu.Unlock()
	return &Error{Limit: LimitReadBytes, RetryAfter: atLeastASecond(time.Duration(owed / rate * float64(time.Second))),
		Detail: fmt.Sprintf("the tenant read stored responses over its read budget (read_bytes_per_s %d on this instance): replays and statuses with the response are refused until it is paid back", int64(rate))}
}

// ReadsInFlightRefused implements Limiter.
func (l *limiter) ReadsInFlightRefused(tenant string) {
	l.tenant(tenant).labels.rejectedReadsInFlight.Inc()
}

// TenantLabel implements Limiter.
func (l *limiter) TenantLabel(tenant string) string { return l.metrics.labels.Of(tenant) }

// Close implements Limiter.
func (l *limiter) Close() {
	l.once.Do(func() { close(l.stop) })
	<-l.stopped
}

func atLeastASecond(d time.Duration) time.Duration {
	return max(time.Second, d)
}
