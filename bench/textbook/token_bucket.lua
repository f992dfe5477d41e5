-- textbook/token_bucket.lua: the token bucket as it is usually written for Redis, the baseline
-- bench_algorithms compares a token bucket Limiter (lua/gcra.lua) with. Benchmark only; not in
-- the library.
--
-- The classic shape: a hash with the tokens left and the time of the last refill, read with HMGET,
-- refilled in floating point from the time elapsed, written back with HSET and given a TTL with
-- PEXPIRE on every call (the last refill time moves on every call, granted or not). The
-- configuration comes from the caller on every call. For a fair comparison it reads the server's
-- TIME as ours does (the common versions take the time from the client, which costs Redis nothing).
--
-- KEYS[1] the bucket (hash: tokens, ts)
-- ARGV[1] capacity, ARGV[2] permits added per ARGV[3] ms, ARGV[4] permits asked for
-- Reply {allowed (1/0), whole tokens left}
local capacity = tonumber(ARGV[1])
local perMs = tonumber(ARGV[2]) / tonumber(ARGV[3])
local asked = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local last = tonumber(state[2]) or now
if now > last then
  tokens = math.min(capacity, tokens + (now - last) * perMs)
end

local allowed = 0
if tokens >= asked then
  tokens = tokens - asked
  allowed = 1
end

redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / perMs))
return {allowed, math.floor(tokens)}
