-- stored_bytes.lua: add a tenant's stored response bytes by the minute they
-- expire in, drop the minutes that are over, and sum the rest.
--
-- KEYS[1]  the tenant's stored bytes: a hash of expiry minute (Unix
--          minutes, rounded up) -> bytes stored for records that expire
--          within that minute
-- ARGV     pairs of minute, bytes to add (none: only sum)
--
-- Reply {total, first_end_ms}: the bytes of minutes not over yet, and when
-- the earliest of them ends (0 when there is none).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local all = redis.call('HGETALL', KEYS[1])
local total, first, last, over = 0, 0, 0, {}
for i = 1, #all, 2 do
  local ends = tonumber(all[i]) * 60000
  if ends <= now then
    over[#over + 1] = all[i]
  else
    total = total + tonumber(all[i + 1])
    if first == 0 or ends < first then first = ends end
    if ends > last then last = ends end
  end
end
-- HDEL in slices: unpack has a bounded stack.
for i = 1, #over, 1000 do
  redis.call('HDEL', KEYS[1], unpack(over, i, math.min(i + 999, #over)))
end
if last > 0 then
  redis.call('PEXPIREAT', KEYS[1], last)
end
return {total, first}
