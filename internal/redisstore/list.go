// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"
)

// errStaleCursor answers a cursor whose node changed under it.
var errStaleCursor = &statemachine.InvalidError{Field: "cursor", Reason: "can no longer be followed (the store's nodes changed, by a failover or a restart); start the listing again"}

// redisCursor is where a listing on Redis stands: on which master (its
// address and run id, which changes with every restart; and for a Cluster
// the configuration epoch, which changes with failovers and slot moves),
// at which SCAN cursor, and after which key of that SCAN batch. Without a
// run id it is the start of the master Node.
type redisCursor struct {
	Node  string `json:"n,omitempty"`
	RunID string `json:"r"`
	Epoch string `json:"e,omitempty"`
	Scan  uint64 `json:"s"`
	After string `json:"a,omitempty"`
}

func (c redisCursor) encode() string {
	b, _ := json.Marshal(c) // plain strings and a number: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeRedisCursor(s string) (redisCursor, error) {
	var c redisCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &c) != nil || c.Node == "" && c.RunID == "" {
		return c, statemachine.ErrForeignCursor
	}
	return c, nil
}

// Listing's work per page on Redis: SCAN's COUNT, and how many SCAN calls
// one page may make before it answers with what it found (possibly
// nothing) and a cursor, so that a sparse tenant's page stays short.
const (
	listScanCount = 1000
	listScanCalls = 50
	// listHeadBytes covers the head of most records (68 bytes and the
	// owner, fingerprint, key and error, typically 100 to 300 bytes):
	// GETRANGE reads it without the response. A longer head (up to about
	// 1.9 KB with the default limits) is read on with GETRANGE, as far as
	// its length prefixes say, never into the response.
	listHeadBytes = 512
)

