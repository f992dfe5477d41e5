-- include: base redisson
-- acquire_batch.lua: decide several whole acquisitions of one limiter in one call, in order, at one
-- server time: what acquire.lua would answer to each of them called one after the other (each
-- grant its own member; one write of the value at the end). Used to coalesce acquisitions that
-- queue up while an earlier call of the same limiter is in flight.
-- KEYS[1..5] the limiter's keys, as for acquire.lua (no partial grants here, so no record key).
-- ARGV[1] now in epoch µs ('' = server clock), ARGV[2] the rate the caller saw last ('' = none),
-- ARGV[3] the number of acquisitions n (1..64), then for each: permits, the member's id bytes,
-- '1' if it is a resend of an earlier attempt with the same id.
-- Reply: {rate, nowUs, interval, then for each acquisition: granted, waitMs, value after it}.
-- granted = -1: the permits exceed the rate (that acquisition only; the others are decided).
-- A resent acquisition whose member is there was granted before: it is granted again, taking
-- nothing, with waitMs = -stampUs (the time of that first grant, as a negative number).
local cfg = readConfig()
local n = parseCount(ARGV[3])
if not n or n < 1 or n > 64 or #ARGV ~= 3 + 3 * n then
  fail('REDLIMIT_INVALID_ARGUMENT', 'a batch holds 1..64 acquisitions of 3 arguments each')
end
local wants, ids = {}, {}
for i = 1, n do
  local want, id = parseCount(ARGV[3 * i + 1]), ARGV[3 * i + 2]
  if not want or want < 1 or want > MAX_RATE then
    fail('REDLIMIT_INVALID_ARGUMENT', 'permits must be integers in 1..' .. MAX_RATE)
  end
  if #id < 1 or #id > 255 then fail('REDLIMIT_INVALID_ARGUMENT', 'the member id must be 1..255 bytes') end
  wants[i], ids[i] = want, id
end
local nowUs = currentMicros(ARGV[1])
local zkey = cfg.permitsKey

-- Everything is read and decided before the first write.
-- Resends: a member that is there was granted by the lost attempt.
local before = {}
for i = 1, n do
  if ARGV[3 * i + 3] == '1' then
    local score = readKey('REDLIMIT_INVALID_STATE', zkey, 'a sorted set', 'ZSCORE', packMember(ids[i], wants[i]))
    if score then before[i] = scoreMicros(score) end
  end
end

local value = loadState(cfg, nowUs, 0, false, ARGV[2])
local reply = {cfg.rate, nowUs, cfg.interval}
local adds = {'ZADD', zkey}
local taken = 0  -- permits granted by this call so far: members stamped nowUs, the newest
for i = 1, n do
  local want = wants[i]
  local k = 3 + 3 * (i - 1)
  if before[i] then
    reply[k + 1], reply[k + 2], reply[k + 3] = want, -before[i], value
  elseif want > cfg.rate then
    reply[k + 1], reply[k + 2], reply[k + 3] = -1, 0, value
  elseif value >= want then
    value = value - want
    taken = taken + want
    adds[#adds + 1] = scoreOf(nowUs)
    adds[#adds + 1] = packMember(ids[i], want)
    reply[k + 1], reply[k + 2], reply[k + 3] = want, 0, value
  else
    reply[k + 1], reply[k + 2], reply[k + 3] = 0, denialWait(cfg, value, want, nowUs, taken), value
  end
end

if #adds > 2 then
  if cfg.left == 0 then cfg.newLog = true end  -- the ZADD creates the log: it needs the hash's TTL
  redis.call(unpack(adds))
end
writeState(cfg, value)
applyTtl(cfg)
return reply
