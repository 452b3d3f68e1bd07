// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// tenant resolves the tenant a request acts for: the one it names, which
// only an admin key may name when it is another's, or the key's own.
func tenant(ctx context.Context, named *string) (string, error) {
	info := infoFrom(ctx)
	if info == nil || !info.authenticated {
		return "", errUnauthorized
	}
	p := info.principal
	if named == nil || *named == p.Tenant {
		info.tenant = p.Tenant
		return p.Tenant, nil
	}
	if !p.Admin {
		if auth.ValidTenantName(*named) {
			info.named = *named
		}
		return "", errForbidden
	}
	// A malformed name is refused as invalid with the rest of the request,
	// and is not logged or counted as a tenant.
	valid := auth.ValidTenantName(*named)
	if info.tenants != nil && valid && !info.tenants.Has(*named) {
		return "", &noTenantError{*named}
	}
	if valid {
		info.tenant = *named
	}
	return *named, nil
}

// statusRecord is rec as the API shows it, without its response.
func statusRecord(tenant string, rec statemachine.Record) api.StatusRecord {
	out := api.StatusRecord{
		Key:         rec.Key,
		Tenant:      tenant,
		State:       apiState(rec.State),
		Attempt:     rec.Attempt,
		Owner:       optional(rec.Owner),
		Fingerprint: optional(rec.Fingerprint),
		CreatedAt:   api.NewMilliTime(rec.CreatedAt),
		UpdatedAt:   api.NewMilliTime(rec.UpdatedAt),
		ExpiresAt:   api.NewMilliTime(rec.ExpiresAt),
	}
	switch rec.State {
	case statemachine.StateInProgress:
		out.LeaseExpiresAt = millis(rec.LeaseExpiresAt)
		out.LeaseExpired = &rec.LeaseExpired
	case statemachine.StateFailed:
		out.Retryable = &rec.Retryable
		out.Error = optional(rec.Error)
	}
	return out
}

// ListKeys lists the tenant's records in one state, a page at a time.
func (s *Service) ListKeys(ctx context.Context, req api.ListKeysRequestObject) (api.ListKeysResponseObject, error) {
	p := req.Params
	t, err := tenant(ctx, p.Tenant)
	if err != nil {
		return nil, err
	}
	// The parameters map onto the listing; the store refuses what breaks
	// its rules (statemachine.CheckList), naming the parameter.
	lr := statemachine.ListRequest{State: stateOf(p.State), Cursor: deref(p.Cursor)}
	if p.OlderThanS != nil {
		lr.OlderThan = time.Duration(*p.OlderThanS) * time.Second
	}
	if p.Limit != nil {
		// A limit given is 1 or more: 0 is the default only when absent,
		// so a 0 given goes as -1, which the store refuses as out of range.
		if lr.Limit = int(*p.Limit); lr.Limit == 0 {
			lr.Limit = -1
		}
	}
	page, err := s.store.List(ctx, t, lr)
	if err != nil {
		return nil, err
	}
	setOutcome(ctx, t, "listed")
	out := api.ListKeys200JSONResponse{Items: make([]api.StatusRecord, 0, len(page.Records)), NextCursor: optional(page.NextCursor)}
	for _, rec := range page.Records {
		out.Items = append(out.Items, statusRecord(t, rec))
	}
	return out, nil
}

