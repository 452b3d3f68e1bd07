-- extend.lua: push the lease of the current attempt on KEYS[1].
--
-- KEYS[1]  the record
-- ARGV[1]  lease token of the attempt
-- ARGV[2]  call id: 8 random bytes naming this call
-- ARGV[3]  lease in ms, counted from now
--
-- A holder whose lease ran out may extend while nobody has taken over.
-- Reply {code, now_ms, record head}:
--   OK          extended (or this call ran before: same answer)
--   LEASE_LOST  the token is not the current attempt's, or it finished
--   NOT_FOUND   no record
local now = now_ms()
local raw = redis.call('GET', KEYS[1])
if not raw then return {NOT_FOUND, now} end
local r = decode(raw)
if r.token ~= ARGV[1] or r.state ~= IN_PROGRESS then return {LEASE_LOST, now} end
if r.call == ARGV[2] then return {OK, now, head(r)} end -- go-redis re-sent this call

r.call, r.updated, r.lease = ARGV[2], now, now + tonumber(ARGV[3])
r.expires = r.lease + r.retention * 1000
return {OK, now, save(r, '')}
