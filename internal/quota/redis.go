// SPDX-License-Identifier: Apache-2.0

package quota

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/lua"
)

// NewRedis returns a Limiter whose counts live in Redis, shared by every
// idemsvc instance using it:
//
//   - the begin rate is a GCRA in Redis (github.com/go-redis/redis_rate,
//     well kept and a single script per call); each instance takes begins
//     from it in small batches and spends them locally (see takeRate);
//   - the stored bytes are a hash per tenant of expiry minute -> bytes,
//     which each instance adds its deltas to once a second and reads the
//     total back from (internal/lua/stored_bytes.lua);
//   - the waiters are a sorted set per tenant of waiter id -> deadline
//     (internal/lua/slot.lua). A count per instance cannot bound the
//     tenant's waiters across instances; a shared counter would leak the
//     waiters of an instance that crashed, while a deadline per waiter
//     lapses by itself. A wait already costs a blocked request, so the two
//     calls (count, uncount) are cheap beside it, and no begin that does
//     not wait makes them;
//   - the leases held (in_progress) are a sorted set per tenant of lease
//     token -> the end of the lease plus a margin. Each instance reserves
//     tokens in it in batches (slot.lua, as many as the limit leaves room
//     for) and hands them to its begins, which acquire with them (see
//     Hold): on a Cluster the record and the tenant's set may be on two
//     masters, so the count cannot be taken in the begin's own script,
//     taking it after the begin acquired would need a second transition
//     to undo, and a call per begin would cost the begin path a round
//     trip. The end of a
//     lease (complete, fail, a begin that did not acquire) and its moves
//     (acquired, extended) reach the set with the flush, in one call per
//     tenant (internal/lua/leases.lua), so complete, fail and extend keep
//     their one round trip; until then the lease counts a little longer,
//     never shorter. A lease that expires without a complete drops out at
//     its end by itself.
//
// Every key is built here from the tenant, with the tenant in braces, so
// all of a tenant's limit keys share one hash slot and each call touches
// one key.
func NewRedis(client redis.UniversalClient, opts Options) Limiter {
	return newLimiter(&redisBackend{client: client, rate: redis_rate.NewLimiter(client)}, opts)
}

type redisBackend struct {
	client redis.UniversalClient
	rate   *redis_rate.Limiter
}

// limitKey is the Redis key of one of tenant's limits:
// idemq:{<tenant>}:<what>. redis_rate prefixes its keys with "rate:".
func limitKey(tenant, what string) string {
	var b strings.Builder
	b.Grow(len("idemq:{}:") + len(tenant) + len(what))
	b.WriteString("idemq:{")
	b.WriteString(tenant)
	b.WriteString("}:")
	b.WriteString(what)
	return b.String()
}

func (r *redisBackend) take(ctx context.Context, tenant string, l auth.Limits, n int) (int, time.Duration, error) {
	res, err := r.rate.AllowAtMost(ctx, limitKey(tenant, "begins"), redis_rate.Limit{
		Rate: int(l.BeginsPerS), Burst: int(l.Burst), Period: time.Second,
	}, n)
	if err != nil {
		return 0, 0, fmt.Errorf("begin rate: %w", err)
	}
	return res.Allowed, res.RetryAfter, nil
}

func (r *redisBackend) addBytes(ctx context.Context, tenant string, deltas map[int64]int64) (int64, time.Time, error) {
	args := make([]any, 0, 2*len(deltas))
	for minute, b := range deltas {
		args = append(args, minute, b)
	}
	v, err := lua.StoredBytes.Run(ctx, r.client, []string{limitKey(tenant, "bytes")}, args...).Int64Slice()
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("stored bytes: %w", err)
	}
	if len(v) != 2 {
		return 0, time.Time{}, fmt.Errorf("stored bytes: a reply of %d values", len(v))
	}
	var first time.Time
	if v[1] > 0 {
		first = time.UnixMilli(v[1])
	}
	return v[0], first, nil
}

func (r *redisBackend) addSlots(ctx context.Context, tenant, set string, ids []string, limit int64, ttl time.Duration) (int, error) {
	args := make([]any, 0, 2+len(ids))
	args = append(args, limit, strconv.FormatInt(ttl.Milliseconds(), 10))
	for _, id := range ids {
		args = append(args, id)
	}
	n, err := lua.Slot.Run(ctx, r.client, []string{limitKey(tenant, set)}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", set, err)
	}
	return int(min(n, int64(len(ids)))), nil
}

func (r *redisBackend) removeSlot(ctx context.Context, tenant, set, id string) error {
	if err := r.client.ZRem(ctx, limitKey(tenant, set), id).Err(); err != nil {
		return fmt.Errorf("%s: %w", set, err)
	}
	return nil
}

func (r *redisBackend) countSlots(ctx context.Context, tenant, set string) (int64, error) {
	// Members are scored by the Unix ms they are over at; this instance's
	// clock stands in for Redis's, a count for display only.
	n, err := r.client.ZCount(ctx, limitKey(tenant, set), strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf").Result()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", set, err)
	}
	return n, nil
}

func (r *redisBackend) settleLeases(ctx context.Context, tenant string, ends map[string]int64) error {
	args := make([]any, 0, 2*len(ends))
	for token, ms := range ends {
		args = append(args, token, ms)
	}
	if err := lua.Leases.Run(ctx, r.client, []string{limitKey(tenant, setLeases)}, args...).Err(); err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	return nil
}