// Begin acquires a key or replays its outcome, waiting for an attempt in
// progress when asked to.
func (s *Service) Begin(ctx context.Context, req api.BeginRequestObject) (api.BeginResponseObject, error) {
	t, wait, breq, err := s.beginRequest(ctx, req.Body)
	if err != nil {
		return nil, err
	}
	s.metrics.countBegin(t)
	lim := s.keyring.Quota(t)
	// One timeout for the limits' calls and the store's together: while
	// Redis is down, a begin fails within one store timeout, not two.
	large, gated := s.readGate(ctx, t)
	defer large.drop()
	first := gated
	if s.storeTimeout > 0 && !lim.IsZero() && s.quota != nil {
		var cancel context.CancelFunc
		first, cancel = context.WithTimeout(gated, s.storeTimeout)
		defer cancel()
	}
	a, err := s.admitBegin(first, t, lim, &breq, wait)
	if err != nil {
		return nil, err
	}
	s.readBudget(t, lim, &breq)
	breq.StreamedBody = true // a long compressed body is decoded as it is written
	deadline := time.Now().Add(wait)
	if wait > 0 {
		// Its caller waits anyway: the store queues this call for up to
		// the wait rather than shed it as overload.
		first = statemachine.WithQueueWait(first, wait)
	}
	for call := first; ; call = gated {
		res, err := s.store.Begin(call, t, breq)
		var busy *statemachine.InProgressError
		if wait > 0 && errors.As(err, &busy) {
			if left := time.Until(deadline); left > 0 {
				waitStart := time.Now()
				over, werr := s.waitLimited(ctx, t, lim, req.Body.Key, busy.Attempt, busy.LeaseExpiresAt, left)
				if werr != nil {
					s.settleHold(t, lim, a.hold, nil)
					return nil, werr
				}
				if over {
					breq.Waited = true
					continue // the attempt is over: begin again
				}
				// The 409 is sent now: its Retry-After counts from now,
				// not from the store's answer before the wait.
				busy.Now = busy.Now.Add(time.Since(waitStart))
			}
		}
		if err != nil {
			return nil, s.beginFailed(t, lim, a, err)
		}
		if res.Acquired && res.Lease.Recovered && s.blobs != nil {
			// A takeover: what the earlier attempts uploaded, no
			// complete can name any more.
			s.blobs.deleteAttempts(t, req.Body.Key, res.Lease.Token)
		}
		if !res.Acquired {
			if err := s.resolve(ctx, &res.Record.Response); err != nil {
				s.settleHold(t, lim, a.hold, &res)
				return nil, err
			}
		}
		return s.beginDone(ctx, t, lim, a, res, large)
	}
}

// beginRequest checks a begin's body: the tenant it acts for, its wait,
// and the store's request.
func (s *Service) beginRequest(ctx context.Context, b *api.BeginRequest) (string, time.Duration, statemachine.BeginRequest, error) {
	t, err := tenant(ctx, b.Tenant)
	if err != nil {
		return "", 0, statemachine.BeginRequest{}, err
	}
	wait, err := s.bounds.Wait(b.WaitMs)
	if err != nil {
		return "", 0, statemachine.BeginRequest{}, err
	}
	lease, err := s.bounds.Lease(b.LeaseMs)
	if err != nil {
		return "", 0, statemachine.BeginRequest{}, err
	}
	retention, err := s.bounds.Retention(b.RetentionS)
	if err != nil {
		return "", 0, statemachine.BeginRequest{}, err
	}
	return t, wait, statemachine.BeginRequest{
		Key:         b.Key,
		Fingerprint: deref(b.Fingerprint),
		Owner:       deref(b.Owner),
		Lease:       lease,
		Retention:   retention,
	}, nil
}

// readBudget makes a begin of a tenant over its read budget acquire or
// answer, but replay nothing.
func (s *Service) readBudget(t string, lim auth.Quota, breq *statemachine.BeginRequest) {
	if s.quota != nil && !s.quota.CanRead(t, lim) {
		breq.NoReplay = true
	}
}

// beginFailed settles the limits of a begin the store refused, and returns
// its error.
func (s *Service) beginFailed(t string, lim auth.Quota, a admission, err error) error {
	if !errors.Is(err, statemachine.ErrStoreUnavailable) || statemachine.NotApplied(err) {
		// (Otherwise unavailable: the begin may have acquired with the
		// token; its count lapses by itself.)
		s.settleHold(t, lim, a.hold, nil)
	}
	return s.beginError(t, lim, a, err)
}

