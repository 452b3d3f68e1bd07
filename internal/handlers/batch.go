// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// DefaultMaxBatch is Config.MaxBatch's default.
const DefaultMaxBatch = 100

// itemAnswer is one item's answer in a batch: the single call's answer,
// or its error.
type itemAnswer struct {
	visit func(http.ResponseWriter) error
	err   error
	// tenant and outcome count a begin item in idemsvc_begins_total, as
	// its single call is counted.
	tenant, outcome string
}

// batchItems checks a batch's envelope: items present, and not more than
// a batch may hold.
func (s *Service) batchItems(items []api.BeginBatchItem) error {
	if items == nil {
		return badField("items", "is required")
	}
	if len(items) > s.maxBatch {
		return badField("items", "holds %d items, more than the %d a batch may hold", len(items), s.maxBatch)
	}
	return nil
}

// BeginBatch begins each item as Begin would, without waiting, the items'
// store calls sent together.
func (s *Service) BeginBatch(ctx context.Context, req api.BeginBatchRequestObject) (api.BeginBatchResponseObject, error) {
	items := req.Body.Items
	if err := s.batchItems(items); err != nil {
		return nil, err
	}
	answers := make([]itemAnswer, len(items))
	type admitted struct {
		i    int
		t    string
		lim  auth.Quota
		a    admission
		breq statemachine.BeginRequest
	}
	adm := make([]admitted, 0, len(items))
	var holds []quota.Hold // the items' leases to count for in_progress, asked together
	var holding []int      // of adm
	for i, raw := range items {
		var b api.BeginRequest
		if err := api.DecodeItem(raw, &b); err != nil {
			answers[i].err = err
			continue
		}
		t, wait, breq, err := s.beginRequest(ctx, &b)
		if err == nil && wait > 0 {
			err = badField("wait_ms", "must be 0 in a batch: a batch does not wait")
		}
		if err != nil {
			answers[i].err = err
			continue
		}
		answers[i].tenant = t
		s.metrics.countBegin(t) // each item, as the limiter charges it
		lim := s.keyring.Quota(t)
		a, hold, err := s.admitRate(ctx, t, lim, &breq, 0)
		if err != nil {
			answers[i].err = err
			continue
		}
		if hold != nil {
			holds, holding = append(holds, *hold), append(holding, len(adm))
		}
		adm = append(adm, admitted{i, t, lim, a, breq})
	}
	if len(holds) > 0 {
		tokens, ok := s.quota.HoldAll(ctx, holds)
		for j := range holds {
			d := &adm[holding[j]]
			d.a.held(&d.breq, tokens[j], ok[j])
		}
	}
	if len(adm) > 0 {
		calls := make([]statemachine.BatchBegin, len(adm))
		for j := range adm {
			d := &adm[j]
			s.readBudget(d.t, d.lim, &d.breq)
			calls[j] = statemachine.BatchBegin{Tenant: d.t, BeginRequest: d.breq}
		}
		for j, o := range s.store.BeginBatch(ctx, calls) {
			d := &adm[j]
			if o.Err != nil {
				answers[d.i].err = s.beginFailed(d.t, d.lim, d.a, o.Err)
				continue
			}
			// An item waits for no read slot: the batch's other items
			// would wait with it, or for a slot the batch holds itself.
			out, err := s.beginDone(ctx, d.t, d.lim, d.a, o.Result, &largeRead{slots: s.reads, tenant: d.t})
			if err != nil {
				answers[d.i].err = err
				continue
			}
			answers[d.i].visit = out.VisitBeginResponse
			answers[d.i].outcome = beginOutcome(&o.Result)
		}
	}
	for _, a := range answers {
		if a.tenant == "" {
			continue
		}
		if a.err != nil {
			kind, _ := problemOf(a.err)
			a.outcome = kind.name
		}
		s.metrics.begins.WithLabelValues(s.metrics.tenantLabel(a.tenant), a.outcome).Inc()
	}
	batchOutcome(ctx)
	return batchAnswer(answers), nil
}

// finishItem is one item of a finish batch: a complete's or a fail's body
// with its kind; the member of the other kind is refused as unknown.
type finishItem struct {
	Kind string `json:"kind"`
}

type completeItem struct {
	Kind string `json:"kind"`
	api.CompleteRequest
}

type failItem struct {
	Kind string `json:"kind"`
	api.FailRequest
}

