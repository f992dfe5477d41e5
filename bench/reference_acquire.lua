-- reference_acquire.lua: Redisson's RRateLimiter.tryAcquire on the layout in the README
-- ("Compatibility with Redisson"), written here from its documented call sequence
-- (../shared/reference/redisson-wire-format.md, "Redisson's call sequence"): the same Redis calls
-- in the same order, with the same Lua work between them. It is the baseline that the server cost
-- of lua/acquire.lua is measured against. Benchmark only; never used by the library.
--
-- It takes lua/acquire.lua's keys and arguments, so both can run on the same state (it reads the
-- first five keys and ARGV[1], ARGV[3] and ARGV[4]):
--   KEYS: config hash, value, client value, permits, client permits (Redisson's order)
--   ARGV[1] permits, ARGV[3] the member's 16 id bytes, ARGV[4] now in epoch ms from the caller's
--   clock, as Redisson sends it (the bench refreshes it on every call), or '' for the server's
--   TIME (what Redisson does not do; for a comparison that pays for TIME on both sides).
-- Reply, as Redisson's: nil when granted, else the wait in ms.
--
-- Like Redisson's, it compares numbers with tonumber only and checks nothing else: no key types,
-- no member format, no bound on the number of expired members it unpacks.

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

if tonumber(ARGV[1]) > tonumber(rate) then
  return redis.error_reply('Requested permits amount cannot exceed defined rate')
end

local now = ARGV[4]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
now = tonumber(now)

local wait = nil
local value = redis.call('GET', valueKey)
if value ~= false then
  -- return the permits of every expired member
  local expired = redis.call('ZRANGEBYSCORE', permitsKey, 0, now - tonumber(interval))
  local released = 0
  for _, member in ipairs(expired) do
    local _, n = struct.unpack('Bc0I', member)
    released = released + n
  end
  if released > 0 then
    redis.call('ZREMRANGEBYSCORE', permitsKey, 0, now - tonumber(interval))
    if tonumber(value) + released > tonumber(rate) then
      local used = 0
      for _, member in ipairs(redis.call('ZRANGE', permitsKey, 0, -1)) do
        local _, n = struct.unpack('Bc0I', member)
        used = used + n
      end
      value = tonumber(rate) - used
    else
      value = tonumber(value) + released
    end
    redis.call('SET', valueKey, value)
  end

  if tonumber(value) < tonumber(ARGV[1]) then
    local oldest = redis.call('ZRANGE', permitsKey, 0, 0, 'WITHSCORES')
    wait = 3 + tonumber(interval) - (now - tonumber(oldest[2]))
  else
    redis.call('ZADD', permitsKey, now, struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], ARGV[1]))
    redis.call('DECRBY', valueKey, ARGV[1])
  end
else
  redis.call('SET', valueKey, rate)
  redis.call('ZADD', permitsKey, now, struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], ARGV[1]))
  redis.call('DECRBY', valueKey, ARGV[1])
end

local keepAlive = tonumber(redis.call('HGET', KEYS[1], 'keepAliveTime') or '0')
if keepAlive > 0 then
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

return wait
