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
-- Reply {code, now_ms, record head}:
--   OK          failed (or this token failed it before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished otherwise
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local r = decode(raw)
if r.token ~= ARGV[1] then return {LEASE_LOST, now} end
if r.state == FAILED then return {OK, now, head(r)} end -- a retried call
if r.state ~= IN_PROGRESS then return {LEASE_LOST, now} end

if ARGV[5] ~= '' then r.retention = tonumber(ARGV[5]) end
r.state, r.retryable, r.error = FAILED, tonumber(ARGV[2]), ARGV[3]
r.updated, r.expires = now, now + r.retention * 1000
return {OK, now, save(r, ARGV[4])}
