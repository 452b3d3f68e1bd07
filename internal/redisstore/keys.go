// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Key returns the Redis key of tenant's record for the client's key:
// idem:{<tenant>:<hex sha256 of key>}. Only server-controlled parts and a
// digest make up the name, so no client key chooses a hash slot, and the
// braces keep any companion key of the record in the same slot.
func Key(tenant, key string) string {
	sum := sha256.Sum256([]byte(key))
	var b strings.Builder
	b.Grow(len("idem:{:}") + len(tenant) + 2*len(sum))
	b.WriteString("idem:{")
	b.WriteString(tenant)
	b.WriteByte(':')
	var digest [2 * sha256.Size]byte
	hex.Encode(digest[:], sum[:])
	b.Write(digest[:])
	b.WriteByte('}')
	return b.String()
}
