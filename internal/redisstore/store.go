// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/lua"
)

// Options configures a Store. The zero value is ready to use.
type Options struct {
	Limits statemachine.Limits
	// Timeout bounds each operation (default 1s). For it to hold while
	// Redis hangs, the client needs ContextTimeoutEnabled.
	Timeout time.Duration
	// WaitReplicas > 0 acknowledges a transition only once that many
	// replicas of the key's master confirmed it (WAIT, on the connection
	// that ran the script); fewer answer ErrStoreUnavailable.
	WaitReplicas int
	// WaitTimeout bounds WAIT (default 1s); it adds to Timeout.
	WaitTimeout time.Duration
	// AttemptTimeout bounds one try of an operation while Redis fails
	// over (default a quarter of Timeout, at least 100ms; WaitTimeout adds
	// to it): a try that hangs on a failing master is abandoned and the
	// operation tried again within Timeout (see redisfailover.go).
	AttemptTimeout time.Duration
	// AllowEviction keeps an evicting maxmemory-policy from failing
	// Readiness and from refusing begins: the operator accepted that
	// records may be dropped.
	AllowEviction bool
	// MaxInFlight bounds the scripts the store runs at a time (default
	// DefaultMaxInFlight). A call beyond it queues for a slot, up to
	// Timeout; a begin, status or delete that joins a standing queue
	// waits at most ShedTarget, after which it is refused with
	// ErrOverloaded, which is ErrStoreUnavailable and did not take effect
	// (see admission.go). A complete, fail or extend is refused its slot
	// only after Timeout, when Redis cannot take it. Give the client a
	// pool of at least MaxInFlight connections (per node), so that a call
	// admitted never queues for a connection.
	MaxInFlight int
	// ShedInterval is how long the queue for slots must stay non-empty to
	// be standing (default DefaultShedInterval, 100ms).
	ShedInterval time.Duration
	// ShedTarget is the longest a sheddable call waits in a standing queue
	// (default DefaultShedTarget, 5ms).
	ShedTarget time.Duration
	// ReserveBytes is the free memory under maxmemory that a master keeps
	// for the outcomes of the attempts in flight: below it, begins that
	// would acquire on that master fail with ErrNoRoom (see room.go).
	// Zero is DefaultReserveBytes; negative keeps none.
	ReserveBytes int64
	// ProbeKeys are keys outside the records' key space that idemsvc
	// writes through this client (the tenant limits', say) and that no
	// write ever finds: readiness probes the ACL's write permission on
	// each with SET ... XX, which changes nothing.
	ProbeKeys []string
}

// DefaultMaxInFlight is Options.MaxInFlight's default. Measured on 2
// cores (begin on new keys, closed loop, 8 s, two rounds), 20 (go-redis's
// default pool there) refused 60% of the begins at 256 requests in flight
// and 64 refused 10–25%; 128 refused 0.1% there and none at 64 in flight,
// at the same throughput or better.
const DefaultMaxInFlight = 128

// Store keeps records in Redis: one node, Sentinel or Cluster. Every
// transition is one script run on the record's key, in one round trip
// (two commands in one pipeline with WaitReplicas), plus one to load the
// script after Redis lost its script cache.
type Store struct {
	client         redis.UniversalClient
	limits         statemachine.Limits
	timeout        time.Duration
	attemptTimeout time.Duration
	waitReplicas   int
	probeKeys      []string
	waitTimeout    time.Duration
	// suspectUntil is when, in Unix nanoseconds, the store stops bounding
	// tries by attemptTimeout (see retrying).
	suspectUntil atomic.Int64
	scripts      *lua.Scripts // Sharded in a Cluster, else Plain
	watch        *redisWatcher
	// allowEviction: see Options.AllowEviction.
	allowEviction bool
	admission     *admission // the slots of the scripts in flight (MaxInFlight)
	reserve       int64      // Options.ReserveBytes
	// gates are the masters that refuse new attempts (room.go): nil while
	// none does, which is all a begin reads then.
	gates atomic.Pointer[gates]
	room  roomState
}

var _ statemachine.Store = (*Store)(nil)