// beginDone settles the limits of a begin the store answered, and returns
// its answer: a large replay once it holds one of its tenant's read slots
// (large's, taken by the store before it read the response or now,
// waiting for one if large says so).
func (s *Service) beginDone(ctx context.Context, t string, lim auth.Quota, a admission, res statemachine.BeginResult, large *largeRead) (api.BeginResponseObject, error) {
	s.settleHold(t, lim, a.hold, &res)
	if res.Acquired {
		return s.beginResult(ctx, t, res), nil
	}
	size := responseSize(&res.Record.Response)
	if s.quota != nil {
		s.quota.Read(t, lim, size)
	}
	release, err := large.take(ctx, size)
	if err != nil {
		return nil, err
	}
	if release == nil {
		return s.beginResult(ctx, t, res), nil
	}
	out := s.beginResult(ctx, t, res)
	if r, ok := out.(replayAnswer); ok {
		r.release = release
		return r, nil
	}
	release()
	return out, nil
}

// beginOutcome names a begin's answer for the log and metrics.
func beginOutcome(res *statemachine.BeginResult) string {
	switch {
	case res.Acquired:
		return "acquired"
	case res.Record.State == statemachine.StateCompleted:
		return "replayed-completed"
	}
	return "replayed-failed"
}

func (s *Service) beginResult(ctx context.Context, t string, res statemachine.BeginResult) api.BeginResponseObject {
	setOutcome(ctx, t, beginOutcome(&res))
	if res.Acquired {
		return api.BeginAcquiredResponse{
			Status:         api.BeginAcquiredStatusAcquired,
			Key:            res.Record.Key,
			Attempt:        res.Lease.Attempt,
			LeaseToken:     res.Lease.Token,
			LeaseExpiresAt: api.NewMilliTime(res.Lease.ExpiresAt),
			Recovered:      res.Lease.Recovered,
		}
	}
	rec := &res.Record
	out := api.BeginReplayResponse{
		Key:      rec.Key,
		Attempt:  rec.Attempt,
		Response: fromResponse(rec.Response),
	}
	if ref := rec.Response.Ref; ref != nil {
		out.Response.BodyRef = bodyRef(ref, rec.Key, t)
	}
	if rec.State == statemachine.StateCompleted {
		out.Status = api.FinishedStateCompleted
		out.CompletedAt = millis(rec.UpdatedAt)
	} else {
		out.Status = api.FinishedStateFailed
		out.FailedAt = millis(rec.UpdatedAt)
		out.Error = optional(rec.Error)
	}
	if body := s.streamed(&rec.Response); body != nil {
		return replayAnswer{BeginReplayResponse: out, body: body}
	}
	if d := s.writeDeadline(&out.Response); d > 0 {
		return replayAnswer{BeginReplayResponse: out, deadline: d}
	}
	return out
}

// Complete stores the attempt's response.
func (s *Service) Complete(ctx context.Context, req api.CompleteRequestObject) (api.CompleteResponseObject, error) {
	t, creq, err := s.completeRequest(ctx, req.Body)
	if err != nil {
		return nil, err
	}
	if !s.keepJSON(&creq.Response) {
		return s.completeByRef(ctx, t, &creq)
	}
	rec, err := s.store.Complete(ctx, t, creq)
	if err != nil {
		return nil, err
	}
	return s.completed(ctx, t, &creq, &rec), nil
}

// completeRequest checks a complete's body: the tenant it acts for and the
// store's request.
func (s *Service) completeRequest(ctx context.Context, b *api.CompleteRequest) (string, statemachine.CompleteRequest, error) {
	t, err := tenant(ctx, b.Tenant)
	if err != nil {
		return "", statemachine.CompleteRequest{}, err
	}
	resp, err := toResponse(b.Response)
	if err != nil {
		return "", statemachine.CompleteRequest{}, err
	}
	retention, err := s.bounds.Retention(b.RetentionS)
	if err != nil {
		return "", statemachine.CompleteRequest{}, err
	}
	return t, statemachine.CompleteRequest{Key: b.Key, Token: b.LeaseToken, Response: resp, Retention: retention}, nil
}

// completed counts a stored complete and returns its answer.
func (s *Service) completed(ctx context.Context, t string, req *statemachine.CompleteRequest, rec *statemachine.Record) api.FinishResponse {
	s.accountStored(t, rec)
	s.leaseEnded(t, req.Token, time.Time{})
	setOutcome(ctx, t, "completed")
	return api.FinishResponse(finishResult(rec))
}

