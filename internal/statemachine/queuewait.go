// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"context"
	"time"
)

// queueWaitKey is the context key of WithQueueWait.
type queueWaitKey struct{}

// WithQueueWait marks the store calls made with ctx as those of a caller
// that waits up to d anyway (a begin with wait_ms, the reads of a waited
// key): a store that sheds calls under overload (the Redis store) queues
// them instead, for a slot, up to the smaller of d and its timeout.
func WithQueueWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, queueWaitKey{}, d)
}

// QueueWait is the wait WithQueueWait gave ctx, if it gave one.
func QueueWait(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(queueWaitKey{}).(time.Duration)
	return d, ok
}

// streamedBodiesKey is the context key of WithStreamedBodies.
type streamedBodiesKey struct{}

// WithStreamedBodies marks the reads made with ctx (the replay of a begin,
// a status with its response) as those of a caller that writes a body as
// it decodes it: a store that keeps bodies compressed answers a long one
// as its frame (Response.Zstd, OpenBody) rather than decoded whole.
func WithStreamedBodies(ctx context.Context) context.Context {
	return context.WithValue(ctx, streamedBodiesKey{}, true)
}

// StreamedBodies reports whether WithStreamedBodies marked ctx.
func StreamedBodies(ctx context.Context) bool {
	ok, _ := ctx.Value(streamedBodiesKey{}).(bool)
	return ok
}
