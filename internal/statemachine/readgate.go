// SPDX-License-Identifier: Apache-2.0

package statemachine

import "context"

// readGateKey is the type of ReadGateKey.
type readGateKey struct{}

// ReadGateKey is the context key a ReadGate is found under. WithReadGate
// sets it; a caller's own context type may also answer it from its Value
// method, and so give each request a gate without a context of its own.
var ReadGateKey any = readGateKey{}

// A ReadGate admits the reading of a large stored response: a store that
// reads a record's response apart from its head (the Redis store, for a
// record over the size its scripts send whole) calls it first, and reads
// nothing when it returns an error, which the store's call then returns.
// It may be called more than once in one store call (a record that changed
// while read is read again): it admits the call's reads once.
type ReadGate interface {
	EnterRead(ctx context.Context) error
}

// WithReadGate makes the store calls made with ctx read large stored
// responses only once g admits them, so that the caller bounds the large
// reads in flight from their first byte, not only from when the store
// answered.
func WithReadGate(ctx context.Context, g ReadGate) context.Context {
	return context.WithValue(ctx, ReadGateKey, g)
}

// EnterRead passes the read gate WithReadGate gave ctx; without one it
// admits every read.
func EnterRead(ctx context.Context) error {
	if g, ok := ctx.Value(ReadGateKey).(ReadGate); ok {
		return g.EnterRead(ctx)
	}
	return nil
}