// Fail ends the attempt with a failure, terminal or retryable.
func (s *Service) Fail(ctx context.Context, req api.FailRequestObject) (api.FailResponseObject, error) {
	t, freq, err := s.failRequest(ctx, req.Body)
	if err != nil {
		return nil, err
	}
	if !freq.Retryable && !s.keepJSON(&freq.Response) {
		// A terminal failure's response is replayed as a complete's is:
		// a long body goes to the blob store. (A retryable one is not
		// stored at all.)
		return s.failByRef(ctx, t, &freq)
	}
	rec, err := s.store.Fail(ctx, t, freq)
	if err != nil {
		return nil, err
	}
	return s.failed(ctx, t, &freq, &rec), nil
}

// failRequest checks a fail's body: the tenant it acts for and the store's
// request.
func (s *Service) failRequest(ctx context.Context, b *api.FailRequest) (string, statemachine.FailRequest, error) {
	t, err := tenant(ctx, b.Tenant)
	if err != nil {
		return "", statemachine.FailRequest{}, err
	}
	resp, err := toResponse(b.Response)
	if err != nil {
		return "", statemachine.FailRequest{}, err
	}
	return t, statemachine.FailRequest{
		Key:       b.Key,
		Token:     b.LeaseToken,
		Retryable: b.Retryable == nil || *b.Retryable,
		Error:     deref(b.Error),
		Response:  resp,
	}, nil
}

// failed counts a stored fail and returns its answer.
func (s *Service) failed(ctx context.Context, t string, req *statemachine.FailRequest, rec *statemachine.Record) api.FinishResponse {
	s.leaseEnded(t, req.Token, time.Time{})
	if req.Retryable {
		setOutcome(ctx, t, "released")
	} else {
		s.accountStored(t, rec)
		setOutcome(ctx, t, "failed")
	}
	return api.FinishResponse(finishResult(rec))
}

func finishResult(rec *statemachine.Record) api.FinishResult {
	out := api.FinishResult{
		Key:       rec.Key,
		Attempt:   rec.Attempt,
		ExpiresAt: api.NewMilliTime(rec.ExpiresAt),
	}
	if rec.State == statemachine.StateCompleted {
		out.Status = api.FinishedStateCompleted
		out.CompletedAt = millis(rec.UpdatedAt)
	} else {
		out.Status = api.FinishedStateFailed
		out.FailedAt = millis(rec.UpdatedAt)
		out.Retryable = &rec.Retryable
	}
	return out
}

// Extend renews the lease of the current attempt.
func (s *Service) Extend(ctx context.Context, req api.ExtendRequestObject) (api.ExtendResponseObject, error) {
	b := req.Body
	t, err := tenant(ctx, b.Tenant)
	if err != nil {
		return nil, err
	}
	d, err := s.bounds.Lease(b.LeaseMs)
	if err != nil {
		return nil, err
	}
	lease, err := s.store.Extend(ctx, t, statemachine.ExtendRequest{Key: b.Key, Token: b.LeaseToken, Lease: d})
	if err != nil {
		return nil, err
	}
	s.leaseEnded(t, lease.Token, lease.ExpiresAt)
	setOutcome(ctx, t, "extended")
	return api.Extend200JSONResponse{
		Key:            b.Key,
		Attempt:        lease.Attempt,
		LeaseToken:     lease.Token,
		LeaseExpiresAt: api.NewMilliTime(lease.ExpiresAt),
	}, nil
}

