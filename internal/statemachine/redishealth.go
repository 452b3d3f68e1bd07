// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The checks a master can fail; the names /readyz reports.
const (
	CheckReachable      = "reachable"
	CheckWritable       = "writable"
	CheckEvictionPolicy = "eviction_policy"
	CheckReplicas       = "replicas"
)

// Failure is one failed readiness check of one node.
type Failure struct {
	Check  string // one of the Check* names
	Node   string // host:port
	Detail string // what was found; never a secret
}

// NodeInfo is what one master told about itself in one round trip.
type NodeInfo struct {
	Addr string // host:port
	// Err is why the node could not be read; the other fields are then zero.
	Err error
	// Policy is maxmemory-policy, or "" when INFO hides it.
	Policy string
	// OutOfMemory: the node refuses writes for want of memory.
	OutOfMemory bool
	// Persistent: AOF or RDB save points are on. PersistenceKnown is false
	// when neither INFO nor CONFIG told.
	Persistent, PersistenceKnown bool
	// Replicas is the number of connected replicas.
	Replicas int
}

// Evicting reports whether the node's policy may drop records: anything
// but noeviction, since records carry a TTL and volatile-* policies evict
// them too.
func (n *NodeInfo) Evicting() bool { return n.Policy != "" && n.Policy != "noeviction" }

// readinessTimeout bounds a readiness check, so that /readyz answers within
// 500 ms even when a node hangs.
const readinessTimeout = 400 * time.Millisecond

// Inspect reads every master: each master of a Cluster, Sentinel's current
// master, or the one node. Each gets one pipelined round trip: INFO, CONFIG
// GET save (for RDB save points, which INFO does not show) and CLIENT INFO
// (for the node's address, which a Sentinel client does not know). A
// managed Redis that hides CONFIG or INFO leaves the fields it would have
// told unknown.
func (s *RedisStore) Inspect(ctx context.Context) []NodeInfo {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var nodes []NodeInfo
		err := c.ForEachMaster(ctx, func(ctx context.Context, shard *redis.Client) error {
			n := inspectNode(ctx, shard, shard.Options().Addr)
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return nil
		})
		if err != nil && len(nodes) == 0 {
			// The slot map itself could not be read.
			nodes = append(nodes, NodeInfo{Addr: strings.Join(c.Options().Addrs, ","), Err: err})
		}
		return nodes
	}
	addr := ""
	if c, ok := s.client.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	return []NodeInfo{inspectNode(ctx, s.client, addr)}
}

func inspectNode(ctx context.Context, node redis.Cmdable, addr string) NodeInfo {
	var info *redis.StringCmd
	var save *redis.MapStringStringCmd
	var client *redis.ClientInfoCmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "memory", "persistence", "replication")
		save = p.ConfigGet(ctx, "save")
		client = p.ClientInfo(ctx)
		return nil
	})
	n := NodeInfo{Addr: addr}
	if c := client.Val(); client.Err() == nil && c != nil && c.LAddr != "" {
		n.Addr = c.LAddr // the node's own address, also behind Sentinel
	}
	if info.Err() != nil {
		if !isReplyError(info.Err()) {
			n.Err = info.Err() // no answer: INFO hidden is a reply error
			return n
		}
	} else if err != nil && !isReplyError(err) {
		n.Err = err
		return n
	}
	text := info.Val()
	n.Policy = infoLine(text, "maxmemory_policy")
	n.OutOfMemory = outOfMemory(text)
	n.Replicas, _ = strconv.Atoi(infoLine(text, "connected_slaves"))
	aof := infoLine(text, "aof_enabled")
	if points, ok := save.Val()["save"]; ok && save.Err() == nil {
		n.PersistenceKnown = true
		n.Persistent = aof == "1" || strings.TrimSpace(points) != ""
	} else if aof == "1" {
		n.PersistenceKnown, n.Persistent = true, true
	}
	return n
}

// outOfMemory reports what Redis decides before a write that may grow
// memory (getMaxmemoryState): with maxmemory set, used memory less what
// eviction does not count, over maxmemory, refuses the write under
// noeviction. Reading INFO rather than writing a probe key needs no key in
// a slot the node serves, and changes nothing.
func outOfMemory(info string) bool {
	limit, _ := strconv.ParseInt(infoLine(info, "maxmemory"), 10, 64)
	if limit <= 0 || infoLine(info, "maxmemory_policy") != "noeviction" {
		return false
	}
	used, _ := strconv.ParseInt(infoLine(info, "used_memory"), 10, 64)
	notCounted, _ := strconv.ParseInt(infoLine(info, "mem_not_counted_for_evict"), 10, 64)
	return used-notCounted > limit
}

// infoLine is the value of name in INFO's "name:value" lines.
func infoLine(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func isReplyError(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// Readiness reports every failed check of every master, read now and
// within readinessTimeout: none when the store is ready.
func (s *RedisStore) Readiness(ctx context.Context) []Failure {
	ctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	var failures []Failure
	nodes := s.Inspect(ctx)
	slices.SortFunc(nodes, func(a, b NodeInfo) int { return strings.Compare(a.Addr, b.Addr) })
	for _, n := range nodes {
		switch {
		case n.Err != nil:
			failures = append(failures, Failure{CheckReachable, n.Addr, "the node did not answer"})
			continue
		case n.OutOfMemory:
			failures = append(failures, Failure{CheckWritable, n.Addr, "used memory is over maxmemory: writes are refused"})
		}
		if n.Evicting() && !s.allowEviction {
			failures = append(failures, Failure{CheckEvictionPolicy, n.Addr,
				fmt.Sprintf("maxmemory-policy is %s; idemsvc needs noeviction", n.Policy)})
		}
		if n.Replicas < s.waitReplicas {
			failures = append(failures, Failure{CheckReplicas, n.Addr,
				fmt.Sprintf("%d replicas connected; IDEMSVC_REDIS_WAIT_REPLICAS is %d", n.Replicas, s.waitReplicas)})
		}
	}
	return failures
}

// Readiness implements Store: the memory store is always ready.
func (*MemoryStore) Readiness(context.Context) []Failure { return nil }
