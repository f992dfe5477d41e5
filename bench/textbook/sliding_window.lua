-- textbook/sliding_window.lua: the sliding-window counter as it is usually written for Redis (the
-- shape Upstash's ratelimit and Cloudflare's write-up give it), the baseline bench_algorithms
-- compares a sliding window Limiter (lua/sliding_window.lua) with. Benchmark only; not in the
-- library.
--
-- One counter key per fixed window, named after the window's start (aligned to the epoch, as
-- ours); the estimate is the previous window's count times the part of it the sliding window still
-- covers (floating point, rounded down) plus the current count. Granted: INCRBY the current counter
-- and give a new one a TTL of two windows (it is read as the previous one next). Denied: nothing
-- written. The window keys are built here from the server's TIME, so that both scripts read the
-- server's clock (the classic builds them in the client; that also keeps it cluster-safe, which
-- this one is not).
--
-- KEYS[1] the limiter's name (the counters are KEYS[1] .. ':' .. window start in ms)
-- ARGV[1] limit, ARGV[2] window in ms, ARGV[3] permits asked for
-- Reply {allowed (1/0), remaining}
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local asked = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start = now - now % window
local counts = redis.call('MGET', KEYS[1] .. ':' .. string.format('%d', start),
  KEYS[1] .. ':' .. string.format('%d', start - window))
local current = tonumber(counts[1]) or 0
local previous = math.floor((tonumber(counts[2]) or 0) * (window - (now - start)) / window)
if previous + current + asked > limit then
  return {0, limit - previous - current}
end
local counter = KEYS[1] .. ':' .. string.format('%d', start)
local count = redis.call('INCRBY', counter, asked)
if count == asked then
  redis.call('PEXPIRE', counter, 2 * window)
end
return {1, limit - previous - count}