// New returns a store over client. The client stays the caller's
// to close; it should have ContextTimeoutEnabled, and a ClusterClient
// should be new (see followFailovers).
func New(client redis.UniversalClient, opts Options) *Store {
	s := &Store{
		client:         client,
		limits:         opts.Limits.WithDefaults(),
		timeout:        opts.Timeout,
		attemptTimeout: opts.AttemptTimeout,
		waitReplicas:   opts.WaitReplicas,
		probeKeys:      opts.ProbeKeys,
		waitTimeout:    opts.WaitTimeout,
		scripts:        lua.Plain,
		allowEviction:  opts.AllowEviction,
		reserve:        opts.ReserveBytes,
	}
	switch {
	case s.reserve == 0:
		s.reserve = DefaultReserveBytes
	case s.reserve < 0:
		s.reserve = 0
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	s.admission = newAdmission(opts.MaxInFlight, opts.ShedInterval, opts.ShedTarget)
	if _, ok := client.(*redis.ClusterClient); ok {
		s.scripts = lua.Sharded
	}
	s.watch = newRedisWatcher(client)
	if s.timeout <= 0 {
		s.timeout = time.Second
	}
	if s.attemptTimeout <= 0 {
		s.attemptTimeout = defaultAttemptTimeout(s.timeout)
	}
	if s.waitTimeout <= 0 {
		s.waitTimeout = time.Second
	}
	if s.waitReplicas > 0 {
		s.timeout += s.waitTimeout
		s.attemptTimeout += s.waitTimeout
	}
	followFailovers(client)
	return s
}

// The reply codes of the scripts (internal/lua/record.lua).
const (
	codeOK = iota
	codeBusy
	codeDone
	codeMismatch
	codeLeaseLost
	codeNotFound
	codeRefused
	codeUnread
)

// reply is a decoded script reply: {code, now_ms, record}.
type reply struct {
	code int64
	now  int64
	rec  statemachine.Stored // when the script sent one
	// raw is the record as sent, and size its whole length when the
	// script said it: longer than raw, raw is its head only (see
	// readResponse).
	raw  string
	size int64
}

// Limits implements statemachine.Store.
func (s *Store) Limits() statemachine.Limits { return s.limits }

// Begin implements statemachine.Store; see internal/lua/begin.lua. On a master that
// keeps no room for new attempts (room.go) it acquires nothing, and fails
// with ErrNoRoom or ErrEvicting where it would have acquired.
func (s *Store) Begin(ctx context.Context, tenant string, req statemachine.BeginRequest) (statemachine.BeginResult, error) {
	c, err := s.beginCall(ctx, tenant, &req)
	if err != nil {
		return statemachine.BeginResult{}, err
	}
	for read := 1; ; read++ {
		r, err := s.run(ctx, "begin", !req.Waited, c.script, c.key, c.args...)
		if err != nil {
			return statemachine.BeginResult{}, err
		}
		if err := s.readResponse(ctx, c.key, &r); err != nil {
			if errors.Is(err, errRecordChanged) && read < maxReads {
				continue // begin again: the record is another now
			}
			return statemachine.BeginResult{}, err
		}
		return c.beginResult(tenant, &r)
	}
}

// scriptCall is one script run on one key, and how to read its reply.
type scriptCall struct {
	script  *redis.Script
	key     string
	args    []any
	refusal error // Begin: why the key's master refuses new attempts, if it does
	maxBody int   // Begin: the size a replayed body may decode to
	stream  bool  // Begin: a long compressed body is replayed compressed (BeginRequest.StreamedBody)
	stored  int64 // Complete, Fail: what the response counts against stored_bytes (StoredSize)
}

// beginCall checks req and builds its script call.
func (s *Store) beginCall(ctx context.Context, tenant string, req *statemachine.BeginRequest) (scriptCall, error) {
	lease, retention, tok, err := s.limits.CheckBegin(tenant, req)
	if err != nil {
		return scriptCall{}, err
	}
	key := Key(tenant, req.Key)
	noAcquire, noReplay := "", ""
	refusal := s.refusal(ctx, key) // the key's master keeps no room, or may evict
	if req.NoAcquire || refusal != nil {
		noAcquire = "1"
	}
	if req.NoReplay {
		noReplay = "1"
	}
	if req.NoAcquire {
		// A tenant over its own limits gets their error (429), which
		// says when to come back, rather than the master's refusal.
		refusal = nil
	}
	return scriptCall{script: s.scripts.Begin, key: key, refusal: refusal, maxBody: s.limits.MaxResponseBytes, stream: req.StreamedBody, args: []any{
		string(tok[:]), req.Owner, req.Fingerprint, lease.Milliseconds(), int64(retention / time.Second), req.Key, noAcquire, noReplay,
	}}, nil
}

// beginResult reads a begin script's reply.
func (c *scriptCall) beginResult(tenant string, r *reply) (statemachine.BeginResult, error) {
	if r.code == codeRefused && c.refusal != nil {
		return statemachine.BeginResult{}, c.refusal
	}
	switch r.code {
	case codeOK:
		return statemachine.Acquired(tenant, &r.rec, r.now)
	case codeDone:
		if c.stream {
			return statemachine.ReplayStreamed(tenant, &r.rec, r.now, c.maxBody)
		}
		return statemachine.Replay(tenant, &r.rec, r.now, c.maxBody)
	case codeBusy:
		return statemachine.BeginResult{}, statemachine.Busy(&r.rec, r.now)
	}
	return statemachine.BeginResult{}, r.err("begin")
}

// Complete implements statemachine.Store; see internal/lua/complete.lua.
func (s *Store) Complete(ctx context.Context, tenant string, req statemachine.CompleteRequest) (statemachine.Record, error) {
	c, err := s.completeCall(tenant, &req)
	if err != nil {
		return statemachine.Record{}, err
	}
	r, err := s.run(ctx, "complete", false, c.script, c.key, c.args...)
	return c.finished(tenant, "complete", r, err)
}

// completeCall checks req and builds its script call.
func (s *Store) completeCall(tenant string, req *statemachine.CompleteRequest) (scriptCall, error) {
	tok, err := s.limits.CheckFinish(tenant, req.Key, req.Token, req.Retention, &req.Response, "")
	if err != nil {
		return scriptCall{}, err
	}
	form := statemachine.EncodeResponse(&req.Response, s.limits.CompressBodiesFrom)
	return scriptCall{script: s.scripts.Complete, key: Key(tenant, req.Key), stored: statemachine.StoredSize(form, &req.Response), args: []any{
		string(tok[:]), form, retentionArg(req.Retention),
	}}, nil
}

// Fail implements statemachine.Store; see internal/lua/fail.lua.
func (s *Store) Fail(ctx context.Context, tenant string, req statemachine.FailRequest) (statemachine.Record, error) {
	c, err := s.failCall(tenant, &req)
	if err != nil {
		return statemachine.Record{}, err
	}
	r, err := s.run(ctx, "fail", false, c.script, c.key, c.args...)
	return c.finished(tenant, "fail", r, err)
}

// failCall checks req and builds its script call.
func (s *Store) failCall(tenant string, req *statemachine.FailRequest) (scriptCall, error) {
	tok, err := s.limits.CheckFinish(tenant, req.Key, req.Token, req.Retention, &req.Response, req.Error)
	if err != nil {
		return scriptCall{}, err
	}
	retryable := "0"
	if req.Retryable {
		retryable = "1"
	}
	form := statemachine.EncodeResponse(&req.Response, s.limits.CompressBodiesFrom)
	return scriptCall{script: s.scripts.Fail, key: Key(tenant, req.Key), stored: statemachine.StoredSize(form, &req.Response), args: []any{
		string(tok[:]), retryable, req.Error, form, retentionArg(req.Retention),
	}}, nil
}

// finished reads the reply of a complete or fail script: the record, with
// the bytes its response takes as stored.
func (c *scriptCall) finished(tenant, op string, r reply, err error) (statemachine.Record, error) {
	if err != nil {
		return statemachine.Record{}, err
	}
	if r.code != codeOK {
		return statemachine.Record{}, r.err(op)
	}
	rec, err := r.rec.Record(tenant, r.now, false, 0)
	rec.StoredBytes = c.stored
	return rec, err
}

// Extend implements statemachine.Store; see internal/lua/extend.lua.
func (s *Store) Extend(ctx context.Context, tenant string, req statemachine.ExtendRequest) (statemachine.Lease, error) {
	tok, lease, err := s.limits.CheckExtend(tenant, &req)
	if err != nil {
		return statemachine.Lease{}, err
	}
	var call [8]byte
	rand.Read(call[:])
	r, err := s.run(ctx, "extend", false, s.scripts.Extend, Key(tenant, req.Key),
		string(tok[:]), string(call[:]), lease.Milliseconds())
	if err != nil {
		return statemachine.Lease{}, err
	}
	if r.code != codeOK {
		return statemachine.Lease{}, r.err("extend")
	}
	return r.rec.Lease(), nil
}

// Status implements statemachine.Store; see internal/lua/status.lua.
func (s *Store) Status(ctx context.Context, tenant, key string, withResponse bool) (statemachine.Record, error) {
	if err := s.limits.CheckKey(tenant, key); err != nil {
		return statemachine.Record{}, err
	}
	rk := Key(tenant, key)
	for read := 1; ; read++ {
		r, err := s.run(ctx, "status", true, s.scripts.Status, rk)
		if err != nil {
			return statemachine.Record{}, err
		}
		if r.code != codeOK {
			return statemachine.Record{}, r.err("status")
		}
		if withResponse {
			if err := s.readResponse(ctx, rk, &r); err != nil {
				if errors.Is(err, errRecordChanged) && read < maxReads {
					continue
				}
				return statemachine.Record{}, err
			}
		}
		if withResponse && statemachine.StreamedBodies(ctx) {
			return r.rec.RecordStreamed(tenant, r.now, s.limits.MaxResponseBytes)
		}
		return r.rec.Record(tenant, r.now, withResponse, s.limits.MaxResponseBytes)
	}
}

// Delete implements statemachine.Store; see internal/lua/delete.lua.
func (s *Store) Delete(ctx context.Context, tenant, key string) error {
	if err := s.limits.CheckKey(tenant, key); err != nil {
		return err
	}
	_, err := s.run(ctx, "delete", true, s.scripts.Delete, Key(tenant, key))
	return err
}

// Ping implements statemachine.Store: it pings every master (for a Cluster) or the one node.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if c, ok := s.client.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, shard *redis.Client) error {
			return shard.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("%w: ping: %w", statemachine.ErrStoreUnavailable, err)
	}
	return nil
}

