// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemsvc/idemsvc/internal/answer"
)

// hotLease is the lease of the hot key: it must outlast the run.
const hotLease = time.Hour

// requestGrace is how long requests may run past the end of the load
// before they are cancelled (and counted as failures). The load has one
// deadline for all its requests rather than a timer for each.
const requestGrace = 30 * time.Second

// The endpoints that the load calls: idemsvc's, and an application's
// idempotent endpoint (pay).
const (
	beginPath    = "/v1/begin"
	completePath = "/v1/complete"
	payPath      = "/pay"
)

// payBody is the request body of pay.
var payBody = []byte(`{"amount":1250,"currency":"EUR"}`)

// warmUpTimeout bounds the warm-up.
const warmUpTimeout = time.Minute

// errGraceOver is the cause of the cancellation of requests that ran more
// than requestGrace past the end.
var errGraceOver = errors.New("the request was still running " + requestGrace.String() + " after the load ended")

// storedBody is the 1 KiB response body the replay keys are completed with,
// and cycleBody the body of a cycle's complete, without --answer-bytes.
var (
	storedBody = strings.Repeat("x", 1024)
	cycleBody  = `{\"order\":\"created\"}`
)

// bench is one run's shared, read-only setup, plus the acquisition tally.
type bench struct {
	cfg    config
	target *target
	prefix string // of every key of this run

	replayBodies [][]byte       // begin bodies of the replay keys
	replayAcq    []atomic.Int32 // acquisitions of each replay key
	replayReply  []byte         // what a replay's reply must contain
	storedBody   string         // the replay keys' body, as a JSON string's content
	cycleBody    string         // a cycle's complete's body, likewise

	hotKey       string
	hotBody      []byte // begin body of the hot key, without an owner
	hotOwnerBody []byte // the same with the holder's owner
	hotToken     string // the holder's lease token
	hotAcq       atomic.Int32

	start time.Time    // of the load
	next  atomic.Int64 // open loop: the next turn to take
}

func newBench(cfg config) *bench {
	var id [6]byte
	rand.Read(id[:])
	b := &bench{
		cfg:    cfg,
		target: newTarget(cfg.url, cfg.apiKey, beginPath, completePath, payPath),
		prefix: "idembench-" + hex.EncodeToString(id[:]) + "-",
	}
	b.hotKey = b.prefix + "hot"
	b.hotBody = []byte(`{"key":"` + b.hotKey + `"}`)
	b.hotOwnerBody = fmt.Appendf(nil, `{"key":%q,"owner":%q,"lease_ms":%d}`, b.hotKey, b.prefix+"holder", hotLease.Milliseconds())
	b.storedBody, b.cycleBody = storedBody, cycleBody
	b.replayReply = []byte(`"body":"` + storedBody + `"`)
	if cfg.answerBytes > 0 {
		quoted, _ := json.Marshal(answer.JSON(cfg.answerBytes, 1))
		b.storedBody = string(quoted[1 : len(quoted)-1])
		b.cycleBody = b.storedBody
		// The start of the answer: letters and quotes, escaped alike by
		// every JSON encoder.
		b.replayReply = []byte(`"body":"` + b.storedBody[:48])
	}
	return b
}

// warmUp checks that the service answers, acquires the hot key and
// completes the replay keys, as far as the mix needs them.
func (b *bench) warmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
	defer cancel()
	w := newWorker(b, -1)
	defer w.conn.close()
	if b.cfg.mix.has(opPay) {
		// An application's endpoint, not idemsvc's.
		status, reply, err := w.post(ctx, payPath, w.payKey(), payBody)
		if err != nil {
			return fmt.Errorf("first pay: %w", err)
		}
		if status != http.StatusCreated {
			return fmt.Errorf("first pay: want 201, got %d: %s", status, snippet(reply))
		}
		return nil
	}
	status, reply, err := w.post(ctx, beginPath, nil, []byte(`{"key":"`+b.prefix+`preflight"}`))
	if err != nil {
		return fmt.Errorf("first begin: %w", err)
	}
	if status == http.StatusUnauthorized {
		return fmt.Errorf("first begin: the service rejected the API key (401); give --api-key or IDEMSVC_API_KEY: %s", snippet(reply))
	}
	if status != http.StatusCreated {
		return fmt.Errorf("first begin: want 201, got %d: %s", status, snippet(reply))
	}
	if b.cfg.mix.has(opHot) {
		status, reply, err := w.post(ctx, beginPath, nil, b.hotOwnerBody)
		if err != nil {
			return fmt.Errorf("warm-up: begin of the hot key: %w", err)
		}
		if status != http.StatusCreated {
			return fmt.Errorf("warm-up: begin of the hot key: want 201, got %d: %s", status, snippet(reply))
		}
		if b.hotToken, err = leaseToken(reply); err != nil {
			return fmt.Errorf("warm-up: begin of the hot key: %w", err)
		}
		b.hotAcq.Store(1)
	}
	if b.cfg.mix.has(opReplay) {
		return b.completeReplayKeys(ctx)
	}
	return nil
}

