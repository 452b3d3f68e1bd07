// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// A record longer than the scripts read whole (INLINE in
// internal/lua/record.lua, 64 KiB) comes back from begin and status as its
// head and its length; readResponse reads the rest with one GETRANGE, and
// the head and length again, in one pipeline. Redis serves a GETRANGE of
// 1 MiB in about 0.4 ms (as GET: redis-benchmark, INFO commandstats),
// where a script that reads and returns 1 MiB held it for 6 to 8 ms (see
// record.lua), so one tenant's replays of large records no longer hold up
// the others' calls. One GETRANGE, not chunks: chunks cost Redis less
// still, but idemsvc would hold each record twice (the chunks and the
// string they make), and TestBoundedMemory's 300 replays in flight then
// passed its 300 MB.
const (
	// maxReads is how many times a begin or status reads a record that
	// changes while its response is read (deleted, expired, written
	// anew), before it answers store-unavailable.
	maxReads = 3
)

// errRecordChanged: the record changed between the script and the reading
// of its response.
var errRecordChanged = fmt.Errorf("%w: the record changed while its response was read", statemachine.ErrStoreUnavailable)

// readResponse completes r's record when the script sent its head only:
// it reads the response of the record key, and checks in the same pipeline,
// after it, that the record is still the one whose head the script read
// (its head carries the attempt's random token and its times, so a record
// written anew has another) and as long.
func (s *Store) readResponse(ctx context.Context, key string, r *reply) error {
	head := int64(len(r.raw))
	if r.size <= head {
		return nil
	}
	// The caller's read slot, taken before the read rather than after
	// it: a tenant's large reads in flight are bounded from the
	// GETRANGE on, so that the reads waiting for a slot hold neither
	// Redis's time, nor idemsvc's CPU, nor the response's bytes.
	if err := statemachine.EnterRead(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rest, again *redis.StringCmd
	var length *redis.IntCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		rest = p.GetRange(ctx, key, head, r.size-1)
		again = p.GetRange(ctx, key, 0, head-1)
		length = p.StrLen(ctx, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: reading a response: %w", statemachine.ErrStoreUnavailable, err)
	}
	if again.Val() != r.raw || length.Val() != r.size || int64(len(rest.Val())) != r.size-head {
		return errRecordChanged
	}
	r.rec.SetResponse(rest.Val())
	r.raw = ""
	return nil
}
