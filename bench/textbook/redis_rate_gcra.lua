-- textbook/redis_rate_gcra.lua: GCRA in the argument shape of go-redis/redis_rate (the limit in the
-- call, floats in seconds), written for bench_keyed from the algorithm's definition, not copied:
-- the baseline for a GCRA Limiter's limit in the call. Benchmark only; not in the library.
--
-- KEYS[1] the key; ARGV[1] burst, ARGV[2] rate (permits per period), ARGV[3] period in seconds
-- (a float), ARGV[4] cost (permits asked for). The key holds the theoretical arrival time (TAT) in
-- seconds since an epoch near now (2020-01-01, so the float keeps µs), or nothing when the limiter
-- is full. A request of `cost` conforms when max(TAT, now) + cost * T - burst * T <= now, with
-- T = period / rate; a conforming one stores the new TAT with SET ... EX (whole seconds until the
-- bucket is full again, at least 1), a denied one writes nothing. Time is the server's TIME.
-- Reply {allowed (1/0), remaining, retry after (s, string), reset after (s, string)}.
local burst = tonumber(ARGV[1])
local emission = tonumber(ARGV[3]) / tonumber(ARGV[2])
local cost = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1577836800) + tonumber(t[2]) / 1000000

local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat < now then tat = now end
local arrival = tat + cost * emission
local diff = now - (arrival - burst * emission)
if diff < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset = arrival - now
local seconds = math.ceil(reset)
if seconds < 1 then seconds = 1 end
redis.call('SET', KEYS[1], arrival, 'EX', seconds)
return {1, math.floor(diff / emission), '-1', tostring(reset)}
