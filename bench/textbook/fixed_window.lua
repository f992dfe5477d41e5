-- textbook/fixed_window.lua: the fixed-window counter as it is usually written for Redis, the
-- baseline bench_algorithms compares a fixed window Limiter (lua/fixed_window.lua) with.
-- Benchmark only; not in the library.
--
-- One counter key per window, named after the window's start (windows aligned to the epoch, as
-- ours): INCRBY the counter, give a new counter a TTL of the rest of its window with PEXPIRE, and
-- deny when the count passed the limit (the denied request stays counted, as in the classic). The
-- window key is built here from the server's TIME, so that both scripts read the server's clock
-- (the classic builds it in the client from the client's clock; that also keeps it cluster-safe,
-- which this one is not).
--
-- KEYS[1] the limiter's name (the counter is KEYS[1] .. ':' .. window start in ms)
-- ARGV[1] limit, ARGV[2] window in ms, ARGV[3] permits asked for
-- Reply {allowed (1/0), remaining, retry after ms}
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local asked = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start = now - now % window
local counter = KEYS[1] .. ':' .. string.format('%d', start)

local count = redis.call('INCRBY', counter, asked)
if count == asked then
  redis.call('PEXPIRE', counter, start + window - now)
end
if count > limit then
  return {0, 0, start + window - now}
end
return {1, limit - count, 0}
