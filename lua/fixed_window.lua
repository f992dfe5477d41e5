-- include: onekey fixed_window_core
-- fixed_window.lua: at most L permits per window of W ms, windows aligned to the epoch.
-- FixedWindowRateLimiter (kind 'W') runs it. The algorithm, layout (28 bytes), bounds and TTL are
-- described in lua/lib/fixed_window_core.lua, which multi.lua shares.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind 'W'):
--   take n maxWaitUs   takes n permits in the current window if they are left; otherwise, with
--                      maxWaitUs at least the time until the next window starts, reserves them
--                      there (delay = that time). Writes only when it takes.
--   peek n             what `take n 0` would decide; writes nothing
--   refund n           gives n permits back to the current window (its count does not go below 0)
--   set mode L W keepAlive
--                      'try' writes only if the key does not exist; 'reset' overwrites the
--                      configuration of a fixed window and restarts it empty. Reply {written, L,
--                      localRate, localIntervalMs}.
--   config             {L, L, W, L, W, keepAlive}
-- Reply of take and peek: {allowed, remaining, retryAfterUs, resetAfterUs, L, nowUs, delayUs,
--   localRate (L), localIntervalMs (W)}. remaining is what is left in the current window;
--   retryAfter (denied) is exact: the window in which the same call succeeds starts then;
--   resetAfter is the time until no permit is counted any more (end of the current window, or of
--   the next one when permits are reserved there).
local op, key = ARGV[1], KEYS[1]
if ARGV[3] ~= 'W' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for fixed_window.lua') end
local nowUs = currentMicros(ARGV[2])

if op == 'take' or op == 'peek' then
  local s = windowLoad(key, nowUs)
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  windowCheckPermits(s, n)
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', key) end
  local allowed, delay, retry, count, nextCount = windowTake(s, n, maxWait)
  if op == 'peek' then
    count, nextCount = s.count, s.nextCount
  elseif allowed == 1 then
    windowStore(s, count, nextCount)
  end
  return {allowed, s.l - count, retry, windowResetAfter(s, count, nextCount), s.l, nowUs, delay, s.l, s.windowMs}
end

if op == 'refund' then
  local s = windowLoad(key, nowUs)
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return s.l - windowRefund(s, n)
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'reset' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or reset') end
  local l = countArg(ARGV[5], 1, MAX_U32, 'limit', key)
  local windowMs = countArg(ARGV[6], 1, MAX_U32, 'window (ms)', key)
  local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)', key)
  if readPacked('W', WINDOW_LABEL, key) and mode == 'try' then return {0, 0, 0, 0} end
  windowStore(windowNew(key, nowUs, l, windowMs, keepAlive), 0, 0)
  return {1, l, l, windowMs}
end

if op == 'config' then
  local s = windowLoad(key, nowUs)
  return {s.l, s.l, s.windowMs, s.l, s.windowMs, s.keepAlive}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for fixed_window.lua')
