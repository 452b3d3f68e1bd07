// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"runtime/debug"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGCPercent is the GOGC idemsvc and idemproxy run with unless GOGC
// is set. idemsvc's live heap is a few MB, so with Go's default of 100 it
// collects every few MB allocated, several hundred times a second under
// load; a larger GOGC lets the heap grow further between collections,
// bounded by the memory limit (LimitMemory). Chosen by measurement
// (make load-instructions, docs/performance.md, Shedding and CPU).
const DefaultGCPercent = 400

// memoryHeadroom is what a process needs beyond its bodies in flight: its
// code, stacks, connections' buffers and the records it encodes.
const memoryHeadroom = 64 << 20

// containerShare is the part of the container's memory limit (its cgroup's)
// that the runtime's soft limit may take: the rest is for what the runtime
// does not count (its own code, thread stacks, the kernel's buffers).
const containerShare = 0.9

// LimitMemory sets the garbage collector: GOGC to DefaultGCPercent unless
// GOGC (in env, KEY=value entries) sets it, and the runtime's soft memory
// limit, unless GOMEMLIMIT sets one, to the smaller of the budget plus
// memoryHeadroom and 90% of the container's memory limit, when there is one
// (read from the cgroup by automemlimit, a well-kept library that knows
// cgroup v1 and v2). Without a limit the runtime lets the heap grow to
// (1 + GOGC/100) times what was live at the last collection, and the bodies
// refused or served since are garbage counted in the resident set. It
// returns the limit in force.
func LimitMemory(budget int64, env []string) int64 {
	var gogc, limitSet bool
	for _, kv := range env {
		gogc = gogc || strings.HasPrefix(kv, "GOGC=")
		limitSet = limitSet || strings.HasPrefix(kv, "GOMEMLIMIT=")
	}
	if !gogc {
		debug.SetGCPercent(DefaultGCPercent)
	}
	if limitSet {
		return debug.SetMemoryLimit(-1)
	}
	limit := budget + memoryHeadroom
	if container, err := memlimit.FromCgroup(); err == nil && container > 0 {
		limit = min(limit, int64(float64(container)*containerShare))
	}
	debug.SetMemoryLimit(limit)
	return limit
}
