-- delete.lua: forget the record KEYS[1] (an operator unsticking a key).
--
-- KEYS[1]  the record
--
-- Deleting a record in progress publishes its attempt on KEYS[1] .. ':end',
-- so that its waiters wake and begin again.
-- Reply {code, now_ms, record head}:
--   OK          deleted; the head of the record it was
--   NOT_FOUND   no record (a second run finds none: nothing changes)
local now = now_ms()
local raw = read_record()
if not raw then return {NOT_FOUND, now} end
local state, _, _, attempt, _, _, _, _, _, _, _, _, _, _, _, response_at = decode(raw)
redis.call('DEL', KEYS[1])
if state == IN_PROGRESS then announce(attempt) end
return {OK, now, string.sub(raw, 1, response_at - 1)}
