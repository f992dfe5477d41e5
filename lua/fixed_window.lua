-- fixed_window.lua: at most L permits per window of W ms, windows aligned to the epoch.
-- A Limiter of Policy::fixedWindow (kind 'W') runs it. The algorithm, layout (28 bytes), bounds and TTL are
-- described in lua/lib/fixed_window_core.lua, which multi.lua shares.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind 'W'):
--   take n maxWaitUs   takes n permits in the current window if they are left; otherwise, with
--                      maxWaitUs at least the time until the next window starts, reserves them
--                      there (delay = that time). Writes when it takes; a denial writes only a
--                      window clamped after a clock step, or another configuration (below).
--   peek n             what `take n 0` would decide; writes nothing
--   refund n           gives n permits back to the current window (its count does not go below 0)
--   reserve n ttlMs    KEYS[2] the record key (lib/reservation_core.lua): `take n 0`, and when it
--                      grants, an open record of n permits and the window they were counted in,
--                      with a TTL of ttlMs, in the same call. A record there already: nothing is
--                      taken, the reply is the grant again as the window is now (it must hold n
--                      permits). Reply: take's, then repeated (0 or 1).
--   settle actual      KEYS[2] the record key. An open record of r permits: gives back r - actual to
--                      the window the grant was counted in if it is still the current one (else
--                      its count is gone already: nothing to give back), or counts actual - r more
--                      in the current window, then in the next one, each up to L (the rest is
--                      unpaid), and marks the record settled with the answer. Reply as gcra.lua's.
--   reserve n ttlMs cfg, settle actual cfg
--                      with the configuration in the call (ARGV[6]), as take's.
--   set mode L W keepAlive
--                      'try' writes only if the key does not exist (an empty window); 'keep'
--                      writes the configuration keeping the counts (windowRescale), and changes
--                      nothing when the key holds this configuration. Reply {written, L,
--                      localRate, localIntervalMs}.
--   take n maxWaitUs cfg, peek n 0 cfg, refund n 0 cfg
--                      the limit in the call: cfg is the caller's configuration packed as the
--                      key's first 13 bytes ('W', L, W ms, keepAlive ms). A key without one is
--                      decided as an empty window of cfg; a key holding cfg as it is; a key holding
--                      another configuration with cfg, its counts kept (windowRescale). What takes
--                      or gives back writes cfg with the state; so does a take that denies, or a
--                      refund that gives nothing back, on a key that held another configuration:
--                      the change applies from then on (the counts in the new windows), so the
--                      denial's retryAfter is exact. peek writes nothing and answers what take
--                      would.
-- Reply of take and peek: ONE 65-byte string (lib/onekey.lua's packDecision: byte 0xA0 + allowed,
--   then remaining, retryAfterUs, resetAfterUs, L, nowUs, delayUs, localRate (L), localIntervalMs
--   (W) as little-endian signed 64-bit integers; the fast path packs the same layout inline).
--   remaining is what is left in the current window;
--   retryAfter (denied) is exact: the window in which the same call succeeds starts then;
--   resetAfter is the time until no permit is counted any more (end of the current window, or of
--   the next one when permits are reserved there).
--
-- The fast path: `take` on a key that holds a fixed window with a usable configuration and state,
-- and usable arguments, is decided by lib/fixed_window_fast.lua (which batch.lua shares) where the
-- libraries are included, before their helpers are made; anything else goes on to the full code
-- below, which checks everything in order and fails with the precise error before writing
-- anything. A key of another Redis type fails the GET with Redis's WRONGTYPE error; ScriptCore,
-- which knows the key, turns it into ScriptError (InvalidConfig).
local op, key = ARGV[1], KEYS[1]
-- windowFastCall: a take, decided by lib/fixed_window_fast.lua at the include line when it can be;
-- then the libraries' helpers this call makes (each is a closure made anew on every call).
local windowFastCall = op == 'take' and ARGV[3] == 'W'
local makesWindow, makesRecords = true, op == 'reserve' or op == 'settle'
-- include: fixed_window_fast base onekey fixed_window_core reservation_core
if ARGV[3] ~= 'W' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for fixed_window.lua') end
local nowUs = currentMicros(ARGV[2])

-- The limiter: with the caller's configuration (ARGV[6]) or the stored one.
local function load()
  if ARGV[6] then return windowWithConfig(key, nowUs, ARGV[6]) end
  return windowLoad(key, nowUs)
end

if op == 'take' or op == 'peek' then
  local s = load()
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  windowCheckPermits(s, n)
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', key) end
  local allowed, delay, retry, count, nextCount = windowTake(s, n, maxWait)
  if op == 'peek' then
    count, nextCount = s.count, s.nextCount
  elseif allowed == 1 or s.stale then      -- a stale window is written back, also on a denial
    windowStore(s, count, nextCount)
  end
  return packDecision(allowed, s.l - count, retry, windowResetAfter(s, count, nextCount), s.l, nowUs, delay, s.l,
    s.windowMs)
end

if op == 'refund' then
  local s = load()
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return s.l - windowRefund(s, n)
end

if op == 'reserve' then
  local s = load()
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  windowCheckPermits(s, n)
  local ttl = countArg(ARGV[5], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', key)
  return recordReserve(recordKey(), 'W', WINDOW_LABEL, n, ttl, function()
    return {1, s.l - s.count, 0, windowResetAfter(s, s.count, s.nextCount), s.l, nowUs, 0, s.l, s.windowMs}
  end, function()
    local allowed, delay, retry, count, nextCount = windowTake(s, n, 0)
    if allowed == 1 or s.stale then windowStore(s, count, nextCount) end
    return {allowed, s.l - count, retry, windowResetAfter(s, count, nextCount), s.l, nowUs, delay, s.l, s.windowMs},
      s.start
  end)
end

if op == 'settle' then
  local s = load()
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
  return recordSettle(recordKey(), 'W', WINDOW_LABEL, actual, function(reserved, start, used)
    return windowSettle(s, reserved, start, used)
  end)
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'keep' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or keep') end
  local l = countArg(ARGV[5], 1, MAX_U32, 'limit', key)
  local windowMs = countArg(ARGV[6], 1, MAX_U32, 'window (ms)', key)
  local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)', key)
  local v = readPacked('W', WINDOW_LABEL, key)
  if v and mode == 'try' then return {0, 0, 0, 0} end
  local s = windowNew(key, nowUs, l, windowMs, keepAlive)
  -- A stored configuration or state that cannot be used has nothing to keep: 'keep' resets it.
  local usable, old = false, nil
  if v then usable, old = pcall(windowLoad, key, nowUs) end
  if usable then
    if string.sub(v, 1, 13) == struct.pack('<c1I4I4I4', 'W', l, windowMs, keepAlive) then
      return {1, l, l, windowMs}           -- the same configuration: nothing changes
    end
    windowRescale(old, s)
  end
  windowStore(s, s.count, s.nextCount)
  return {1, l, l, windowMs}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for fixed_window.lua')
