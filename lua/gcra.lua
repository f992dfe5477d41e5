-- include: onekey gcra_core
-- gcra.lua: the generic cell rate algorithm on one key. GcraRateLimiter (kind 'G') and
-- TokenBucketRateLimiter (kind 'T') both run it. The algorithm, its exact integer units, bounds,
-- layout (28 bytes) and TTL are described in lua/lib/gcra_core.lua, which multi.lua shares.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind):
--   take n maxWaitUs   takes n permits if the bucket holds them; with maxWaitUs > 0, also if it
--                      will hold them within maxWaitUs: a reservation, which moves TAT past
--                      now + B*T (the bucket goes into debt) and tells the caller to wait
--                      `delay`. Writes only when it takes.
--   peek n             what `take n 0` would decide, with remaining and resetAfter as they are
--                      now; writes nothing
--   refund n           gives n permits back, up to a full bucket
--   set mode B P I keepAlive initial
--                      mode 'try' writes only if the key does not exist; 'reset' overwrites the
--                      configuration of a limiter of this kind and restarts its state with
--                      `initial` permits (0..B). Reply {written, B, localRate, localIntervalMs}.
--   config             {B, localRate, localIntervalMs, B, P, I, keepAlive}
-- Reply of take and peek: {allowed, remaining, retryAfterUs, resetAfterUs, B, nowUs, delayUs,
--   localRate, localIntervalMs}. retryAfter (denied) is exact: the same call succeeds at
--   now + retryAfter and not a µs earlier, if nobody else takes permits. localRate per
--   localIntervalMs (B permits, refilled at the same average rate) is what the client's Local
--   failure policy runs when Redis cannot be asked.
local op, kind, key = ARGV[1], ARGV[3], KEYS[1]
local label = GCRA_LABELS[kind]
if not label then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for gcra.lua') end
local nowUs = currentMicros(ARGV[2])

if op == 'take' or op == 'peek' then
  local s = gcraLoad(key, kind, nowUs)
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  gcraCheckPermits(s, n)
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', key) end
  local allowed, delay, retry, after = gcraTake(s, n, maxWait)
  if op == 'peek' then
    after = s.d
  elseif allowed == 1 then
    gcraStore(s, after)
  end
  local lr, lms = gcraLocalRate(s)
  return {allowed, gcraRemaining(s, after), retry, gcraResetAfter(s, after), s.b, nowUs, delay, lr, lms}
end

if op == 'refund' then
  local s = gcraLoad(key, kind, nowUs)
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return gcraRemaining(s, gcraRefund(s, n))
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'reset' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or reset') end
  local b = countArg(ARGV[5], 1, MAX_U32, 'burst', key)
  local p = countArg(ARGV[6], 1, MAX_U32, 'permits per interval', key)
  local intervalMs = countArg(ARGV[7], 1, MAX_U32, 'interval (ms)', key)
  local keepAlive = countArg(ARGV[8], 0, MAX_U32, 'keepAlive (ms)', key)
  local initial = countArg(ARGV[9], 0, b, 'initial permits', key)
  local bad = gcraConfigProblem(b, p, intervalMs, keepAlive)
  if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. key .. ': ' .. bad) end
  if readPacked(kind, label, key) and mode == 'try' then return {0, 0, 0, 0} end
  local s = gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive)
  gcraStore(s, (b - initial) * s.ip)       -- <= B*I'
  local lr, lms = gcraLocalRate(s)
  return {1, b, lr, lms}
end

if op == 'config' then
  local s = gcraLoad(key, kind, nowUs)
  local lr, lms = gcraLocalRate(s)
  return {s.b, lr, lms, s.b, s.p, s.intervalMs, s.keepAlive}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for gcra.lua')
