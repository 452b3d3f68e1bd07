-- record.lua: the record codec, prepended to every idemsvc script.
--
-- A record is one Redis string, so that it stays one compact allocation
-- whatever the size of the stored response (a hash with one field over
-- 64 bytes would switch to the larger hashtable encoding). Big-endian:
--
--   version u8 | state u8 | recovered u8 | retryable u8 | attempt u32 |
--   created_ms, updated_ms, lease_ms, expires_ms i64 | retention_s u32 |
--   token 16 bytes | call 8 bytes |
--   owner, fingerprint, key (u16 length + bytes) | error (u32 length + bytes) |
--   response: opaque bytes to the end of the string
--
-- internal/statemachine/codec.go is the Go side of this layout.
--
-- PUBLISH, defined by lua.go before this file, is 'SPUBLISH' in a Cluster
-- and 'PUBLISH' on one node or under Sentinel.

local IN_PROGRESS, COMPLETED, FAILED = 1, 2, 3
-- Reply codes: the first element of every reply (internal/redisstore/store.go).
local OK, BUSY, DONE, MISMATCH, LEASE_LOST, NOT_FOUND = 0, 1, 2, 3, 4, 5
local LAYOUT = '>BBBBI4i8i8i8i8I4c16c8I2c0I2c0I2c0I4c0'
local NO_CALL = '\0\0\0\0\0\0\0\0'

-- now_ms is Redis's clock in milliseconds: the one clock every replica shares.
local function now_ms()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
end

-- decode returns the record's fields in LAYOUT's order, the version checked
-- and left out, then where the response starts in raw:
--   state, recovered, retryable, attempt, created, updated, lease, expires,
--   retention, token, call, owner, fingerprint, key, err, response_at
-- Scripts keep them in locals: a table per call would cost more than the
-- rest of the script's Lua.
local function fields(version, ...)
  if version ~= 1 then error('idemsvc: unknown record version ' .. version) end
  return ...
end
local function decode(raw) return fields(struct.unpack(LAYOUT, raw)) end

-- pack encodes the fields, in decode's order, into a record head: all but
-- the response.
local function pack(state, recovered, retryable, attempt, created, updated,
    lease, expires, retention, token, call, owner, fingerprint, key, err)
  return struct.pack(LAYOUT, 1, state, recovered, retryable, attempt,
    created, updated, lease, expires, retention, token, call,
    #owner, owner, #fingerprint, fingerprint, #key, key, #err, err)
end

-- store writes head .. response, to expire at expires_ms (Redis expiry is
-- the retention). string.format's %d makes the expiry's string more cheaply
-- than Redis's conversion of a Lua number, which goes through printf's
-- floating-point formatting.
local function store(head, response, expires_ms)
  redis.call('SET', KEYS[1], head .. response, 'PXAT', string.format('%d', expires_ms))
end

-- reaffirm is the write of a re-run that changes nothing: the record's
-- expiry, set again to the same time. idemsvc sends WAIT after a script on
-- the same connection, and WAIT counts only that connection's writes; a
-- re-run on another connection that wrote nothing would let WAIT confirm at
-- once, before the replicas have the first run's write. Replicas confirm
-- writes in order, so confirming this one confirms the first run's too.
local function reaffirm(expires_ms)
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', expires_ms))
end

-- announce tells the waiters of KEYS[1] that its attempt `attempt` ended
-- (completed, failed, released, taken over or deleted): it publishes the
-- attempt on the record's channel, KEYS[1] .. ':end'. The channel is built
-- from the record's key, so it has the same hash tag and slot, and SPUBLISH
-- reaches only that slot's shard (PUBLISH in a Cluster would reach every
-- node). Redis 7.0 allows SPUBLISH in a script when the channel's slot is
-- served by the node running it.
local function announce(attempt)
  redis.call(PUBLISH, KEYS[1] .. ':end', string.format('%d', attempt))
end
