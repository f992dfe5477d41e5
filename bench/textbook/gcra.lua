-- textbook/gcra.lua: GCRA as it is usually written for Redis (the shape of Brandur Leach's
-- throttled and redis-cell, and of go-redis/redis_rate's script), the baseline bench_algorithms
-- compares a GCRA Limiter (lua/gcra.lua) with. Benchmark only; not in the library.
--
-- One string key holds the theoretical arrival time (TAT) in ms as a float. A request for n
-- permits conforms when max(TAT, now) + n * T - burst * T <= now, with T = period / rate; a
-- conforming request stores the new TAT with SET ... PX (the key lives until the limiter is idle
-- again), a denied one writes nothing. The configuration comes from the caller on every call; the
-- time is the server's TIME, as in redis_rate.
--
-- KEYS[1] the TAT key
-- ARGV[1] burst, ARGV[2] permits per ARGV[3] ms, ARGV[4] permits asked for
-- Reply {allowed (1/0), remaining, retry after ms, reset after ms}
local burst = tonumber(ARGV[1])
local emission = tonumber(ARGV[3]) / tonumber(ARGV[2])
local asked = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local newTat = tat + asked * emission
local allowAt = newTat - burst * emission
local diff = now - allowAt
if diff < 0 then
  return {0, 0, math.ceil(-diff), math.ceil(tat - now)}
end

local resetAfter = math.ceil(newTat - now)
redis.call('SET', KEYS[1], newTat, 'PX', resetAfter)
return {1, math.floor(diff / emission), 0, resetAfter}