// run runs script on key and decodes its reply. Any failure to get a reply
// is ErrStoreUnavailable: the script may or may not have run.
func (s *Store) run(ctx context.Context, op string, shed bool, script *redis.Script, key string, args ...any) (reply, error) {
	if err := s.admission.acquire(ctx, shed, s.timeout); err != nil {
		return reply{}, fmt.Errorf("%s: %w", op, err)
	}
	defer s.admission.release()
	ctx, cancel := context.WithTimeout(ctx, s.timeout) // the wait for a slot aside
	defer cancel()
	keys := []string{key}
	var cmd *redis.Cmd
	err := s.retrying(ctx, func(ctx context.Context) error {
		if s.waitReplicas == 0 {
			cmd = script.Run(ctx, s.client, keys, args...)
			return cmd.Err()
		}
		err := s.pipelineWithWait(ctx, key, func(p redis.Pipeliner) redis.Cmder {
			cmd = script.EvalSha(ctx, p, keys, args...)
			return cmd
		})
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			err = s.pipelineWithWait(ctx, key, func(p redis.Pipeliner) redis.Cmder {
				cmd = script.Eval(ctx, p, keys, args...)
				return cmd
			})
		}
		return err
	})
	if err != nil {
		return reply{}, fmt.Errorf("%w: %s: %w", statemachine.ErrStoreUnavailable, op, err)
	}
	r, err := decodeReply(cmd.Val())
	if err != nil {
		return reply{}, fmt.Errorf("statemachine: %s: %w", op, err)
	}
	return r, nil
}

