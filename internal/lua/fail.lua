-- fail.lua: end the current attempt on KEYS[1] with a failure.
--
-- KEYS[1]  the record
-- ARGV[1]  lease token of the attempt
-- ARGV[2]  '1' retryable (releases the key: the next begin acquires),
--          '0' terminal (begin replays it until retention ends)
-- ARGV[3]  error message for operators
-- ARGV[4]  the response to replay (opaque bytes)
-- ARGV[5]  retention in s ('' keeps the one given to begin)
--
-- Publishes the attempt on KEYS[1] .. ':end' when it fails it, retryably or
-- not (not on a retried call), so that waiters wake.
--
-- A re-run of this call (the same call sent again) changes nothing but
-- still writes the record's expiry again (reaffirm, in record.lua), so that
-- WAIT on its connection confirms the first run's write.
--
-- Reply {code, now_ms, record head}:
--   OK          failed (or this token failed it before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished otherwise
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local state, recovered, _, attempt, created, _, lease, expires, retention, token,
  call, owner, fingerprint, key, _, response_at = decode(raw)
if token ~= ARGV[1] then return {LEASE_LOST, now} end
if state == FAILED then -- a retried call
  reaffirm(expires)
  return {OK, now, string.sub(raw, 1, response_at - 1)}
end
if state ~= IN_PROGRESS then return {LEASE_LOST, now} end

if ARGV[5] ~= '' then retention = tonumber(ARGV[5]) end
expires = now + retention * 1000
local head = pack(FAILED, recovered, tonumber(ARGV[2]), attempt, created, now,
  lease, expires, retention, token, call, owner, fingerprint, key, ARGV[3])
store(head, ARGV[4], expires)
announce(attempt)
return {OK, now, head}
