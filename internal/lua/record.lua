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

local IN_PROGRESS, COMPLETED, FAILED = 1, 2, 3
-- Reply codes: the first element of every reply (statemachine/redis.go).
local OK, BUSY, DONE, MISMATCH, LEASE_LOST, NOT_FOUND = 0, 1, 2, 3, 4, 5
local LAYOUT = '>BBBBI4i8i8i8i8I4c16c8I2c0I2c0I2c0I4c0'
local NO_CALL = string.rep('\0', 8)

-- now_ms is Redis's clock in milliseconds: the one clock every replica shares.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- decode returns the record's fields (the response is left in raw).
local function decode(raw)
  local r = {}
  local version
  version, r.state, r.recovered, r.retryable, r.attempt, r.created, r.updated,
    r.lease, r.expires, r.retention, r.token, r.call, r.owner, r.fingerprint,
    r.key, r.error = struct.unpack(LAYOUT, raw)
  if version ~= 1 then error('idemsvc: unknown record version ' .. version) end
  return r
end

-- head encodes every field but the response.
local function head(r)
  return struct.pack(LAYOUT, 1, r.state, r.recovered, r.retryable, r.attempt,
    r.created, r.updated, r.lease, r.expires, r.retention, r.token, r.call,
    #r.owner, r.owner, #r.fingerprint, r.fingerprint, #r.key, r.key,
    #r.error, r.error)
end

-- save stores head .. response until r.expires (Redis expiry is the retention).
local function save(r, response)
  local h = head(r)
  redis.call('SET', KEYS[1], h .. response, 'PXAT', r.expires)
  return h
end