// pipelineWithWait sends one command and WAIT in one pipeline on the
// connection of key's master, so that WAIT counts that command's write. In a
// Cluster the master is the one the slot map names; retrying reloads the
// map after a redirect or a failure.
func (s *Store) pipelineWithWait(ctx context.Context, key string, send func(redis.Pipeliner) redis.Cmder) error {
	cluster, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return s.sendWithWait(ctx, s.client, send)
	}
	master, err := cluster.MasterForKey(ctx, key)
	if err != nil {
		return err
	}
	return s.sendWithWait(ctx, master, send)
}

// errTooFewReplicas is WAIT's answer when fewer replicas than asked confirmed.
var errTooFewReplicas = errors.New("too few replicas confirmed the write")

// sendWithWait pipelines send's command and WAIT on node's connection.
func (s *Store) sendWithWait(ctx context.Context, node redis.Cmdable, send func(redis.Pipeliner) redis.Cmder) error {
	var cmd redis.Cmder
	var wait *redis.Cmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = send(p)
		wait = p.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
		return nil
	})
	if cmd.Err() != nil {
		return cmd.Err()
	}
	if err != nil {
		return err
	}
	n, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("WAIT: %w", err)
	}
	if n < int64(s.waitReplicas) {
		return fmt.Errorf("WAIT: %w: %d of %d within %s", errTooFewReplicas, n, s.waitReplicas, s.waitTimeout)
	}
	return nil
}

