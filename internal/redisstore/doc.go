// SPDX-License-Identifier: Apache-2.0

// Package redisstore keeps idemsvc's records in Redis: one node, Sentinel
// or Cluster. Store implements statemachine.Store: each transition is one
// Lua script (package internal/lua) run on the record's key over a go-redis
// client, with the domain's checks and record codec.
//
// Beside the transitions, the package holds what only Redis needs: the
// key naming (keys.go), watches over sharded pub/sub (watch.go),
// pipelined batches (batch.go), retries while Redis fails over
// (failover.go), readiness and memory checks (health.go), the reserve of
// room for outcomes (room.go), and List, which SCANs every master (never
// KEYS) and reads only each record's head, not its stored response.
package redisstore
