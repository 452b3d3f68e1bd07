// SPDX-License-Identifier: Apache-2.0

package statemachine

import "math"

// StoreBodiesRaw makes every store keep bodies as sent, as idemsvc did
// before it compressed them, until the returned function restores the
// threshold: for the benchmarks that compare the two. Not for parallel
// tests.
func StoreBodiesRaw() (restore func()) {
	old := compressMinBytes
	compressMinBytes = math.MaxInt
	return func() { compressMinBytes = old }
}