// decodeReply checks the shape of a script's reply: {code, now_ms[, record]}.
func decodeReply(v any) (reply, error) {
	var r reply
	parts, ok := v.([]any)
	if !ok || len(parts) < 2 || len(parts) > 4 {
		return r, fmt.Errorf("unexpected script reply %T of %d parts", v, len(parts))
	}
	if r.code, ok = parts[0].(int64); !ok {
		return r, fmt.Errorf("unexpected reply code %T", parts[0])
	}
	if r.now, ok = parts[1].(int64); !ok {
		return r, fmt.Errorf("unexpected reply time %T", parts[1])
	}
	switch r.code {
	case codeOK, codeBusy, codeDone:
		if len(parts) < 3 {
			return r, fmt.Errorf("reply code %d without a record", r.code)
		}
		raw, ok := parts[2].(string)
		if !ok {
			return r, fmt.Errorf("unexpected reply record %T", parts[2])
		}
		var err error
		if r.rec, err = statemachine.DecodeStored(raw); err != nil {
			return r, err
		}
		r.raw = raw
		if len(parts) == 4 {
			if r.size, ok = parts[3].(int64); !ok {
				return r, fmt.Errorf("unexpected reply size %T", parts[3])
			}
		}
	case codeMismatch, codeLeaseLost, codeNotFound, codeRefused, codeUnread:
	default:
		return r, fmt.Errorf("unknown reply code %d", r.code)
	}
	return r, nil
}

// err returns the error of a reply code that is not a success of op.
func (r *reply) err(op string) error {
	switch r.code {
	case codeMismatch:
		return statemachine.ErrFingerprintMismatch
	case codeLeaseLost:
		return statemachine.ErrLeaseLost
	case codeNotFound:
		return statemachine.ErrNotFound
	case codeRefused:
		return statemachine.ErrAcquireRefused
	case codeUnread:
		return statemachine.ErrReplayRefused
	}
	return fmt.Errorf("statemachine: %s: unexpected reply code %d", op, r.code)
}

// retentionArg is ARGV's retention: seconds, or "" to keep the record's.
func retentionArg(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return strconv.FormatInt(int64(d/time.Second), 10)
}

// Shed is the number of calls refused so far with ErrOverloaded.
func (s *Store) Shed() uint64 { return s.admission.shed.Load() }

// InFlight is the number of scripts running now.
func (s *Store) InFlight() int { return len(s.admission.slots) }

// Queued is the number of calls waiting for a slot now.
func (s *Store) Queued() int {
	s.admission.mu.Lock()
	defer s.admission.mu.Unlock()
	return s.admission.queued
}
