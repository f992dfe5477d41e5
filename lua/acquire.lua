-- acquire.lua: take permits, or say how long to wait.
-- ARGV[1] permits wanted (max), ARGV[2] least permits to accept (min; = max for an ordinary
-- acquire, < max for a segment that may be partial), ARGV[3] 16 random id bytes for the member,
-- ARGV[4] now in epoch ms ('' = server clock), ARGV[5] '1' if this is a resend of an earlier
-- attempt with the same id (after a lost connection).
-- Reply: {granted, waitMs, value, rate, now, interval}. granted > 0: the member holds `granted`
-- permits stamped `now`; they expire `interval` ms later. granted = 0: denied, retry after waitMs
-- (when enough permits will have expired).
local cfg = readConfig()
local want, least = parseCount(ARGV[1]), parseCount(ARGV[2])
if not want or want < 1 or not least or least < 1 or least > want then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits must be an integer >= 1')
end
if least > cfg.rate then
  fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits amount cannot exceed defined rate (' .. cfg.rate .. ')')
end
if want > cfg.rate then want = cfg.rate end
local id = ARGV[3]
local now = currentTime(ARGV[4])

-- A resend after a lost reply: if the first attempt was granted, its member is there; grant it
-- again without taking anything. (Only resends pay for this look-up.)
if ARGV[5] == '1' then
  for n = want, least, -1 do
    if redis.call('ZSCORE', cfg.permitsKey, packMember(id, n)) then
      return {n, 0, redis.call('GET', cfg.valueKey), cfg.rate, now, cfg.interval}
    end
  end
end

local value = refill(cfg, now)
if value < least then
  -- Walk the oldest live members until enough permits would be free; wait until that one expires.
  local missing = least - value
  local edge = now - cfg.interval
  -- Each member holds at least one permit, so the oldest `missing` members are enough (a 0-permit
  -- member written by Redisson only makes the wait shorter). Fetching 64 every time made a denial
  -- cost the server about three times a grant: each score is formatted as text for Lua.
  local fetch = missing
  if fetch > 64 then fetch = 64 end
  local oldest = redis.call('ZRANGEBYSCORE', cfg.permitsKey, '(' .. edge, '+inf', 'WITHSCORES', 'LIMIT', 0, fetch)
  local freed, score = 0, now
  for i = 1, #oldest, 2 do
    local _, permits = unpackMember(oldest[i])
    freed = freed + permits
    score = tonumber(oldest[i + 1])
    if freed >= missing then break end
  end
  local wait = score + cfg.interval - now
  if wait < 1 then wait = 1 end
  applyTtl(cfg)
  return {0, wait, value, cfg.rate, now, cfg.interval}
end

local granted = want
if granted > value then granted = value end
redis.call('ZADD', cfg.permitsKey, now, packMember(id, granted))
value = redis.call('DECRBY', cfg.valueKey, granted)
applyTtl(cfg)
return {granted, 0, value, cfg.rate, now, cfg.interval}
