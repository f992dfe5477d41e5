-- acquire.lua: take permits, or say how long to wait.
-- KEYS[6] the record of a partial grant made under this call's id ({N}:grant:<hex id>); read and
-- written only when the call may be partial (most > least), so other calls may pass any key of the
-- limiter's slot there (the client passes the hash key).
-- ARGV[1] permits wanted (max), ARGV[2] least permits to accept (min; = max for an ordinary
-- acquire, < max for a segment that may be partial), ARGV[3] the random id bytes of the member,
-- ARGV[4] now in epoch µs ('' = server clock), ARGV[5] '1' if this is a resend of an earlier
-- attempt with the same id (after a lost connection), ARGV[6] how long a partial grant's record
-- is kept, ms (at least as long as the client may resend).
-- Reply: {granted, waitMs, value, rate, nowUs, interval}. granted > 0: the member holds `granted`
-- permits stamped nowUs; they expire `interval` ms later. granted = 0: denied, retry after waitMs
-- (when enough permits will have expired).
local cfg = readConfig()
local want, least = parseCount(ARGV[1]), parseCount(ARGV[2])
if not want or want < 1 or want > MAX_RATE or not least or least < 1 or least > want then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits must be integers with 1 <= least <= most <= ' .. MAX_RATE)
end
if least > cfg.rate then
  fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits amount (' .. least .. ') cannot exceed defined rate (' ..
    cfg.rate .. ') of limiter ' .. KEYS[1])
end
if want > cfg.rate then want = cfg.rate end
local id = ARGV[3]
if #id < 1 or #id > 255 then fail('REDLIMIT_INVALID_ARGUMENT', 'the member id must be 1..255 bytes') end
local recordTtl = parseCount(ARGV[6])
if not recordTtl or recordTtl < 1 then fail('REDLIMIT_INVALID_ARGUMENT', 'the record TTL must be >= 1 ms') end
local nowUs = currentMicros(ARGV[4])
local zkey = cfg.permitsKey

-- A resend after a lost reply: if the first attempt was granted, its member is there; grant it
-- again without taking anything. A whole grant is found by its member; a partial one (fewer
-- than `want`) left a record of its size. Two O(1) look-ups, whatever the range.
if ARGV[5] == '1' then
  local n = nil
  local score = readKey('REDLIMIT_INVALID_STATE', zkey, 'a sorted set', 'ZSCORE', packMember(id, want))
  if score then
    n = want
  elseif want > least then
    local record = readKey('REDLIMIT_INVALID_STATE', KEYS[6], 'a string', 'GET')
    if record then
      n = parseCount(record)
      if not n or n < least or n > want then
        fail('REDLIMIT_INVALID_STATE', 'key ' .. KEYS[6] .. ' holds "' .. string.sub(record, 1, 40) .. '", not a grant size')
      end
      score = redis.call('ZSCORE', zkey, packMember(id, n))
    end
  end
  if n then
    local stamp = nowUs
    if score then stamp = scoreMicros(score) end
    local value = readKey('REDLIMIT_INVALID_STATE', cfg.valueKey, 'a string', 'GET')
    return {n, 0, parseInteger(value) or 0, cfg.rate, stamp, cfg.interval}
  end
end

local value = loadState(cfg, nowUs, 0, false, ARGV[7])
if value >= least then
  local granted = want
  if granted > value then granted = value end
  writeState(cfg, value - granted)
  if cfg.left == 0 then cfg.newLog = true end  -- the ZADD creates the log: it needs the hash's TTL
  redis.call('ZADD', zkey, scoreOf(nowUs), packMember(id, granted))
  if granted < want then
    redis.call('SET', KEYS[6], granted, 'PX', recordTtl)
  end
  applyTtl(cfg)
  return {granted, 0, value - granted, cfg.rate, nowUs, cfg.interval}
end

-- Denied: wait until enough permits will have been returned. Read (and check) before writing.
local wait = denialWait(cfg, value, least, nowUs)
writeState(cfg, value)
applyTtl(cfg)
return {0, wait, value, cfg.rate, nowUs, cfg.interval}