// List implements Store. It SCANs each master in turn (sorted by address)
// for the tenant's records, MATCH on their name's prefix, and reads each
// found record's head with GETRANGE, in one pipeline per SCAN batch, with
// the node's clock. SCAN returns every key present for the whole scan at
// least once; a cursor carries the node's run id, so one that outlived a
// restart or failover of its node is refused rather than followed.
func (s *Store) List(ctx context.Context, tenant string, req statemachine.ListRequest) (statemachine.ListPage, error) {
	if err := statemachine.CheckList(tenant, &req); err != nil {
		return statemachine.ListPage{}, err
	}
	var cur redisCursor
	if req.Cursor != "" {
		var err error
		if cur, err = decodeRedisCursor(req.Cursor); err != nil {
			return statemachine.ListPage{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	nodes, err := s.listNodes(ctx)
	if err != nil {
		return statemachine.ListPage{}, fmt.Errorf("%w: list: %w", statemachine.ErrStoreUnavailable, err)
	}
	i := 0
	if req.Cursor != "" {
		if i = slices.IndexFunc(nodes, func(n listNode) bool { return n.addr == cur.Node }); i < 0 {
			return statemachine.ListPage{}, errStaleCursor
		}
	}
	match := "idem:{" + tenant + ":*}"
	page := statemachine.ListPage{}
	calls := 0
	for ; i < len(nodes); i, cur = i+1, (redisCursor{}) {
		n := nodes[i]
		for {
			b, err := scanBatch(ctx, n, match, cur.Scan)
			if err != nil {
				return statemachine.ListPage{}, fmt.Errorf("%w: list: %w", statemachine.ErrStoreUnavailable, err)
			}
			if cur.RunID != "" && (b.runID != cur.RunID || b.epoch != cur.Epoch) {
				return statemachine.ListPage{}, errStaleCursor
			}
			calls++
			at := redisCursor{Node: n.addr, RunID: b.runID, Epoch: b.epoch, Scan: cur.Scan}
			for _, r := range b.records {
				if r.name <= cur.After || !statemachine.Listed(&r.s, &req, b.now) {
					continue
				}
				if len(page.Records) == req.Limit {
					// Full: the next page repeats this batch after the last key taken.
					page.NextCursor = at.encode()
					return page, nil
				}
				rec, _ := r.s.Record(tenant, b.now, false, 0)
				page.Records = append(page.Records, rec)
				at.After = r.name
			}
			cur = redisCursor{RunID: b.runID, Epoch: b.epoch, Scan: b.next}
			if b.next == 0 {
				break // this node is done
			}
			if calls == listScanCalls || len(page.Records) == req.Limit {
				page.NextCursor = redisCursor{Node: n.addr, RunID: b.runID, Epoch: b.epoch, Scan: b.next}.encode()
				return page, nil
			}
		}
		if len(page.Records) == req.Limit && i+1 < len(nodes) {
			page.NextCursor = redisCursor{Node: nodes[i+1].addr}.encode()
			return page, nil
		}
	}
	return page, nil
}

// listNode is one master as a listing sees it.
type listNode struct {
	addr   string // "" for the one master of a standalone or Sentinel setup
	client redis.Cmdable
	epoch  bool // a Cluster node: check the configuration epoch too
}

// listNodes returns the masters, sorted by address.
func (s *Store) listNodes(ctx context.Context) ([]listNode, error) {
	c, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []listNode{{client: s.client}}, nil
	}
	var mu sync.Mutex
	var nodes []listNode
	err := c.ForEachMaster(ctx, func(_ context.Context, shard *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, listNode{addr: shard.Options().Addr, client: shard, epoch: true})
		return nil
	})
	slices.SortFunc(nodes, func(a, b listNode) int { return strings.Compare(a.addr, b.addr) })
	return nodes, err
}

// scanned is one SCAN batch: the records found, sorted by name, with the
// node's identity and clock when it answered.
type scanned struct {
	runID, epoch string
	now          int64
	next         uint64
	records      []scannedRecord
}

type scannedRecord struct {
	name string
	s    statemachine.Stored
}

// scanBatch runs one SCAN on n with the node's run id, epoch and clock in
// the same pipeline, then reads the head of every record found in a
// second.
func scanBatch(ctx context.Context, n listNode, match string, from uint64) (scanned, error) {
	var b scanned
	var info *redis.StringCmd
	var epoch *redis.StringCmd
	var clock *redis.TimeCmd
	var scan *redis.ScanCmd
	_, err := n.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "server")
		if n.epoch {
			epoch = p.ClusterInfo(ctx)
		}
		clock = p.Time(ctx)
		scan = p.ScanType(ctx, from, match, listScanCount, "string")
		return nil
	})
	if err != nil {
		return b, err
	}
	b.runID = infoLine(info.Val(), "run_id")
	if epoch != nil {
		b.epoch = infoLine(epoch.Val(), "cluster_current_epoch")
	}
	b.now = clock.Val().UnixMilli()
	names, next := scan.Val()
	b.next = next
	if len(names) == 0 {
		return b, nil
	}
	slices.Sort(names)
	raws, err := readHeads(ctx, n.client, names)
	if err != nil {
		return b, err
	}
	for i, name := range names {
		if raws[i] == "" {
			continue // expired or deleted since the SCAN
		}
		s, err := statemachine.DecodeStored(raws[i])
		if err != nil {
			return b, fmt.Errorf("record %s: %w", strconv.Quote(name[:min(len(name), 8)]), err)
		}
		b.records = append(b.records, scannedRecord{name, s})
	}
	return b, nil
}

// readHeads reads the head of each record in names (owner, fingerprint, key
// and error included, the response never), "" for a record that is gone,
// with GETRANGE in one pipeline per step. The first step reads
// listHeadBytes of each; a longer head is read on up to where its length
// prefixes say it ends, in at most one more step per length prefix, so
// that what a listing holds is bounded by the heads whatever the sizes of
// the responses.
func readHeads(ctx context.Context, c redis.Cmdable, names []string) ([]string, error) {
	raws := make([]string, len(names))
	want := make([]int, len(names)) // bytes to read; 0 once the head is whole
	for i := range want {
		want[i] = listHeadBytes
	}
	cmds := make([]*redis.StringCmd, len(names))
	for range 1 + statemachine.HeadPrefixes {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, name := range names {
				if want[i] > 0 {
					cmds[i] = p.GetRange(ctx, name, 0, int64(want[i]-1))
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		more := false
		for i := range names {
			if want[i] == 0 {
				continue
			}
			raw := cmds[i].Val()
			n, whole := statemachine.HeadLength(raw)
			switch {
			case whole:
				raws[i], want[i] = raw[:n], 0
			case len(raw) < want[i]:
				// The record ended before its head did: gone, or replaced by
				// a shorter one since the last step; decoding says which.
				raws[i], want[i] = raw, 0
			default:
				want[i], more = n+listHeadBytes, true
			}
		}
		if !more {
			return raws, nil
		}
	}
	return nil, statemachine.ErrCorrupt // a head's length prefixes did not end within their count
}