// completeReplayKeys begins and completes every replay key, with up to
// concurrency calls at a time.
func (b *bench) completeReplayKeys(ctx context.Context) error {
	n := b.cfg.replayKeys
	b.replayBodies = make([][]byte, n)
	b.replayAcq = make([]atomic.Int32, n)
	next := atomic.Int64{}
	errs := make([]error, min(b.cfg.concurrency, n))
	var wg sync.WaitGroup
	for g := range errs {
		wg.Go(func() {
			w := newWorker(b, -1)
			defer w.conn.close()
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := w.completeReplayKey(ctx, i); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// completeReplayKey begins replay key i, completes it with the 1 KiB body,
// and keeps its begin body for the load.
func (w *worker) completeReplayKey(ctx context.Context, i int) error {
	b := w.b
	key := b.replayKey(i)
	b.replayBodies[i] = []byte(`{"key":"` + key + `"}`)
	status, reply, err := w.post(ctx, beginPath, nil, b.replayBodies[i])
	if err == nil && status != http.StatusCreated {
		err = fmt.Errorf("want 201, got %d: %s", status, snippet(reply))
	}
	var token string
	if err == nil {
		token, err = leaseToken(reply)
	}
	if err != nil {
		return fmt.Errorf("warm-up: begin of replay key %d: %w", i, err)
	}
	b.replayAcq[i].Store(1)
	status, reply, err = w.post(ctx, completePath, nil, completeBody([]byte(key), token, b.storedBody))
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("want 200, got %d: %s", status, snippet(reply))
	}
	if err != nil {
		return fmt.Errorf("warm-up: complete of replay key %d: %w", i, err)
	}
	return nil
}

func (b *bench) replayKey(i int) string { return b.prefix + "r" + strconv.Itoa(i) }

// load runs the workers for the configured duration and gathers what they saw.
func (b *bench) load(ctx context.Context) *report {
	workers := make([]*worker, b.cfg.concurrency)
	start := time.Now()
	b.start = start
	deadline := start.Add(b.cfg.duration)
	ctx, cancel := context.WithDeadlineCause(ctx, deadline.Add(requestGrace), errGraceOver)
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w := newWorker(b, i)
		workers[i] = w
		wg.Go(func() {
			defer w.conn.close()
			w.loop(ctx, deadline)
		})
	}
	wg.Wait()
	return b.report(workers, time.Since(start))
}

// A row is one line of the report: an operation, or one request of a cycle.
type row int

const (
	rowBegin row = iota
	rowCycle
	rowCycleBegin
	rowComplete
	rowReplay
	rowHot
	rowPay
	numRows
)

var rowNames = [numRows]string{"begin", "cycle", "cycle.begin", "cycle.complete", "replay", "hot", "pay"}

// rowStats is what one worker saw of one row.
type rowStats struct {
	hist     histogram
	statuses map[int]int64 // 0: the request failed without a reply
}

// errKey names a kind of error: an unexpected status of a row, or a failure
// without a reply (status 0).
type errKey struct {
	row    row
	status int
}

type errCount struct {
	n     int64
	first string
}

// worker sends one request at a time and keeps its own statistics.
type worker struct {
	b     *bench
	id    int
	seq   int
	conn  conn
	reply bytes.Buffer
	rows  [numRows]rowStats
	errs  map[errKey]*errCount
	bad   int // replays that lacked the stored body

	turn time.Time // when this turn's first request was due: now, or its time in the schedule
	lag  histogram // open loop: how late turns started
}

func newWorker(b *bench, id int) *worker {
	return &worker{b: b, id: id, conn: conn{target: b.target}, errs: make(map[errKey]*errCount)}
}

func (w *worker) loop(ctx context.Context, deadline time.Time) {
	m := &w.b.cfg.mix
	total := m.total()
	for ctx.Err() == nil {
		if !w.nextTurn(ctx, deadline) {
			return
		}
		o := op(0)
		for n := mrand.IntN(total); n >= m[o]; o++ {
			n -= m[o]
		}
		switch o {
		case opBegin:
			w.begin(ctx)
		case opCycle:
			w.cycle(ctx)
		case opReplay:
			w.replay(ctx)
		case opHot:
			w.hot(ctx)
		case opPay:
			w.pay(ctx)
		}
	}
}

// nextTurn waits for the worker's next turn and reports whether it is
// within the load. In a closed loop (no --rate) a turn starts as soon as
// the last one ended. In an open loop, turns are due at --rate a second
// from the start, and each worker takes the next one due, waiting for its
// time if it is early; a turn that starts late still counts its latency
// from when it was due, so that a service that falls behind the schedule
// is seen in the latencies, not hidden by the wait.
func (w *worker) nextTurn(ctx context.Context, deadline time.Time) bool {
	now := time.Now()
	rate := w.b.cfg.rate
	if rate <= 0 {
		w.turn = now
		return now.Before(deadline)
	}
	i := w.b.next.Add(1) - 1
	due := w.b.start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
	if !due.Before(deadline) {
		return false
	}
	if wait := due.Sub(now); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		now = time.Now()
	}
	w.lag.record(max(0, now.Sub(due)))
	w.turn = due
	return true
}

func (w *worker) begin(ctx context.Context) {
	body, _ := w.newKey('n')
	if status, reply, ok := w.call(ctx, rowBegin, w.turn, beginPath, nil, body); ok && status != http.StatusCreated {
		w.unexpected(rowBegin, status, reply)
	}
}

// pay calls an application's idempotent endpoint with a new key.
func (w *worker) pay(ctx context.Context) {
	if status, reply, ok := w.call(ctx, rowPay, w.turn, payPath, w.payKey(), payBody); ok && status != http.StatusCreated {
		w.unexpected(rowPay, status, reply)
	}
}

// payKey is the Idempotency-Key header line of a new key of this run, a
// Structured Field String.
func (w *worker) payKey() []byte {
	w.seq++
	h := make([]byte, 0, 64)
	h = append(h, `Idempotency-Key: "`...)
	h = append(h, w.b.prefix...)
	h = append(h, 'p')
	h = strconv.AppendInt(h, int64(w.id), 10)
	h = append(h, '.')
	h = strconv.AppendInt(h, int64(w.seq), 10)
	return append(h, "\"\r\n"...)
}

func (w *worker) cycle(ctx context.Context) {
	start := w.turn
	body, key := w.newKey('c')
	status, reply, ok := w.call(ctx, rowCycleBegin, start, beginPath, nil, body)
	if !ok {
		return
	}
	if status != http.StatusCreated {
		w.unexpected(rowCycleBegin, status, reply)
		return
	}
	token, err := leaseToken(reply)
	if err != nil {
		w.fail(rowCycleBegin, status, err.Error())
		return
	}
	status, reply, ok = w.call(ctx, rowComplete, time.Now(), completePath, nil, completeBody(key, token, w.b.cycleBody))
	if !ok {
		return
	}
	if status != http.StatusOK {
		w.unexpected(rowComplete, status, reply)
		return
	}
	w.rows[rowCycle].hist.record(time.Since(start))
}

func (w *worker) replay(ctx context.Context) {
	i := mrand.IntN(len(w.b.replayBodies))
	status, reply, ok := w.call(ctx, rowReplay, w.turn, beginPath, nil, w.b.replayBodies[i])
	switch {
	case !ok:
	case status == http.StatusOK:
		if !bytes.Contains(reply, w.b.replayReply) {
			w.bad++
			w.fail(rowReplay, status, "the reply lacks the stored body: "+snippet(reply))
		}
	case status == http.StatusCreated:
		w.b.replayAcq[i].Add(1)
		w.unexpected(rowReplay, status, reply)
	default:
		w.unexpected(rowReplay, status, reply)
	}
}

// hot begins the hot key: worker 0, its holder, with its owner, which must
// give back its lease; every other worker without, which must get 409.
func (w *worker) hot(ctx context.Context) {
	holder := w.id == 0
	body := w.b.hotBody
	if holder {
		body = w.b.hotOwnerBody
	}
	status, reply, ok := w.call(ctx, rowHot, w.turn, beginPath, nil, body)
	switch {
	case !ok:
	case status == http.StatusCreated && holder:
		if token, err := leaseToken(reply); err != nil || token != w.b.hotToken {
			w.b.hotAcq.Add(1)
			w.fail(rowHot, status, "a second lease on the hot key: "+snippet(reply))
		}
	case status == http.StatusCreated:
		w.b.hotAcq.Add(1)
		w.fail(rowHot, status, "a second lease on the hot key: "+snippet(reply))
	case status == http.StatusConflict && !holder:
	default:
		w.unexpected(rowHot, status, reply)
	}
}

// newKey returns the begin body of a new key of this run, and the key,
// which is part of the body.
func (w *worker) newKey(kind byte) (body, key []byte) {
	w.seq++
	body = make([]byte, 0, 64)
	body = append(body, `{"key":"`...)
	start := len(body)
	body = append(body, w.b.prefix...)
	body = append(body, kind)
	body = strconv.AppendInt(body, int64(w.id), 10)
	body = append(body, '.')
	body = strconv.AppendInt(body, int64(w.seq), 10)
	key = body[start:len(body):len(body)]
	return append(body, `"}`...), key
}

// completeBody is a complete request; respBody must be JSON-escaped already.
func completeBody(key []byte, token, respBody string) []byte {
	body := make([]byte, 0, 96+len(key)+len(token)+len(respBody))
	body = append(body, `{"key":"`...)
	body = append(body, key...)
	body = append(body, `","lease_token":`...)
	body = strconv.AppendQuote(body, token)
	body = append(body, `,"response":{"status_code":201,"body":"`...)
	body = append(body, respBody...)
	return append(body, `"}}`...)
}

// leaseToken finds the lease token in a begin's reply: by a quick scan of
// the compact JSON idemsvc writes, else by decoding.
func leaseToken(reply []byte) (string, error) {
	const field = `"lease_token":"`
	if i := bytes.Index(reply, []byte(field)); i >= 0 {
		rest := reply[i+len(field):]
		if j := bytes.IndexByte(rest, '"'); j > 0 && bytes.IndexByte(rest[:j], '\\') < 0 {
			return string(rest[:j]), nil
		}
	}
	var v struct {
		LeaseToken string `json:"lease_token"`
	}
	if err := json.Unmarshal(reply, &v); err != nil || v.LeaseToken == "" {
		return "", fmt.Errorf("no lease_token in the reply: %s", snippet(reply))
	}
	return v.LeaseToken, nil
}

// post sends one request, with header lines if any, on the worker's
// connection and reads the whole reply, which stays valid until the next
// post of this worker.
func (w *worker) post(ctx context.Context, path string, header, body []byte) (status int, reply []byte, err error) {
	status, err = w.conn.post(ctx, path, header, body, &w.reply)
	if err != nil {
		return 0, nil, err
	}
	return status, w.reply.Bytes(), nil
}

// call is post with its status, and its latency from start, recorded in
// row r. ok is false when no reply came; a failure is recorded unless the
// run was interrupted.
func (w *worker) call(ctx context.Context, r row, start time.Time, path string, header, body []byte) (status int, reply []byte, ok bool) {
	status, reply, err := w.post(ctx, path, header, body)
	d := time.Since(start)
	if err != nil {
		if context.Cause(ctx) != context.Canceled { // not stopped by an interrupt
			w.count(r, 0)
			w.fail(r, 0, err.Error())
		}
		return 0, nil, false
	}
	w.count(r, status)
	w.rows[r].hist.record(d)
	return status, reply, true
}

func (w *worker) count(r row, status int) {
	s := &w.rows[r]
	if s.statuses == nil {
		s.statuses = make(map[int]int64)
	}
	s.statuses[status]++
}

func (w *worker) unexpected(r row, status int, reply []byte) {
	w.fail(r, status, snippet(reply))
}

func (w *worker) fail(r row, status int, msg string) {
	e := w.errs[errKey{r, status}]
	if e == nil {
		e = &errCount{first: msg}
		w.errs[errKey{r, status}] = e
	}
	e.n++
}

// snippet shortens a reply for an error message.
func snippet(b []byte) string {
	const limit = 200
	s := strings.TrimSpace(string(b[:min(len(b), limit)]))
	if len(b) > limit {
		s += "..."
	}
	return s
}
