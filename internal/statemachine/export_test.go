// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"math"
	"syscall"
	"time"
)

// CompressBodiesFrom makes every store compress bodies of n bytes and more
// (math.MaxInt: none, as idemsvc stored them before it compressed) until
// the returned function restores the threshold: for the benchmarks that
// compare. Not for parallel tests.
func CompressBodiesFrom(n int) (restore func()) {
	old := compressMinBytes
	compressMinBytes = n
	return func() { compressMinBytes = old }
}

// StoreBodiesRaw is CompressBodiesFrom(math.MaxInt).
func StoreBodiesRaw() (restore func()) { return CompressBodiesFrom(math.MaxInt) }

// ProcessCPU is the CPU time this process has spent since StartCPU, user
// and system: on a shared machine, a benchmark's own cost where its wall
// time also counts the time others had the cores.
type ProcessCPU struct{ start time.Duration }

// StartCPU starts counting.
func StartCPU() ProcessCPU { return ProcessCPU{cpuTime()} }

// Micros is the CPU spent since StartCPU, in µs.
func (c ProcessCPU) Micros() float64 { return float64(cpuTime()-c.start) / float64(time.Microsecond) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
