// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/lua"
)

// NodeInfo is what one master told about itself in one round trip.
type NodeInfo struct {
	Addr string // host:port
	// Err is why the node could not be read; the other fields are then zero.
	Err error
	// Refused is CheckAuth when the node refused idemsvc's credentials
	// (the other fields are then zero), CheckPermissions when idemsvc's
	// ACL user may not send Denied (a command, as idemsvc sends it), and
	// "" otherwise.
	Refused, Denied string
	// Policy is maxmemory-policy, or "" when INFO hides it.
	Policy string
	// OutOfMemory: the node refuses writes for want of memory.
	OutOfMemory bool
	// Memory is what INFO told of the node's memory.
	Memory Memory
	// Persistent: AOF or RDB save points are on. PersistenceKnown is false
	// when neither INFO nor CONFIG told.
	Persistent, PersistenceKnown bool
	// Replicas is the number of connected replicas.
	Replicas int
}

// Evicting reports whether the node's policy may drop records: anything
// but noeviction, since records carry a TTL and volatile-* policies evict
// them too.
func (n *NodeInfo) Evicting() bool { return n.Memory.Evicting() }

// readinessTimeout bounds a readiness check, so that /readyz answers within
// 500 ms even when a node hangs.
const readinessTimeout = 400 * time.Millisecond

// Inspect reads every master: each master of a Cluster, Sentinel's current
// master, or the one node. Each gets one pipelined round trip: INFO, CONFIG
// GET save (for RDB save points, which INFO does not show), CLIENT INFO
// (for the node's address, which a Sentinel client does not know) and the
// permission probes (see probePermissions). A managed Redis that hides
// CONFIG or INFO leaves the fields it would have told unknown; a node that
// refuses idemsvc's credentials tells nothing.
func (s *Store) Inspect(ctx context.Context) []NodeInfo {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var nodes []NodeInfo
		err := c.ForEachMaster(ctx, func(ctx context.Context, shard *redis.Client) error {
			n := s.inspectNode(ctx, shard, shard.Options().Addr)
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return nil
		})
		if err != nil && len(nodes) == 0 {
			// The slot map itself could not be read: no node answered
			// CLUSTER SLOTS, or they refused it.
			n := NodeInfo{Addr: strings.Join(c.Options().Addrs, ",")}
			switch {
			case redis.IsAuthError(err):
				n.Refused = statemachine.CheckAuth
			case redis.IsPermissionError(err):
				n.Refused, n.Denied = statemachine.CheckPermissions, "CLUSTER SLOTS"
			default:
				n.Err = err
			}
			nodes = append(nodes, n)
		}
		return nodes
	}
	addr := ""
	if c, ok := s.client.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	return []NodeInfo{s.inspectNode(ctx, s.client, addr)}
}

