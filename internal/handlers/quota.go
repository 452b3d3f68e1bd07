// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// admission is what a begin's limits decided before it runs.
type admission struct {
	overBudget bool   // over stored_bytes: the begin may only replay
	full       bool   // at in_progress: the begin may only replay
	hold       string // the lease token counted against in_progress, if any
}

// admitBegin checks tenant's limits lim before a begin: its rate, whether
// it is over its stored-bytes budget, and whether it holds its in_progress
// limit. Over either of the last two the begin may only replay (req's
// NoAcquire); under in_progress the lease it would acquire is counted
// first, under req's Token.
func (s *Service) admitBegin(ctx context.Context, tenant string, lim auth.Quota, req *statemachine.BeginRequest, wait time.Duration) (admission, error) {
	a, hold, err := s.admitRate(ctx, tenant, lim, req, wait)
	if err != nil || hold == nil {
		return a, err
	}
	token, ok := s.quota.Hold(ctx, tenant, lim, hold.D)
	a.held(req, token, ok)
	return a, nil
}

// admitRate is admitBegin but for in_progress: hold, if not nil, is the
// lease to count (Limiter.Hold), whose answer a.held takes. req's
// NoAcquire is set as far as is known without it.
func (s *Service) admitRate(ctx context.Context, tenant string, lim auth.Quota, req *statemachine.BeginRequest, wait time.Duration) (a admission, hold *quota.Hold, err error) {
	if s.quota == nil || lim.IsZero() {
		return a, nil, nil
	}
	if a.overBudget, err = s.quota.Begin(ctx, tenant, lim); err != nil {
		return a, nil, err
	}
	req.NoAcquire = a.overBudget
	if lim.InProgress > 0 && !a.overBudget {
		lease := req.Lease
		if lease == 0 {
			lease = s.bounds.DefaultLease
		}
		hold = &quota.Hold{Tenant: tenant, Limits: lim, D: lease + wait}
	}
	return a, hold, nil
}

// held takes the answer to a hold: counted under token, the begin
// acquires with token ("" when nothing was counted: the store picks it);
// refused, it may only replay.
func (a *admission) held(req *statemachine.BeginRequest, token string, ok bool) {
	if !ok {
		a.full = true
	} else if token != "" {
		a.hold, req.Token = token, token
	}
	req.NoAcquire = a.overBudget || a.full
}

// settleHold settles the lease counted for a begin once it answered: the
// lease it acquired lasts as its store says; a count it did not use (res
// nil, a replay, the owner's own lease) is over.
func (s *Service) settleHold(tenant string, lim auth.Quota, token string, res *statemachine.BeginResult) {
	if token == "" {
		return
	}
	if res != nil && res.Acquired && res.Lease.Token == token {
		s.quota.Held(tenant, lim, token, res.Lease.ExpiresAt)
		return
	}
	s.quota.Held(tenant, lim, token, time.Time{})
}

// leaseEnded counts tenant's lease of token, against its in_progress
// limit, as over (ends zero: completed or failed) or as lasting until ends
// (extended).
func (s *Service) leaseEnded(tenant, token string, ends time.Time) {
	if s.quota == nil {
		return
	}
	lim := s.keyring.Quota(tenant)
	if lim.InProgress == 0 {
		return
	}
	// Counted under the form the store gives (lower-case hex); the API
	// takes either case.
	s.quota.Held(tenant, lim, strings.ToLower(token), ends)
}

// beginError is the error of a begin: a refused acquisition is
// quota-exceeded over the stored-bytes budget, rate-limited at in_progress;
// a refused replay is rate-limited over the read budget.
func (s *Service) beginError(tenant string, lim auth.Quota, a admission, err error) error {
	if s.quota == nil {
		return err
	}
	if errors.Is(err, statemachine.ErrReplayRefused) {
		return s.quota.ReadRefused(tenant, lim)
	}
	if !errors.Is(err, statemachine.ErrAcquireRefused) {
		return err
	}
	if a.overBudget {
		return s.quota.Refused(tenant, lim)
	}
	return s.quota.HoldRefused(tenant, lim)
}

// waitLimited waits for attempt of key to be over, as waiters.wait does,
// counted against tenant's waiters limit while it waits.
func (s *Service) waitLimited(ctx context.Context, tenant string, lim auth.Quota, key string, attempt int64, leaseEnd time.Time, d time.Duration) (bool, error) {
	if s.quota == nil {
		return s.waiters.wait(ctx, tenant, key, attempt, leaseEnd, d), nil
	}
	done, err := s.quota.Wait(ctx, tenant, lim, d)
	if err != nil {
		return false, err
	}
	defer done()
	return s.waiters.wait(ctx, tenant, key, attempt, leaseEnd, d), nil
}

// accountStored counts the bytes of a response a complete or terminal fail stored
// against tenant's budget: what the store holds, the body as stored
// (compressed or not), header names and values (Record.StoredBytes).
func (s *Service) accountStored(tenant string, rec *statemachine.Record) {
	if s.quota == nil {
		return
	}
	s.quota.Stored(tenant, rec.StoredBytes, rec.ExpiresAt)
}

// responseSize is a response's size as the read budget counts it: the
// body after decoding, header names and values.
func responseSize(resp *statemachine.Response) int64 {
	n := resp.BodySize() // a body by reference counts when it is fetched (GetBody)
	for name, value := range resp.Headers {
		n += int64(len(name) + len(value))
	}
	return n
}

// limitRetryAfter is a refused begin's Retry-After: whole seconds, at least 1.
func limitRetryAfter(e *quota.Error) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(e.RetryAfter.Seconds()))), 10)
}

// beginRoute is the route counted by tenant in idemsvc_begins_total.
const beginRoute = "/v1/begin"
