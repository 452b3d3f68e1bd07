// SPDX-License-Identifier: Apache-2.0

// Package statemachine is idemsvc's domain: the record kept per (tenant,
// key), its states, the transitions that move it, the limits a request
// must keep, and the record's stored form (the codec the Lua scripts of
// internal/lua share).
//
// A caller brackets one operation with Begin and then Complete or Fail.
// Begin either acquires a Lease, replays a finished Record, or refuses with
// ErrInProgress or ErrFingerprintMismatch. Complete, Fail and Extend are
// fenced by the lease token of the current attempt: a token of an earlier
// attempt gets ErrLeaseLost and changes nothing, and a retried call with the
// current token answers as the first did. One retry cannot: once a retryable
// Fail released the key and another Begin acquired it, the old token is an
// earlier attempt's, and a retry of that Fail gets ErrLeaseLost.
//
// Two Stores implement it with the same behaviour: the Redis adapter
// (package internal/redisstore) runs each transition as one Lua script,
// and MemoryStore keeps records in process for development and tests. All
// times come from one clock: Redis's, or the process's for MemoryStore.
// This package imports no Redis client; the adapter calls its exported
// checks (Limits.CheckBegin and the like) and codec (DecodeStored,
// EncodeResponse) so that each rule is stated once, here.
package statemachine
