-- slot.lua: count a member of one of a tenant's bounded sets (its begins
-- that wait, or the leases it holds), if the set is under its limit.
--
-- KEYS[1]  the set: a sorted set of member -> the time (ms) by which it is
--          over even if nobody removes it (a waiter whose instance crashed
--          mid-wait, a lease never completed)
-- ARGV[1]  the member (a random waiter id, or a lease token)
-- ARGV[2]  the limit: members at once
-- ARGV[3]  ms until the member is over at the latest
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
