-- reference_available_permits.lua: Redisson's RRateLimiter.availablePermits on the layout in the
-- README ("Compatibility with Redisson"), written here from its call sequence: the same Redis
-- calls in the same order, with the same Lua work between them. The baseline that the server cost
-- of lua/available_permits.lua is measured against. Benchmark only; never used by the library.
--
-- Calls: HGET rate, HGET interval, HGET type; GET value; a missing value is SET to the rate and
-- returned; else ZRANGEBYSCORE permits 0 (now - interval) (no LIMIT) and every member it returns
-- unpacked and summed; a sum > 0 adds ZREMRANGEBYSCORE and SET value + sum (never clamped to the
-- rate, and no TTL applied). The reply is the value (an integer, or the rate as a string).
--   KEYS: config hash, value, client value, permits, client permits (Redisson's order)
--   ARGV[1] now in epoch ms from the caller's clock, as Redisson sends it, or '' for the server's
--   TIME (what Redisson does not do).

local rate = redis.call('HGET', KEYS[1], 'rate')
local interval = redis.call('HGET', KEYS[1], 'interval')
local rateType = redis.call('HGET', KEYS[1], 'type')
if rate == false or interval == false or rateType == false then
  return redis.error_reply('RateLimiter is not initialized')
end

local valueKey, permitsKey = KEYS[2], KEYS[4]
if rateType == '1' then
  valueKey, permitsKey = KEYS[3], KEYS[5]
end

local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local value = redis.call('GET', valueKey)
if value == false then
  redis.call('SET', valueKey, rate)
  return rate
end
local released = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', permitsKey, 0, tonumber(now) - interval)) do
  local _, n = struct.unpack('Bc0I', member)
  released = released + n
end
if released > 0 then
  redis.call('ZREMRANGEBYSCORE', permitsKey, 0, tonumber(now) - interval)
  value = tonumber(value) + released
  redis.call('SET', valueKey, value)
end
return value
