-- begin.lua: start an attempt on KEYS[1], or report why not.
--
-- KEYS[1]  the record
-- ARGV[1]  token: 16 random bytes; this call's id, and the lease token if it acquires
-- ARGV[2]  owner ('' for none)
-- ARGV[3]  fingerprint ('' for none)
-- ARGV[4]  lease in ms
-- ARGV[5]  retention in s
-- ARGV[6]  the client's key, kept in the record
--
-- Reply {code, now_ms, record}:
--   OK          acquired (or re-begun by the same owner, or this call ran before)
--   BUSY        someone else holds a live lease
--   DONE        completed, or failed terminally: replay the record
--   MISMATCH    the fingerprint differs (no record in the reply)
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
local old = raw and decode(raw)
if old then
  if ARGV[3] ~= '' and old.fingerprint ~= '' and old.fingerprint ~= ARGV[3] then
    return {MISMATCH, now}
  end
  if old.state == IN_PROGRESS then
    if old.token == ARGV[1] then return {OK, now, raw} end -- go-redis re-sent this call
    if old.lease > now then
      if ARGV[2] ~= '' and old.owner == ARGV[2] then return {OK, now, raw} end
      return {BUSY, now, raw}
    end
  elseif old.retryable == 0 then
    return {DONE, now, raw}
  end
end

-- Acquire: a new key, a released key, or an expired lease taken over. An
-- in-progress record outlives its lease by the retention, so that a takeover
-- still finds it and counts the attempt on.
local lease = now + tonumber(ARGV[4])
local retention = tonumber(ARGV[5])
local r = {
  state = IN_PROGRESS, recovered = 0, retryable = 0, attempt = 1,
  created = now, updated = now, lease = lease,
  expires = lease + retention * 1000, retention = retention,
  token = ARGV[1], call = NO_CALL, owner = ARGV[2], fingerprint = ARGV[3],
  key = ARGV[6], error = '',
}
if old then
  r.attempt, r.created = old.attempt + 1, old.created
  if old.state == IN_PROGRESS then r.recovered = 1 end
  if r.fingerprint == '' then r.fingerprint = old.fingerprint end
end
local h = save(r, '')
return {OK, now, h}