// GetStatus reads a key's record.
func (s *Service) GetStatus(ctx context.Context, req api.GetStatusRequestObject) (api.GetStatusResponseObject, error) {
	p := req.Params
	t, err := tenant(ctx, p.Tenant)
	if err != nil {
		return nil, err
	}
	withResponse := deref(p.IncludeResponse)
	var lim auth.Quota
	if withResponse && s.quota != nil {
		// A status with the response is a read, counted as a replay is.
		if lim = s.keyring.Quota(t); !s.quota.CanRead(t, lim) {
			return nil, s.quota.ReadRefused(t, lim)
		}
	}
	large, call := s.readGate(ctx, t)
	defer large.drop()
	if withResponse { // a long compressed body is decoded as it is written
		call = statemachine.WithStreamedBodies(call)
	}
	rec, err := s.store.Status(call, t, p.Key, withResponse)
	if err != nil {
		return nil, err
	}
	if withResponse && rec.State != statemachine.StateInProgress {
		if err := s.resolve(ctx, &rec.Response); err != nil {
			return nil, err
		}
	}
	var release func()
	if withResponse && rec.State != statemachine.StateInProgress {
		size := responseSize(&rec.Response)
		if s.quota != nil {
			s.quota.Read(t, lim, size)
		}
		if release, err = large.take(ctx, size); err != nil {
			return nil, err
		}
	}
	setOutcome(ctx, t, "found")
	out := api.StatusResponse(statusRecord(t, rec))
	if withResponse && rec.State != statemachine.StateInProgress {
		resp := fromResponse(rec.Response)
		if ref := rec.Response.Ref; ref != nil {
			resp.BodyRef = bodyRef(ref, rec.Key, t)
		}
		out.Response = &resp
		if body := s.streamed(&rec.Response); body != nil {
			return statusAnswer{StatusResponse: out, release: release, body: body}, nil
		}
		if d := s.writeDeadline(&resp); d > 0 {
			return statusAnswer{StatusResponse: out, deadline: d, release: release}, nil
		}
	}
	if release != nil {
		release()
	}
	return out, nil
}

// DeleteKey forgets a key's record.
func (s *Service) DeleteKey(ctx context.Context, req api.DeleteKeyRequestObject) (api.DeleteKeyResponseObject, error) {
	t, err := tenant(ctx, req.Params.Tenant)
	if err != nil {
		return nil, err
	}
	var deleted *statemachine.Record
	if s.blobs != nil {
		// The objects of the record in the blob store go with it.
		rec, err := s.store.Status(ctx, t, req.Params.Key, true)
		switch {
		case err == nil:
			deleted = &rec
		case !errors.Is(err, statemachine.ErrNotFound):
			return nil, err
		}
	}
	if err := s.store.Delete(ctx, t, req.Params.Key); err != nil {
		return nil, err
	}
	s.deleteObjects(t, deleted)
	setOutcome(ctx, t, "deleted")
	return api.DeleteKey204Response{}, nil
}

// Healthz answers while the process serves.
func (s *Service) Healthz(context.Context, api.HealthzRequestObject) (api.HealthzResponseObject, error) {
	return api.Healthz200JSONResponse{Status: api.HealthStatusOk}, nil
}

// Readyz answers 200 while the store can serve, and otherwise 503 naming
// each failed check and node.
func (s *Service) Readyz(ctx context.Context, _ api.ReadyzRequestObject) (api.ReadyzResponseObject, error) {
	failures := s.store.Readiness(ctx)
	if len(failures) == 0 {
		return api.Readyz200JSONResponse{Status: api.HealthStatusOk}, nil
	}
	setOutcome(ctx, "", "not-ready")
	out := api.Readyz503JSONResponse{Status: api.ReadinessStatusUnavailable,
		Failures: make([]api.ReadinessFailure, len(failures))}
	for i, f := range failures {
		out.Failures[i] = api.ReadinessFailure{Check: api.ReadinessFailureCheck(f.Check), Node: f.Node, Detail: clip(f.Detail, maxDetailChars)}
	}
	return out, nil
}

// Metrics serves the Prometheus metrics.
func (s *Service) Metrics(context.Context, api.MetricsRequestObject) (api.MetricsResponseObject, error) {
	families, err := s.registry.Gather()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return metricsResponse(families), nil
}

// metricsResponse writes metric families in Prometheus's text format, with
// its versioned content type.
type metricsResponse []*dto.MetricFamily

func (m metricsResponse) VisitMetricsResponse(w http.ResponseWriter) error {
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	w.Header().Set("Content-Type", string(format))
	enc := expfmt.NewEncoder(w, format)
	for _, mf := range m {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}
