// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// Spans carry the route, the status, the tenant and the outcome; never a
// client key, a lease token, an owner, a fingerprint or a body.
var (
	attrTenant  = attribute.Key("idemsvc.tenant")
	attrOutcome = attribute.Key("idemsvc.outcome")
	attrScript  = attribute.Key("idemsvc.script")
)

// propagator reads and writes W3C trace context and baggage.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// startRequestSpan starts the span of one request, continuing the caller's
// traceparent. Its name gets the route once the router matched it.
func (s *Service) startRequestSpan(r *http.Request) (*http.Request, trace.Span) {
	ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method)))
	return r.WithContext(ctx), span
}

// endRequestSpan names and ends a request's span.
func endRequestSpan(span trace.Span, method, route string, status int, info *requestInfo, outcome string) {
	span.SetName(method + " " + route)
	span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", status),
		attrOutcome.String(outcome))
	if info.tenant != "" {
		span.SetAttributes(attrTenant.String(info.tenant))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}

// tracedStore gives every store call a span: the script it runs, the
// tenant and the outcome.
type tracedStore struct {
	statemachine.Store
	tracer trace.Tracer
}

func (t tracedStore) start(ctx context.Context, script, tenant string) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "store "+script, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrScript.String(script), attrTenant.String(tenant)))
}

// end records err's outcome (ok when nil) on span and ends it.
func end(span trace.Span, ok string, err error) {
	outcome := ok
	if err != nil {
		outcome = storeOutcome(err)
		if errors.Is(err, statemachine.ErrStoreUnavailable) {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.SetAttributes(attrOutcome.String(outcome))
	span.End()
}

// storeOutcome names err by its problem kind, as the request log does.
func storeOutcome(err error) string {
	kind, _ := problemOf(err)
	return kind.name
}

func (t tracedStore) Begin(ctx context.Context, tenant string, req statemachine.BeginRequest) (statemachine.BeginResult, error) {
	ctx, span := t.start(ctx, "begin.lua", tenant)
	res, err := t.Store.Begin(ctx, tenant, req)
	ok := "acquired"
	if err == nil && !res.Acquired {
		ok = "replayed"
	}
	end(span, ok, err)
	return res, err
}

func (t tracedStore) Complete(ctx context.Context, tenant string, req statemachine.CompleteRequest) (statemachine.Record, error) {
	ctx, span := t.start(ctx, "complete.lua", tenant)
	rec, err := t.Store.Complete(ctx, tenant, req)
	end(span, "completed", err)
	return rec, err
}

func (t tracedStore) Fail(ctx context.Context, tenant string, req statemachine.FailRequest) (statemachine.Record, error) {
	ctx, span := t.start(ctx, "fail.lua", tenant)
	rec, err := t.Store.Fail(ctx, tenant, req)
	end(span, "failed", err)
	return rec, err
}

func (t tracedStore) Extend(ctx context.Context, tenant string, req statemachine.ExtendRequest) (statemachine.Lease, error) {
	ctx, span := t.start(ctx, "extend.lua", tenant)
	lease, err := t.Store.Extend(ctx, tenant, req)
	end(span, "extended", err)
	return lease, err
}

func (t tracedStore) Status(ctx context.Context, tenant, key string, withResponse bool) (statemachine.Record, error) {
	ctx, span := t.start(ctx, "status.lua", tenant)
	rec, err := t.Store.Status(ctx, tenant, key, withResponse)
	end(span, "found", err)
	return rec, err
}

func (t tracedStore) Delete(ctx context.Context, tenant, key string) error {
	ctx, span := t.start(ctx, "delete.lua", tenant)
	err := t.Store.Delete(ctx, tenant, key)
	end(span, "deleted", err)
	return err
}

func (t tracedStore) List(ctx context.Context, tenant string, req statemachine.ListRequest) (statemachine.ListPage, error) {
	ctx, span := t.start(ctx, "scan", tenant)
	page, err := t.Store.List(ctx, tenant, req)
	end(span, "listed", err)
	return page, err
}

// BeginBatch gives a batch of begins one span: the items' scripts travel
// together. Its tenant is the first item's.
func (t tracedStore) BeginBatch(ctx context.Context, items []statemachine.BatchBegin) []statemachine.BeginOutcome {
	ctx, span := t.start(ctx, "begin.lua batch", items[0].Tenant)
	out := t.Store.BeginBatch(ctx, items)
	span.SetAttributes(attribute.Int("idemsvc.batch.items", len(items)))
	end(span, "batch", nil)
	return out
}

// FinishBatch gives a batch of completes and fails one span, as
// BeginBatch does.
func (t tracedStore) FinishBatch(ctx context.Context, items []statemachine.BatchFinish) []statemachine.FinishOutcome {
	ctx, span := t.start(ctx, "finish batch", items[0].Tenant)
	out := t.Store.FinishBatch(ctx, items)
	span.SetAttributes(attribute.Int("idemsvc.batch.items", len(items)))
	end(span, "batch", nil)
	return out
}
