// SPDX-License-Identifier: Apache-2.0

package redisstore

import "github.com/redis/go-redis/v9"

// ClientOf is the store's Redis client, for tests that read a record's raw
// form.
func ClientOf(s *Store) redis.UniversalClient { return s.client }
