-- waiter.lua: count a tenant's begin that waits, if it is under the limit.
--
-- KEYS[1]  the tenant's waiters: a sorted set of waiter id -> the time (ms)
--          by which it is over even if nobody removes it (an instance that
--          crashed mid-wait)
-- ARGV[1]  the waiter's id (random)
-- ARGV[2]  the limit: waiters at once
-- ARGV[3]  ms until the waiter is over at the latest
--
-- Reply: 1 counted (remove it with ZREM when it is over), 0 over the limit.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