func (s *Store) inspectNode(ctx context.Context, node redis.Cmdable, addr string) NodeInfo {
	var info *redis.StringCmd
	var save *redis.MapStringStringCmd
	var client *redis.ClientInfoCmd
	var probes []permissionProbe
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "memory", "persistence", "replication")
		save = p.ConfigGet(ctx, "save")
		client = p.ClientInfo(ctx)
		probes = s.probePermissions(ctx, p)
		return nil
	})
	n := NodeInfo{Addr: addr}
	if c := client.Val(); client.Err() == nil && c != nil && c.LAddr != "" {
		n.Addr = c.LAddr // the node's own address, also behind Sentinel
	}
	// Refusals are told apart by go-redis's typed errors, which it makes
	// from the reply's error code alone (NOAUTH and WRONGPASS, NOPERM):
	// idemsvc never reads the free text after the code. A refused login
	// fails every command of the pipeline, INFO included: that is not INFO
	// hidden by a managed Redis.
	if redis.IsAuthError(info.Err()) || redis.IsAuthError(err) {
		n.Refused = statemachine.CheckAuth
		return n
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
	for _, probe := range probes {
		// NOPERM only: a probe may also meet NOSCRIPT, MOVED (Redis checks
		// the ACL before it redirects) or OOM, which say nothing of the
		// ACL.
		if redis.IsPermissionError(probe.cmd.Err()) {
			n.Refused, n.Denied = statemachine.CheckPermissions, probe.what
			break
		}
	}
	text := info.Val()
	n.Memory = memoryOf(text)
	n.Policy = n.Memory.Policy
	n.OutOfMemory = n.Memory.OutOfMemory()
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

// probeKey is a key in the records' key space (idem:*) that no record
// has: a record's hash tag holds tenant:digest, with a colon. The probes
// name it and its channel, so that an ACL's key and channel patterns are
// checked as for a record.
const probeKey = "idem:{idemsvc-probe}"

// permissionProbe is one command sent to learn whether the ACL lets
// idemsvc send what it names.
type permissionProbe struct {
	what string // as the readiness detail names it
	cmd  redis.Cmder
}

// probePermissions queues, on p, one command of each kind that idemsvc
// sends, each in a form that changes nothing: EVALSHA of the status script
// and EVAL of one that returns 0 (@scripting: EVAL reloads the scripts
// after a restart empties the cache; the ACL checks the key too), SET ...
// XX of probeKey and of each of Options.ProbeKeys, which never exist
// (@write), a PUBLISH (SPUBLISH in a Cluster) on probeKey's channel, which
// nobody subscribes to (the ACL's channels), and, with WaitReplicas,
// WAIT 0 1, which returns at once. Redis checks a command against the ACL
// before anything else (before a redirect, NOSCRIPT or OOM), and answers
// NOPERM. The commands a script runs are checked only as it runs them, and
// a refusal there comes back as a plain ERR; so the probes send them
// directly. SUBSCRIBE is not probed: it would turn the pipeline's
// connection into a subscriber's.
func (s *Store) probePermissions(ctx context.Context, p redis.Pipeliner) []permissionProbe {
	publish := "PUBLISH"
	if s.scripts == lua.Sharded {
		publish = "SPUBLISH"
	}
	probes := []permissionProbe{
		{"EVALSHA (scripts)", s.scripts.Status.EvalSha(ctx, p, []string{probeKey})},
		{"EVAL (scripts, reloaded after a restart)", p.Eval(ctx, "return 0", []string{probeKey})},
		{"SET (writes) on idem:* keys", p.Do(ctx, "SET", probeKey, "", "XX")},
		{publish + " on idem:* channels", p.Do(ctx, publish, probeKey+endSuffix, "")},
	}
	for _, key := range s.probeKeys {
		probes = append(probes, permissionProbe{"SET (writes) on " + key, p.Do(ctx, "SET", key, "", "XX")})
	}
	if s.waitReplicas > 0 {
		probes = append(probes, permissionProbe{"WAIT (IDEMSVC_REDIS_WAIT_REPLICAS)", p.Do(ctx, "WAIT", 0, 1)})
	}
	return probes
}

// Memory is a master's memory, as INFO memory tells it.
type Memory struct {
	Known bool // INFO answered
	// Max is maxmemory, 0 for none; Counted is what Redis compares with
	// it before a write that may grow memory (getMaxmemoryState): used
	// memory less what eviction does not count (replication and AOF
	// buffers).
	Max, Counted int64
	Policy       string // maxmemory-policy
}

func memoryOf(info string) Memory {
	m := Memory{Known: info != "", Policy: infoLine(info, "maxmemory_policy")}
	m.Max, _ = strconv.ParseInt(infoLine(info, "maxmemory"), 10, 64)
	used, _ := strconv.ParseInt(infoLine(info, "used_memory"), 10, 64)
	notCounted, _ := strconv.ParseInt(infoLine(info, "mem_not_counted_for_evict"), 10, 64)
	m.Counted = used - notCounted
	return m
}

// Evicting reports whether the policy may drop records: anything but
// noeviction (unknown is not).
func (m Memory) Evicting() bool { return m.Policy != "" && m.Policy != "noeviction" }

// Headroom is the memory free under maxmemory: negative when the node is
// over it, and math.MaxInt64 without maxmemory.
func (m Memory) Headroom() int64 {
	if m.Max <= 0 {
		return math.MaxInt64
	}
	return m.Max - m.Counted
}

// OutOfMemory reports what Redis decides before a write that may grow
// memory: with maxmemory set, over it, it refuses the write under
// noeviction. Reading INFO rather than writing a probe key needs no key in
// a slot the node serves, and changes nothing.
func (m Memory) OutOfMemory() bool {
	return m.Max > 0 && m.Policy == "noeviction" && m.Counted > m.Max
}

// Short reports whether the node has less room than reserve for the
// outcomes of the attempts in flight. Only a node that refuses writes when
// full (noeviction, with maxmemory) can refuse an outcome: an evicting one
// makes room by dropping records, which its own check refuses.
func (m Memory) Short(reserve int64) bool {
	return m.Max > 0 && m.Policy == "noeviction" && m.Headroom() < reserve
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

// failure is one failed check of node.
func failure(check, node, detail string) statemachine.Failure {
	return statemachine.Failure{Check: check, Node: node, Detail: detail}
}

// Readiness reports every failed check of every master, read now and
// within readinessTimeout: none when the store is ready.
func (s *Store) Readiness(ctx context.Context) []statemachine.Failure {
	ctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	var failures []statemachine.Failure
	nodes := s.Inspect(ctx)
	slices.SortFunc(nodes, func(a, b NodeInfo) int { return strings.Compare(a.Addr, b.Addr) })
	for _, n := range nodes {
		switch {
		case n.Err != nil:
			failures = append(failures, failure(statemachine.CheckReachable, n.Addr, "the node did not answer"))
			continue
		case n.Refused == statemachine.CheckAuth:
			failures = append(failures, failure(statemachine.CheckAuth, n.Addr,
				"the node refuses idemsvc's credentials (WRONGPASS or NOAUTH): check IDEMSVC_REDIS_USERNAME and IDEMSVC_REDIS_PASSWORD, or the URL's"))
			continue
		case n.Refused == statemachine.CheckPermissions:
			failures = append(failures, failure(statemachine.CheckPermissions, n.Addr,
				"the ACL user may not send "+n.Denied+" (NOPERM): idemsvc needs @scripting, @read, @write and @pubsub on idem:* keys and channels"))
		}
		switch {
		case n.OutOfMemory:
			failures = append(failures, failure(statemachine.CheckWritable, n.Addr, "used memory is over maxmemory: writes are refused"))
		case n.Memory.Short(s.reserve):
			failures = append(failures, failure(statemachine.CheckReserve, n.Addr, fmt.Sprintf(
				"%d bytes free under maxmemory, under the reserve of %d (IDEMSVC_REDIS_RESERVE_BYTES): begins that would start an operation here are refused",
				max(n.Memory.Headroom(), 0), s.reserve)))
		}
		if n.Evicting() && !s.allowEviction {
			failures = append(failures, failure(statemachine.CheckEvictionPolicy, n.Addr,
				fmt.Sprintf("maxmemory-policy is %s; idemsvc needs noeviction", n.Policy)))
		}
		if n.Replicas < s.waitReplicas {
			failures = append(failures, failure(statemachine.CheckReplicas, n.Addr,
				fmt.Sprintf("%d replicas connected; IDEMSVC_REDIS_WAIT_REPLICAS is %d", n.Replicas, s.waitReplicas)))
		}
	}
	return failures
}
