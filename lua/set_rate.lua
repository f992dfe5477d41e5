-- include: base redisson
-- set_rate.lua: write the configuration.
-- ARGV[1] rate, ARGV[2] interval ms, ARGV[3] type ('0' OVERALL, '1' PER_CLIENT),
-- ARGV[4] keepAliveTime ms (0 = none), ARGV[5] mode, ARGV[6] now in epoch µs ('' = server clock).
-- Modes:
--   try     only if no configuration exists (Redisson's trySetRate); touches no other key
--   reset   overwrite and delete the state: the limiter restarts full (setRate)
--   keep    overwrite, keep the state (setRate with keepState, Redisson 4.4)
--   update  as keep, but only if the limiter exists (updateRate)
-- keep/update: a change of type clears the state. Otherwise the permits in use stay in use: the
-- value moves by (new rate - old rate), which is O(1) whatever the size of the log, and members
-- older than the new interval are reclaimed as expired (BATCH per call). The value can be
-- negative when the rate went down below what is in use (Redisson stores max(0, ...) instead,
-- and then hands out the difference again as those permits expire); it climbs back to >= 0 as
-- they expire, and availablePermits reports 0 meanwhile. If the stored state cannot be trusted
-- (no usable old rate, a missing value, a broken invariant) it is rebuilt as loadState says.
-- Everything is read and checked before the first write.
-- Reply: 1 if the configuration was written, 0 if not.
local rate, interval, keepAlive = parseCount(ARGV[1]), parseCount(ARGV[2]), parseCount(ARGV[4])
local rtype, mode = ARGV[3], ARGV[5]
if not rate or rate < 1 or rate > MAX_RATE or not interval or interval < 1 or interval > MAX_INTERVAL or
    not keepAlive or keepAlive > MAX_INTERVAL or (rtype ~= '0' and rtype ~= '1') or
    (mode ~= 'try' and mode ~= 'reset' and mode ~= 'keep' and mode ~= 'update') then
  fail('REDLIMIT_INVALID_ARGUMENT', 'bad configuration for limiter ' .. KEYS[1])
end
local old = readKey('REDLIMIT_INVALID_CONFIG', KEYS[1], 'a hash', 'HMGET', 'rate', 'type', 'keepAliveTime')
local exists = redis.call('EXISTS', KEYS[1]) == 1
if mode == 'try' and exists then return 0 end
if mode == 'update' and not exists then return 0 end
local oldRate, oldType, oldKeepAlive = parseCount(old[1]), old[2], parseCount(old[3] or '0') or 0

-- keep/update with the same type: decide the new state under the new configuration.
local cfg = nil
local value = nil
if (mode == 'keep' or mode == 'update') and exists and oldType == rtype then
  cfg = makeConfig(rate, interval, rtype, keepAlive)
  local shift = false
  if oldRate and oldRate >= 1 and oldRate <= MAX_RATE then shift = rate - oldRate end
  value = loadState(cfg, currentMicros(ARGV[6]), shift, true, nil)
  if cfg.raw == nil and cfg.left == 0 and not cfg.drop then cfg = nil end  -- no state to keep
end

redis.call('HSET', KEYS[1], 'rate', rate, 'interval', interval, 'type', rtype, 'keepAliveTime', keepAlive)
if keepAlive > 0 then
  redis.call('PEXPIRE', KEYS[1], keepAlive)
elseif oldKeepAlive > 0 then
  -- the keys' TTL came from the old keepAliveTime; the new configuration has none
  for i = 1, 5 do redis.call('PERSIST', KEYS[i]) end
end
if mode == 'try' then return 1 end
if cfg == nil then
  if mode == 'reset' or not exists or oldType ~= rtype then
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  end
  return 1
end
writeState(cfg, value)
applyTtl(cfg)
return 1
