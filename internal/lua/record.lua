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

-- INLINE is the largest record a script reads whole. Reading a string into
-- Lua, and replying with it, costs Redis about 6 ms per MiB (measured with
-- redis-benchmark: EVAL of a GET of 1 MiB, 5.9 ms a call; GETRANGE of its
-- head and STRLEN, 11 us), during which it serves no one else: one
-- tenant's replays of large records would hold up every tenant's calls. A
-- larger record is read by its head (read_head); idemsvc reads its
-- response after the script, with GETRANGE (redisstore/read.go).
local INLINE = 65536

-- read_head returns the head of the record KEYS[1] (every field but the
-- response), read with GETRANGE, however long its strings.
local function read_head()
  local head = redis.call('GETRANGE', KEYS[1], 0, 1023)
  local pos = 69 -- the fixed part's 68 bytes, then four length-prefixed strings
  for i, width in ipairs({2, 2, 2, 4}) do
    if pos + width - 1 > #head then
      head = redis.call('GETRANGE', KEYS[1], 0, pos + width + 1022)
    end
    pos = pos + width + struct.unpack(width == 2 and '>I2' or '>I4', head, pos)
  end
  if pos - 1 > #head then
    return redis.call('GETRANGE', KEYS[1], 0, pos - 2)
  end
  return string.sub(head, 1, pos - 1)
end

-- read_record returns the record KEYS[1] and its whole length in bytes:
-- whole up to INLINE bytes, else its head only; nil when there is none.
local function read_record()
  local size = redis.call('STRLEN', KEYS[1])
  if size == 0 then return nil, 0 end
  if size <= INLINE then return redis.call('GET', KEYS[1]), size end
  return read_head(), size
end

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
