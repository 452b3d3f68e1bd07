// SPDX-License-Identifier: Apache-2.0

package statemachine

import "math"

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
