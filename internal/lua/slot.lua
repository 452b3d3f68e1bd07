-- slot.lua: count members of one of a tenant's bounded sets (its begins
-- that wait, or the leases it holds: one waiter, or a batch of lease
-- tokens an instance reserves ahead of its begins), as many as the set has
-- room for under its limit.
--
-- KEYS[1]  the set: a sorted set of member -> the time (ms) by which it is
--          over even if nobody removes it (a waiter whose instance crashed
--          mid-wait, a lease never completed, a reserved token never used)
-- ARGV[1]  the limit: members at once
-- ARGV[2]  ms until each member is over at the latest
-- ARGV[3..] the members (random waiter ids, or lease tokens), in order
--
-- Reply: n, the members counted: the first n of ARGV[3..] (remove each with
-- ZREM, or move it with leases.lua, when it is over). A member already in
-- the set (the same call run again) stays counted without taking room.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local room = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
local ttl = tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    if room <= 0 then break end
    room = room - 1
  end
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  n = n + 1
end
if n > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return n
