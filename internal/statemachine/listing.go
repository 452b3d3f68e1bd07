// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"time"
)

// ListRequest asks for a page of a tenant's records in one state.
type ListRequest struct {
	State     State
	OlderThan time.Duration // the last transition at least this long ago
	Limit     int           // records per page, 1–MaxListLimit; 0 is DefaultListLimit
	Cursor    string        // "" for the first page, then the last page's NextCursor
}

// ListPage is one page of a listing.
type ListPage struct {
	Records    []Record // without their responses
	NextCursor string   // "" once the listing is over
}

// Listing's page sizes.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ErrForeignCursor answers a cursor that no store of this kind gave.
var ErrForeignCursor error = &InvalidError{Field: "cursor", Reason: "is not a cursor this store gave"}

func CheckList(tenant string, req *ListRequest) error {
	if err := CheckTenant(tenant); err != nil {
		return err
	}
	switch req.State {
	case StateInProgress, StateCompleted, StateFailed:
	default:
		return invalid("state", "must be in_progress, completed or failed")
	}
	if req.OlderThan < 0 {
		return invalid("older_than_s", "must be 0 or more")
	}
	if req.Limit == 0 {
		req.Limit = DefaultListLimit
	}
	if req.Limit < 1 || req.Limit > MaxListLimit {
		return invalid("limit", "must be 1 to %d", MaxListLimit)
	}
	return nil
}

// Listed reports whether s belongs in a listing of req at time now: in the
// state asked for (a released record is not listed: it is gone for Begin
// too) and last changed at least req.OlderThan ago.
func Listed(s *Stored, req *ListRequest, now int64) bool {
	return s.state == req.State && !(s.state == StateFailed && s.retryable) &&
		s.updated <= now-req.OlderThan.Milliseconds()
}

// List implements Store: records sorted by key, the cursor being the last
// key of the page before.
func (m *MemoryStore) List(_ context.Context, tenant string, req ListRequest) (ListPage, error) {
	if err := CheckList(tenant, &req); err != nil {
		return ListPage{}, err
	}
	after := ""
	if req.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(req.Cursor)
		if err != nil || len(b) == 0 || b[0] != 'm' {
			return ListPage{}, ErrForeignCursor
		}
		after = string(b[1:])
	}
	m.mu.Lock()
	now := nowMs()
	var found []*Stored
	for k, s := range m.records {
		if k.tenant == tenant && s.key > after && s.expires >= now && Listed(s, &req, now) {
			found = append(found, s)
		}
	}
	page := ListPage{}
	slices.SortFunc(found, func(a, b *Stored) int { return strings.Compare(a.key, b.key) })
	if len(found) > req.Limit {
		found = found[:req.Limit]
		page.NextCursor = base64.RawURLEncoding.EncodeToString([]byte("m" + found[len(found)-1].key))
	}
	for _, s := range found {
		r, _ := s.Record(tenant, now, false, 0) // without the response, nothing to decode
		page.Records = append(page.Records, r)
	}
	m.mu.Unlock()
	return page, nil
}
