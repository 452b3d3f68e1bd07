// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/quota"
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
	out := api.GetUsage200JSONResponse{Tenants: make([]api.TenantUsage, len(tenants))}
	var wg sync.WaitGroup
	sem := make(chan struct{}, usageReads)
	for i, name := range tenants {
		u := &out.Tenants[i]
		*u = api.TenantUsage{Tenant: name, Limits: tenantLimits(s.keyring.Quota(name))}
		if w, ok := s.metrics.windows.Load(name); ok {
			u.BeginsPerS = w.perSecond(now)
		}
		if s.quota == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.tenantUsage(ctx, name, u)
		}()
	}
	wg.Wait()
	setOutcome(ctx, t, "usage")
	return out, nil
}

// usageReads bounds the tenants whose store figures GET /v1/usage reads
// at once.
const usageReads = 8

// tenantUsage fills u with tenant's figures from the limiter. When the
// store's cannot be read, u is marked StoreUnavailable and the answer goes
// on without them: one tenant's master down fails no other tenant, nor the
// console's sign-in.
func (s *Service) tenantUsage(ctx context.Context, tenant string, u *api.TenantUsage) {
	q, err := s.quota.Usage(ctx, tenant)
	if err != nil {
		unavailable := true
		u.StoreUnavailable = &unavailable
		s.log.WarnContext(ctx, "usage: the store's figures of a tenant are unavailable", slog.String("tenant", tenant), slog.Any("error", err))
	} else {
		u.StoredBytes, u.Waiters, u.InProgress = q.StoredBytes, q.Waiters, q.InProgress
	}
	u.Rejections = api.LimitCounts{
		BeginsPerS:    q.Rejections[quota.LimitRate],
		StoredBytes:   q.Rejections[quota.LimitStoredBytes],
		Waiters:       q.Rejections[quota.LimitWaiters],
		InProgress:    q.Rejections[quota.LimitInProgress],
		ReadBytesPerS: q.Rejections[quota.LimitReadBytes],
	}
}

// tenantLimits is l as the API shows it: absent for unlimited.
func tenantLimits(l auth.Quota) api.TenantLimits {
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
