-- status.lua: read KEYS[1] with Redis's clock, for lease_expired.
--
-- KEYS[1]  the record
--
-- Reply {code, now_ms, record}:
--   OK          the record, response included
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
return {OK, now, raw}
