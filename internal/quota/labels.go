// SPDX-License-Identifier: Apache-2.0

package quota

import "sync"

// MaxTenantLabels is how many tenants get metric series of their own in
// one process; the tenants seen after them are counted under the tenant
// label OtherTenant. Without a tenants file an admin may name any tenant,
// and with one the file may list any number: either way each name would
// add series of its own.
const MaxTenantLabels = 1000

// OtherTenant is the tenant label of the tenants past MaxTenantLabels.
const OtherTenant = "other"

// TenantLabels gives tenants their metric label: their name for the first
// MaxTenantLabels tenants seen, OtherTenant after. The zero value is ready
// to use; it is safe for concurrent use.
type TenantLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// Of returns tenant's label. Call it when making a tenant's series, not on
// every request: it takes a lock.
func (t *TenantLabels) Of(tenant string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.seen[tenant]; ok {
		return tenant
	}
	if len(t.seen) >= MaxTenantLabels {
		return OtherTenant
	}
	if t.seen == nil {
		t.seen = make(map[string]struct{})
	}
	t.seen[tenant] = struct{}{}
	return tenant
}
