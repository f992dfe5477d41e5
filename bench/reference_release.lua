-- reference_release.lua: Redisson's RRateLimiter.release(permits) (3.52 and later) on the layout in
-- the README ("Compatibility with Redisson"), written here from its call sequence: the same Redis
-- calls in the same order, with the same Lua work between them. The baseline that the server cost
-- of lua/release.lua is measured against. Benchmark only; never used by the library.
--
-- Calls: HGET rate, HGET interval, HGET type; ZRANGE permits 0 -1 WITHSCORES (the whole log, oldest
-- first, expired members included), walked until the permits are given back: a member holding no
-- more than what is left is removed (ZREM), a larger one is shrunk (ZREM, then ZADD of the same id
-- with what remains, at its score); GET value (missing: the rate); SET min(value + permits, rate);
-- then the TTL rules of acquire (HGET keepAliveTime; PEXPIRE x3, or PTTL and PEXPIRE x2). No reply.
-- The caller never sends permits <= 0 (Redisson refuses a negative count and skips 0).
--   KEYS: config hash, value, client value, permits, client permits (Redisson's order)
--   ARGV[1] permits to give back.

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

local left = tonumber(ARGV[1])
local log = redis.call('ZRANGE', permitsKey, 0, -1, 'WITHSCORES')
for i = 1, #log - 1, 2 do
  if left <= 0 then break end
  local member, score = log[i], log[i + 1]
  local id, n = struct.unpack('Bc0I', member)
  redis.call('ZREM', permitsKey, member)
  if n <= left then
    left = left - n
  else
    redis.call('ZADD', permitsKey, score, struct.pack('Bc0I', string.len(id), id, n - left))
    left = 0
  end
end

local value = redis.call('GET', valueKey)
if value == false then
  value = tonumber(rate)
else
  value = tonumber(value)
end
value = value + tonumber(ARGV[1])
if value > tonumber(rate) then value = tonumber(rate) end
redis.call('SET', valueKey, value)

local keepAlive = redis.call('HGET', KEYS[1], 'keepAliveTime')
if keepAlive ~= false and tonumber(keepAlive) > 0 then
  redis.call('PEXPIRE', KEYS[1], keepAlive)
  redis.call('PEXPIRE', valueKey, keepAlive)
  redis.call('PEXPIRE', permitsKey, keepAlive)
else
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', valueKey, ttl)
    redis.call('PEXPIRE', permitsKey, ttl)
  end
end
