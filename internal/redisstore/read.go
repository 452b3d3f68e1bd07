// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// A record longer than the scripts read whole (INLINE in
// internal/lua/record.lua, 64 KiB) comes back from begin and status as its
// head and its length; readResponse reads the rest with GETRANGE, in
// chunks of readChunk bytes, in one pipeline. Redis serves each chunk as a
// short command (a GETRANGE of 64 KiB cost it 3 us, where a script that
// reads and returns 1 MiB cost it about 6 ms; see record.lua), so one
// tenant's replays of large records no longer hold up the others' calls.
const (
	readChunk = 64 << 10
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
// after the chunks, that the record is still the one whose head the script
// read (its head carries the attempt's random token and its times, so a
// record written anew has another) and as long.
func (s *Store) readResponse(ctx context.Context, key string, r *reply) error {
	head := int64(len(r.raw))
	if r.size <= head {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var chunks []*redis.StringCmd
	var again *redis.StringCmd
	var length *redis.IntCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for at := head; at < r.size; at += readChunk {
			chunks = append(chunks, p.GetRange(ctx, key, at, min(at+readChunk, r.size)-1))
		}
		again = p.GetRange(ctx, key, 0, head-1)
		length = p.StrLen(ctx, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: reading a response: %w", statemachine.ErrStoreUnavailable, err)
	}
	if again.Val() != r.raw || length.Val() != r.size {
		return errRecordChanged
	}
	var b strings.Builder
	b.Grow(int(r.size))
	b.WriteString(r.raw)
	for _, c := range chunks {
		b.WriteString(c.Val())
	}
	if int64(b.Len()) != r.size {
		return errRecordChanged
	}
	rec, err := statemachine.DecodeStored(b.String())
	if err != nil {
		return err
	}
	r.rec, r.raw = rec, ""
	return nil
}
