// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"fmt"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// GetUsage reports each tenant's usage against its limits: a tenant key's
// own, or for an admin every tenant of the tenants file (or the one named).
func (s *Service) GetUsage(ctx context.Context, req api.GetUsageRequestObject) (api.GetUsageResponseObject, error) {
	t, err := tenant(ctx, req.Params.Tenant)
	if err != nil {
		return nil, err
	}
	tenants := []string{t}
	if p := infoFrom(ctx).principal; p.Admin && req.Params.Tenant == nil && s.keyring != nil {
		tenants = s.keyring.Tenants()
	}
	now := time.Now().Unix()
	out := api.GetUsage200JSONResponse{Tenants: make([]api.TenantUsage, 0, len(tenants))}
	for _, name := range tenants {
		u := api.TenantUsage{Tenant: name, Limits: tenantLimits(s.keyring.Limits(name))}
		if w, ok := s.metrics.windows.Load(name); ok {
			u.BeginsPerS = w.(*beginWindow).perSecond(now)
		}
		if s.limiter != nil {
			q, err := s.limiter.Usage(ctx, name)
			if err != nil {
				// The counts live in the store: 503, retried as any read.
				return nil, fmt.Errorf("usage of %s: %w: %w", name, statemachine.ErrStoreUnavailable, err)
			}
			u.StoredBytes, u.Waiters, u.InProgress = q.StoredBytes, q.Waiters, q.InProgress
			u.Rejections = api.LimitCounts{
				BeginsPerS:    q.Rejections[quota.LimitRate],
				StoredBytes:   q.Rejections[quota.LimitStoredBytes],
				Waiters:       q.Rejections[quota.LimitWaiters],
				InProgress:    q.Rejections[quota.LimitInProgress],
				ReadBytesPerS: q.Rejections[quota.LimitReadBytes],
			}
		}
		out.Tenants = append(out.Tenants, u)
	}
	setOutcome(ctx, t, "usage")
	return out, nil
}

// tenantLimits is l as the API shows it: absent for unlimited.
func tenantLimits(l auth.Limits) api.TenantLimits {
	set := func(v int64) *int64 {
		if v == 0 {
			return nil
		}
		return &v
	}
	out := api.TenantLimits{
		BeginsPerS:    set(l.BeginsPerS),
		StoredBytes:   set(l.StoredBytes),
		Waiters:       set(l.Waiters),
		InProgress:    set(l.InProgress),
		ReadBytesPerS: set(l.ReadBytesPerS),
	}
	if l.BeginsPerS > 0 {
		out.Burst = &l.Burst
	}
	return out
}
