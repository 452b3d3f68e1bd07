-- leases.lua: settle the leases a tenant holds, as one instance saw them
-- change since its last call: a lease acquired or extended now ends at a
-- given time, one completed, failed or never used is over.
--
-- KEYS[1]  the tenant's leases: a sorted set of lease token -> the time (ms)
--          by which the lease is over even if nobody removes it (slot.lua
--          counts a lease in it before its begin acquires)
-- ARGV     pairs of token, ms: the time it is over by, or 0 when it is over
--          now. A time only moves a lease still counted (ZADD XX): a lease
--          that another instance saw end stays ended.
--
-- Reply: the leases still counted.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '0' then
    redis.call('ZREM', KEYS[1], ARGV[i])
  else
    redis.call('ZADD', KEYS[1], 'XX', ARGV[i + 1], ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], last[2])
end
return redis.call('ZCARD', KEYS[1])
