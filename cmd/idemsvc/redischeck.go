// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// redisCheckInterval is how often every master is read again after start;
// redisRetryInterval, how often while some master cannot be read, so that
// a Redis reached only after start has its policy checked within a second;
// roomCheckInterval, how often every master's memory and policy are read
// for the gates of new attempts (redisstore.Store.RefreshRoom).
var (
	redisCheckInterval = 30 * time.Second
	redisRetryInterval = time.Second
	roomCheckInterval  = time.Second
)

// redisChecker reads every Redis master for what can make it forget
// records: an evicting policy, no persistence.
type redisChecker struct {
	store         *redisstore.Store
	allowEviction bool
	log           *slog.Logger
	warned        map[string]bool // nodes already warned about: no persistence, or unreadable
	refused       map[string]bool // nodes whose refusal (auth, permissions) is logged, until it ends
	every, retry  time.Duration   // redisCheckInterval and redisRetryInterval when it was built
}

// errEvicting is the refusal to start on a master that may evict records.
type errEvicting struct{ node, policy string }

func (e *errEvicting) Error() string {
	return fmt.Sprintf("Redis node %s has maxmemory-policy %s, which drops records under memory pressure "+
		"(records carry a TTL, so volatile-* policies drop them too) and lets duplicates run again: "+
		"set maxmemory-policy noeviction, or IDEMSVC_REDIS_ALLOW_EVICTION=true to serve anyway", e.node, e.policy)
}

// check reads every master once. At start, an evicting policy is an error
// unless allowed; later it is logged as one, and /readyz fails. It reports
// whether every master could be read.
func (c *redisChecker) check(ctx context.Context, atStart bool) (allRead bool, err error) {
	nodes := c.store.Inspect(ctx)
	allRead = len(nodes) > 0
	for _, n := range nodes {
		if n.Err != nil {
			allRead = false
			continue // /readyz reports it; the next check reads it again
		}
		c.logRefusal(n)
		switch {
		case n.Refused == statemachine.CheckAuth:
			allRead = false // nothing else is known of it
		case n.Policy == "":
			c.warnOnce(n.Addr, "the eviction policy of a Redis node cannot be read (CONFIG and INFO hidden); make sure it is noeviction", "node", n.Addr)
		case n.Evicting() && c.allowEviction:
			c.warnOnce(n.Addr+" policy", "IDEMSVC_REDIS_ALLOW_EVICTION: serving on a Redis node whose policy may drop records, so duplicates of a dropped key run again", "node", n.Addr, "policy", n.Policy)
		case n.Evicting() && atStart:
			return false, &errEvicting{n.Addr, n.Policy}
		case n.Evicting():
			c.log.Error("a Redis node's eviction policy may drop records; /readyz fails until it is noeviction", "node", n.Addr, "policy", n.Policy)
		}
		if n.PersistenceKnown && !n.Persistent {
			c.warnOnce(n.Addr+" persistence", "a Redis master keeps no AOF and no RDB snapshots: a restart forgets every record", "node", n.Addr)
		}
	}
	return allRead, nil
}

// logRefusal logs, once until it ends, that a node refuses idemsvc's
// credentials or commands: every call to it fails until an operator acts.
func (c *redisChecker) logRefusal(n redisstore.NodeInfo) {
	if n.Refused == "" {
		if c.refused[n.Addr] {
			delete(c.refused, n.Addr)
			c.log.Info("a Redis node accepts idemsvc's credentials and commands again", "node", n.Addr)
		}
		return
	}
	if c.refused[n.Addr] {
		return
	}
	c.refused[n.Addr] = true
	switch n.Refused {
	case statemachine.CheckAuth:
		c.log.Error("a Redis node refuses idemsvc's credentials (WRONGPASS or NOAUTH): every call to it fails, and /readyz fails with auth, until IDEMSVC_REDIS_USERNAME and IDEMSVC_REDIS_PASSWORD (or the URL's) are right", "node", n.Addr)
	case statemachine.CheckPermissions:
		c.log.Error("the ACL user of a Redis node may not send what idemsvc sends (NOPERM): calls to it fail, and /readyz fails with permissions, until the ACL allows it", "node", n.Addr, "denied", n.Denied)
	}
}

func (c *redisChecker) warnOnce(id, msg string, args ...any) {
	if !c.warned[id] {
		c.warned[id] = true
		c.log.Warn(msg, args...)
	}
}

// watch checks again until ctx ends, so that a policy changed at run time
// or a new master after a failover are read too: every c.every, or every
// c.retry while a master cannot be read (allRead is what the check at
// start found).
func (c *redisChecker) watch(ctx context.Context, allRead bool) {
	for {
		wait := c.every
		if !allRead {
			wait = c.retry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		allRead, _ = c.check(checkCtx, false)
		cancel()
	}
}

// watchRoom reads every master's memory and policy every interval until
// ctx ends, so that begins that would acquire on a master short of its
// reserve, or with an evicting policy, are refused within about that
// interval of the change; it logs each master's gate as it shuts and opens.
func watchRoom(ctx context.Context, store *redisstore.Store, interval time.Duration, log *slog.Logger) {
	shut := map[string]bool{}
	for {
		refreshCtx, cancel := context.WithTimeout(ctx, roomReadTimeout)
		rooms := store.RefreshRoom(refreshCtx)
		cancel()
		for _, r := range rooms {
			switch {
			case r.Refusal != nil && !shut[r.Node]:
				shut[r.Node] = true
				log.Warn("begins that would start an operation on a Redis master are refused (503) until it has room and a noeviction policy", "node", r.Node, "reason", r.Refusal.Error())
			case r.Refusal == nil && r.Err == nil && shut[r.Node]:
				delete(shut, r.Node)
				log.Info("a Redis master takes new operations again", "node", r.Node)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// roomReadTimeout bounds one reading of every master's memory.
const roomReadTimeout = time.Second

// headroomCollector exports each master's free memory under maxmemory as
// the last RefreshRoom read it: idemsvc_redis_headroom_bytes{node}, +Inf
// without maxmemory, and no series for a master whose INFO is not known.
type headroomCollector struct{ store *redisstore.Store }

var headroomDesc = prometheus.NewDesc("idemsvc_redis_headroom_bytes",
	"Free memory under maxmemory of each Redis master, read every second (+Inf without maxmemory); below IDEMSVC_REDIS_RESERVE_BYTES, begins that would start an operation there get 503.",
	[]string{"node"}, nil)

func (headroomCollector) Describe(ch chan<- *prometheus.Desc) { ch <- headroomDesc }

func (h headroomCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range h.store.Rooms() {
		if r.Err != nil || !r.Memory.Known {
			continue
		}
		v := math.Inf(1)
		if r.Memory.Max > 0 {
			v = float64(r.Memory.Headroom())
		}
		ch <- prometheus.MustNewConstMetric(headroomDesc, prometheus.GaugeValue, v, r.Node)
	}
}
