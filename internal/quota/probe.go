// SPDX-License-Identifier: Apache-2.0

package quota

// ProbeKeys are keys of the tenant limits' key spaces that no limit ever
// writes (no tenant's limits have the part "readiness-probe"): readiness
// sends SET ... XX to each, which changes nothing, to learn whether the
// ACL lets idemsvc write the limits' keys (idemq:* and redis_rate's
// rate:idemq:*).
func ProbeKeys() []string {
	key := limitKey("idemsvc-probe", "readiness-probe")
	return []string{key, "rate:" + key}
}