// FinishBatch completes or fails each item as Complete or Fail would, the
// items' store calls sent together.
func (s *Service) FinishBatch(ctx context.Context, req api.FinishBatchRequestObject) (api.FinishBatchResponseObject, error) {
	items := req.Body.Items
	if err := s.batchItems(items); err != nil {
		return nil, err
	}
	answers := make([]itemAnswer, len(items))
	calls := make([]statemachine.BatchFinish, 0, len(items))
	at := make([]int, 0, len(items))
	for i, raw := range items {
		call, err := s.finishItem(ctx, raw)
		if err != nil {
			answers[i].err = err
			continue
		}
		calls = append(calls, call)
		at = append(at, i)
	}
	if len(calls) > 0 {
		for j, o := range s.store.FinishBatch(ctx, calls) {
			c, i := &calls[j], at[j]
			switch {
			case o.Err != nil:
				answers[i].err = o.Err
			case c.Complete != nil:
				answers[i].visit = s.completed(ctx, c.Tenant, c.Complete, &o.Record).VisitCompleteResponse
			default:
				answers[i].visit = s.failed(ctx, c.Tenant, c.Fail, &o.Record).VisitFailResponse
			}
		}
	}
	batchOutcome(ctx)
	return batchAnswer(answers), nil
}

// finishItem checks one item of a finish batch as its single call's body.
func (s *Service) finishItem(ctx context.Context, raw []byte) (statemachine.BatchFinish, error) {
	var kind finishItem
	if err := api.DecodeItemKind(raw, &kind); err != nil {
		return statemachine.BatchFinish{}, err
	}
	switch kind.Kind {
	case "complete":
		var b completeItem
		if err := api.DecodeItem(raw, &b); err != nil {
			return statemachine.BatchFinish{}, err
		}
		t, req, err := s.completeRequest(ctx, &b.CompleteRequest)
		return statemachine.BatchFinish{Tenant: t, Complete: &req}, err
	case "fail":
		var b failItem
		if err := api.DecodeItem(raw, &b); err != nil {
			return statemachine.BatchFinish{}, err
		}
		t, req, err := s.failRequest(ctx, &b.FailRequest)
		return statemachine.BatchFinish{Tenant: t, Fail: &req}, err
	}
	return statemachine.BatchFinish{}, badField("kind", "must be complete or fail")
}

// batchOutcome is a batch's outcome for the log and metrics: each item's
// own is in its result.
func batchOutcome(ctx context.Context) {
	if info := infoFrom(ctx); info != nil {
		info.outcome = "batch"
	}
}

// batchAnswer writes 200 {"results": [...]}: each item's answer written
// by the single call's own code into its result, as it goes (a large
// replay is streamed, as the single call streams it).
type batchAnswer []itemAnswer

func (a batchAnswer) VisitBeginBatchResponse(w http.ResponseWriter) error  { return a.write(w) }
func (a batchAnswer) VisitFinishBatchResponse(w http.ResponseWriter) error { return a.write(w) }

// itemRequest stands for an item's request when its problem is written: it
// carries no request's log entry, so that an item's problem is not taken
// for the batch's.
var itemRequest = new(http.Request)

func (a batchAnswer) write(w http.ResponseWriter) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := io.WriteString(w, `{"results":[`); err != nil {
		return err
	}
	iw := &itemWriter{w: w, header: make(http.Header, 4)}
	for i, it := range a {
		iw.start(i > 0)
		if it.err != nil {
			writeProblem(iw, itemRequest, it.err)
		} else if err := it.visit(iw); err != nil {
			return err
		}
		if err := iw.end(); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "]}")
	return err
}

// itemWriter writes one item's answer into a batch's: its status as the
// result's status and its body as the result's body; its headers are
// dropped. Unwrap lets the answer set its write deadline on the batch's
// connection.
type itemWriter struct {
	w       http.ResponseWriter
	header  http.Header
	comma   bool
	started bool
	buf     []byte
}

func (iw *itemWriter) start(comma bool) {
	clear(iw.header)
	iw.comma, iw.started = comma, false
}

func (iw *itemWriter) Header() http.Header { return iw.header }

func (iw *itemWriter) WriteHeader(code int) {
	if iw.started {
		return
	}
	iw.started = true
	iw.buf = iw.buf[:0]
	if iw.comma {
		iw.buf = append(iw.buf, ',')
	}
	iw.buf = append(iw.buf, `{"status":`...)
	iw.buf = strconv.AppendInt(iw.buf, int64(code), 10)
	iw.buf = append(iw.buf, `,"body":`...)
	_, _ = iw.w.Write(iw.buf) // a broken connection fails the next Write
}

func (iw *itemWriter) Write(b []byte) (int, error) {
	iw.WriteHeader(http.StatusOK)
	return iw.w.Write(b)
}

// end closes the item's result; an answer without a body has null.
func (iw *itemWriter) end() error {
	if !iw.started {
		iw.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(iw.w, "null")
	}
	_, err := io.WriteString(iw.w, "}")
	return err
}

func (iw *itemWriter) Unwrap() http.ResponseWriter { return iw.w }
