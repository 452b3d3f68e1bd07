-- complete.lua: store the response of the current attempt on KEYS[1].
--
-- KEYS[1]  the record
-- ARGV[1]  lease token of the attempt
-- ARGV[2]  the response (opaque bytes)
-- ARGV[3]  retention in s ('' keeps the one given to begin)
--
-- Publishes the attempt on KEYS[1] .. ':end' when it completes it (not on a
-- retried call), so that waiters wake.
--
-- A re-run of this call (the same call sent again) changes nothing but
-- still writes the record's expiry again (reaffirm, in record.lua), so that
-- WAIT on its connection confirms the first run's write.
--
-- Reply {code, now_ms, record head}:
--   OK          completed (or this token completed it before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished otherwise
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local state, recovered, retryable, attempt, created, updated, lease, expires,
  retention, token, call, owner, fingerprint, key, err, response_at = decode(raw)
if token ~= ARGV[1] then return {LEASE_LOST, now} end
if state == COMPLETED then -- a retried call
  reaffirm(expires)
  return {OK, now, string.sub(raw, 1, response_at - 1)}
end
if state ~= IN_PROGRESS then return {LEASE_LOST, now} end

if ARGV[3] ~= '' then retention = tonumber(ARGV[3]) end
expires = now + retention * 1000
local head = pack(COMPLETED, recovered, retryable, attempt, created, now,
  lease, expires, retention, token, call, owner, fingerprint, key, err)
store(head, ARGV[2], expires)
announce(attempt)
return {OK, now, head}
