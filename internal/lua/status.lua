-- status.lua: read KEYS[1] with Redis's clock, for lease_expired.
--
-- KEYS[1]  the record
--
-- Reply {code, now_ms, record[, size]}:
--   OK          the record, response included, if it is no longer than
--               INLINE; otherwise its head only, and size, its whole
--               length (idemsvc reads the response itself)
--   NOT_FOUND   no record
local now = now_ms()
local raw, size = read_record()
if not raw then return {NOT_FOUND, now} end
if #raw < size then return {OK, now, raw, size} end
return {OK, now, raw}
