-- set_rate.lua: write the configuration.
-- ARGV[1] rate, ARGV[2] interval ms, ARGV[3] type ('0' OVERALL, '1' PER_CLIENT),
-- ARGV[4] keepAliveTime ms (0 = none), ARGV[5] mode, ARGV[6] now in epoch ms ('' = server clock).
-- Modes:
--   try     only if no configuration exists (Redisson's trySetRate); touches no other key
--   reset   overwrite and delete the state: the limiter restarts full (setRate)
--   keep    overwrite, keep the state (setRate with keepState, Redisson 4.4)
--   update  as keep, but only if the limiter exists (updateRate)
-- keep/update: a change of type clears the state; otherwise members older than the new interval
-- are dropped and value = new rate - permits still live. That value can be negative when the
-- rate went down below what is in use (Redisson stores max(0, ...) instead, and then hands out
-- the difference again as those permits expire); it climbs back to >= 0 as they expire, and
-- availablePermits reports 0 meanwhile.
-- Reply: 1 if the configuration was written, 0 if not.
local rate, interval, rtype, keepAlive, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local exists = redis.call('EXISTS', KEYS[1]) == 1
if mode == 'try' and exists then return 0 end
if mode == 'update' and not exists then return 0 end
local old = redis.call('HMGET', KEYS[1], 'type', 'keepAliveTime')
local oldType, oldKeepAlive = old[1], tonumber(old[2] or '0') or 0
redis.call('HSET', KEYS[1], 'rate', rate, 'interval', interval, 'type', rtype, 'keepAliveTime', keepAlive)
if tonumber(keepAlive) > 0 then
  redis.call('PEXPIRE', KEYS[1], keepAlive)
elseif oldKeepAlive > 0 then
  -- the keys' TTL came from the old keepAliveTime; the new configuration has none
  for i = 1, 5 do redis.call('PERSIST', KEYS[i]) end
end
if mode == 'try' then return 1 end
if mode == 'reset' or not exists or oldType ~= rtype then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  return 1
end
local cfg = readConfig()
local now = currentTime(ARGV[6])
local edge = now - cfg.interval
redis.call('ZREMRANGEBYSCORE', cfg.permitsKey, '-inf', edge)
redis.call('SET', cfg.valueKey, cfg.rate - livePermits(cfg.permitsKey, edge))
cfg.rewrote = true
applyTtl(cfg)
return 1
