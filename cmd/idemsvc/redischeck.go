// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// redisCheckInterval is how often every master is read again after start;
// redisRetryInterval, how often while some master cannot be read, so that
// a Redis reached only after start has its policy checked within a second.
var (
	redisCheckInterval = 30 * time.Second
	redisRetryInterval = time.Second
)

// redisChecker reads every Redis master for what can make it forget
// records: an evicting policy, no persistence.
type redisChecker struct {
	store         *statemachine.RedisStore
	allowEviction bool
	log           *slog.Logger
	warned        map[string]bool // nodes already warned about: no persistence, or unreadable
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
		switch {
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
