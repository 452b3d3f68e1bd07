// SPDX-License-Identifier: Apache-2.0

// Package lua holds the Redis scripts that make up idemsvc's state machine.
//
// Each transition is one .lua file that opens with its contract (KEYS, ARGV,
// reply). record.lua, the record codec, is prepended to each of them. Every
// script touches only KEYS[1] and reads the time from Redis. The scripts that
// end an attempt publish it on the record's channel (record.lua's announce):
// Plain with PUBLISH, for one node and Sentinel; Sharded with SPUBLISH, for a
// Cluster, where PUBLISH would reach every node.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed record.lua
var record string

//go:embed begin.lua
var begin string

//go:embed complete.lua
var complete string

//go:embed fail.lua
var fail string

//go:embed extend.lua
var extend string

//go:embed status.lua
var status string

//go:embed delete.lua
var del string

//go:embed stored_bytes.lua
var storedBytes string

//go:embed slot.lua
var slot string

//go:embed leases.lua
var leases string

// Scripts is one set of the transitions, ready for EVALSHA. Script.Run
// falls back to EVAL on NOSCRIPT.
type Scripts struct {
	Begin, Complete, Fail, Extend, Status, Delete *redis.Script
}

// The two sets: Plain publishes with PUBLISH (one node, Sentinel), Sharded
// with SPUBLISH on the record's slot (Cluster).
var (
	Plain   = scripts("PUBLISH")
	Sharded = scripts("SPUBLISH")
)

func scripts(publish string) *Scripts {
	head := "local PUBLISH = '" + publish + "'\n" + record
	return &Scripts{
		Begin:    redis.NewScript(head + begin),
		Complete: redis.NewScript(head + complete),
		Fail:     redis.NewScript(head + fail),
		Extend:   redis.NewScript(head + extend),
		Status:   redis.NewScript(head + status),
		Delete:   redis.NewScript(head + del),
	}
}

// The Plain scripts under their own names.
var (
	Begin    = Plain.Begin
	Complete = Plain.Complete
	Fail     = Plain.Fail
	Extend   = Plain.Extend
	Status   = Plain.Status
)

// The scripts of tenant limits (internal/quota), which use no record.
var (
	StoredBytes = redis.NewScript(storedBytes)
	Slot        = redis.NewScript(slot)
	Leases      = redis.NewScript(leases)
)
