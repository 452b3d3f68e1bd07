// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// admitBegin checks tenant's limits before a begin: its rate, and whether it
// is over its stored-bytes budget, in which case the begin may only replay.
func (s *Service) admitBegin(ctx context.Context, tenant string) (auth.Limits, bool, error) {
	lim := s.keyring.Limits(tenant)
	if s.limiter == nil {
		return lim, false, nil
	}
	overBudget, err := s.limiter.Begin(ctx, tenant, lim)
	if err != nil {
		return lim, false, err
	}
	return lim, overBudget, nil
}

// beginError is the error of a begin: a refused acquisition (over the
// stored-bytes budget) is quota-exceeded.
func (s *Service) beginError(tenant string, lim auth.Limits, err error) error {
	if errors.Is(err, statemachine.ErrAcquireRefused) && s.limiter != nil {
		err = s.limiter.Refused(tenant, lim)
	}
	return err
}

// waitLimited waits for attempt of key to be over, as waiters.wait does,
// counted against tenant's waiters limit while it waits.
func (s *Service) waitLimited(ctx context.Context, tenant string, lim auth.Limits, key string, attempt int64, leaseEnd time.Time, d time.Duration) (bool, error) {
	if s.limiter == nil {
		return s.waiters.wait(ctx, tenant, key, attempt, leaseEnd, d), nil
	}
	done, err := s.limiter.Wait(ctx, tenant, lim, d)
	if err != nil {
		return false, err
	}
	defer done()
	return s.waiters.wait(ctx, tenant, key, attempt, leaseEnd, d), nil
}

// stored counts the bytes of a response a complete or terminal fail stored
// against tenant's budget: the body after decoding, header names and values.
func (s *Service) stored(tenant string, resp *statemachine.Response, expires time.Time) {
	if s.limiter == nil {
		return
	}
	n := len(resp.Body)
	for name, value := range resp.Headers {
		n += len(name) + len(value)
	}
	s.limiter.Stored(tenant, int64(n), expires)
}

// limitRetryAfter is a refused begin's Retry-After: whole seconds, at least 1.
func limitRetryAfter(e *quota.Error) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(e.RetryAfter.Seconds()))), 10)
}

// beginRoute is the route counted by tenant in idemsvc_begins_total.
const beginRoute = "/v1/begin"
