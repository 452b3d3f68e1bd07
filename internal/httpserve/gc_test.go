// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestLimitMemory: GOGC and the memory limit are set when the environment
// leaves them, and left as they are when it sets them.
func TestLimitMemory(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	limit := LimitMemory(1<<20, []string{"PATH=/bin"})
	if got := debug.SetGCPercent(100); got != DefaultGCPercent {
		t.Errorf("GOGC = %d, want %d", got, DefaultGCPercent)
	}
	if got := debug.SetMemoryLimit(-1); got != limit || limit > 1<<20+memoryHeadroom || limit <= 0 {
		t.Errorf("memory limit %d (returned %d), want at most %d", got, limit, 1<<20+memoryHeadroom)
	}

	debug.SetGCPercent(150)
	debug.SetMemoryLimit(1 << 30)
	if got := LimitMemory(1<<20, []string{"GOGC=150", "GOMEMLIMIT=1GiB"}); got != 1<<30 {
		t.Errorf("LimitMemory with GOMEMLIMIT set = %d, want the runtime's %d", got, 1<<30)
	}
	if got := debug.SetGCPercent(100); got != 150 {
		t.Errorf("GOGC = %d with GOGC set to 150", got)
	}
}
