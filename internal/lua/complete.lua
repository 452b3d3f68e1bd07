-- complete.lua: store the response of the current attempt on KEYS[1].
--
-- KEYS[1]  the record
-- ARGV[1]  lease token of the attempt
-- ARGV[2]  the response (opaque bytes)
-- ARGV[3]  retention in s ('' keeps the one given to begin)
--
-- Reply {code, now_ms, record head}:
--   OK          completed (or this token completed it before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished otherwise
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local r = decode(raw)
if r.token ~= ARGV[1] then return {LEASE_LOST, now} end
if r.state == COMPLETED then return {OK, now, head(r)} end -- a retried call
if r.state ~= IN_PROGRESS then return {LEASE_LOST, now} end

if ARGV[3] ~= '' then r.retention = tonumber(ARGV[3]) end
r.state, r.updated, r.expires = COMPLETED, now, now + r.retention * 1000
return {OK, now, save(r, ARGV[2])}
