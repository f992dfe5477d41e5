-- reference_acquire.lua: the acquire algorithm of Redisson's RRateLimiter.tryAcquire (on the data
-- layout described in the README, "Compatibility with Redisson") written in the most direct way,
-- as the baseline for the server cost of lua/acquire.lua. Benchmark only; not in the library.
--
-- The keys and arguments of lua/acquire.lua, so both scripts can run on equal state (it reads the
-- first five of each and ignores the rest):
--   KEYS: config hash, value, client value, permits, client permits (Redisson's order)
--   ARGV[1] permits, ARGV[2] least permits (unused: always = ARGV[1] here), ARGV[3] 16 id bytes,
--   ARGV[4] now in epoch ms ('' = server clock; the bench always sends ''), ARGV[5] resend flag
--   (unused)
-- Reply, as acquire.lua: {granted, waitMs, value, rate, now}.
--
-- "Direct" means: one HGET per configuration field, and every expired member is fetched and
-- unpacked to sum its permits, however many there are.

local rate = redis.call('HGET', KEYS[1], 'rate')
local interval = redis.call('HGET', KEYS[1], 'interval')
local rateType = redis.call('HGET', KEYS[1], 'type')
local keepAlive = redis.call('HGET', KEYS[1], 'keepAliveTime')
if not rate or not interval or not rateType then
  return redis.error_reply('RateLimiter is not initialized')
end
rate = tonumber(rate)
interval = tonumber(interval)
keepAlive = tonumber(keepAlive or '0')

local valueKey, permitsKey = KEYS[2], KEYS[4]
if rateType == '1' then
  valueKey, permitsKey = KEYS[3], KEYS[5]
end

local permits = tonumber(ARGV[1])
if permits > rate then
  return redis.error_reply('Requested permits amount cannot exceed defined rate')
end

local now
if ARGV[4] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[4])
end

local value = redis.call('GET', valueKey)
if not value then
  -- step 3: no value yet: the limiter starts full
  value = rate
  redis.call('SET', valueKey, value)
else
  -- step 4: give back the permits of every expired member
  value = tonumber(value)
  local expired = redis.call('ZRANGEBYSCORE', permitsKey, 0, now - interval)
  local released = 0
  for _, member in ipairs(expired) do
    local _, n = struct.unpack('<Bc0I4', member)
    released = released + n
  end
  if released > 0 then
    redis.call('ZREMRANGEBYSCORE', permitsKey, 0, now - interval)
    value = value + released
    if value > rate then
      local live = redis.call('ZRANGEBYSCORE', permitsKey, '(' .. (now - interval), '+inf')
      local used = 0
      for _, member in ipairs(live) do
        local _, n = struct.unpack('<Bc0I4', member)
        used = used + n
      end
      value = rate - used
    end
    redis.call('SET', valueKey, value)
  end
end

local granted, wait = 0, 0
if value < permits then
  -- step 5: deny; wait until the oldest live member expires
  local oldest = redis.call('ZRANGE', permitsKey, 0, 0, 'WITHSCORES')
  wait = 3 + interval - (now - tonumber(oldest[2]))
else
  -- step 6: grant
  redis.call('ZADD', permitsKey, now, struct.pack('<Bc0I4', #ARGV[3], ARGV[3], permits))
  value = redis.call('DECRBY', valueKey, permits)
  granted = permits
end

-- step 7: TTL
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

return {granted, wait, value, rate, now}
