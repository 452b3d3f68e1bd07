-- extend.lua: push the lease of the current attempt on KEYS[1].
--
-- KEYS[1]  the record
-- ARGV[1]  lease token of the attempt
-- ARGV[2]  call id: 8 random bytes naming this call
-- ARGV[3]  lease in ms, counted from now
--
-- A holder whose lease ran out may extend while nobody has taken over.
-- A re-run of this call (the same call sent again) changes nothing but
-- still writes the record's expiry again (reaffirm, in record.lua), so that
-- WAIT on its connection confirms the first run's write.
--
-- Reply {code, now_ms, record head}:
--   OK          extended (or this call ran before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local state, recovered, retryable, attempt, created, _, _, expires, retention,
  token, call, owner, fingerprint, key, err = decode(raw)
if token ~= ARGV[1] or state ~= IN_PROGRESS then return {LEASE_LOST, now} end
if call == ARGV[2] then -- re-sent (in progress: raw is the head)
  reaffirm(expires)
  return {OK, now, raw}
end

local lease = now + tonumber(ARGV[3])
expires = lease + retention * 1000
local head = pack(IN_PROGRESS, recovered, retryable, attempt, created, now,
  lease, expires, retention, token, ARGV[2], owner, fingerprint, key, err)
store(head, '', expires)
return {OK, now, head}
