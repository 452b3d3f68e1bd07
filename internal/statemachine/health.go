// SPDX-License-Identifier: Apache-2.0

package statemachine

// The checks a master can fail; the names /readyz reports.
const (
	CheckReachable      = "reachable"
	CheckAuth           = "auth"
	CheckPermissions    = "permissions"
	CheckWritable       = "writable"
	CheckEvictionPolicy = "eviction_policy"
	CheckReserve        = "reserve"
	CheckReplicas       = "replicas"
)

// Failure is one failed readiness check of one node.
type Failure struct {
	Check  string // one of the Check* names
	Node   string // host:port
	Detail string // what was found; never a secret
}
