-- fixed_window.lua: at most L permits per window of W ms, windows aligned to the epoch
-- (window start = floor(now / W) * W on the server's clock), so every host agrees where a window
-- starts. FixedWindowRateLimiter (kind 'W') runs it.
--
-- The textbook counter is INCRBY on a key per window plus PEXPIRE; here the window's start and its
-- count live in the limiter's one key beside the configuration, and a count from an earlier
-- window reads as 0 (the expiry). One more count is kept: permits reserved in the next window
-- (take with maxWait: a caller denied now may book the next window and wait for it to start).
-- Layout (28 bytes): kind 'W', L (uint32), W ms (uint32), keepAlive ms (uint32), window start µs
--   (uint56), count in that window (uint32), count reserved in the window after it (uint32).
-- Bounds: L in 1..2^32-1, W in 1..2^32-1 ms, keepAlive in 0..2^32-1 ms; every value is an exact
--   integer below 2^53 (times are epoch µs, counts <= L).
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
-- TTL: none unless keepAlive > 0; then resetAfter plus keepAlive.
local LAYOUT = '<c1I4I4I4I7I4I4'
local label = 'FixedWindowRateLimiter'
local op = ARGV[1]
if ARGV[3] ~= 'W' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for fixed_window.lua') end
local nowUs = currentMicros(ARGV[2])

local function configProblem(l, windowMs, keepAlive)
  if l < 1 or l > MAX_U32 then return 'the limit must be in 1..' .. MAX_U32 end
  if windowMs < 1 or windowMs > MAX_U32 then return 'the window must be in 1..' .. MAX_U32 .. ' ms' end
  if keepAlive > MAX_U32 then return 'keepAlive must be in 0..' .. MAX_U32 .. ' ms' end
  return nil
end

-- The configuration and the counts as of now, checked before anything is written.
local function load()
  local v = readPacked('W', label)
  if not v then notInitialized(label) end
  local _, l, windowMs, keepAlive, start, count, nextCount = struct.unpack(LAYOUT, v)
  local bad = configProblem(l, windowMs, keepAlive)
  if bad then
    fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. label .. ' ' .. KEYS[1] .. ': ' .. bad ..
      '; fix it with setConfig()')
  end
  local s = {l = l, windowMs = windowMs, keepAlive = keepAlive, wus = windowMs * 1000}
  if start >= TWO52 * 2 or math.fmod(start, s.wus) ~= 0 or count > l or nextCount > l then
    fail('REDLIMIT_INVALID_STATE', 'key ' .. KEYS[1] .. ' of ' .. label ..
      ' holds a window or count redlimit did not write; reset it with setConfig()')
  end
  s.start = nowUs - math.fmod(nowUs, s.wus)
  if start == s.start then
    s.count, s.nextCount = count, nextCount
  elseif start + s.wus == s.start then
    s.count, s.nextCount = nextCount, 0      -- the reserved window has begun
  elseif start < s.start then
    s.count, s.nextCount = 0, 0              -- expired
  else
    -- The server's clock went back: the stored window stays current until the clock is past it.
    s.start, s.count, s.nextCount = start, count, nextCount
  end
  s.nextStart = s.start + s.wus
  return s
end

-- Time until no permit is counted any more, µs.
local function resetAfter(s, count, nextCount)
  if nextCount > 0 then return s.nextStart + s.wus - nowUs end
  if count > 0 then return s.nextStart - nowUs end
  return 0
end

local function store(s, count, nextCount)
  writePacked(struct.pack(LAYOUT, 'W', s.l, s.windowMs, s.keepAlive, s.start, count, nextCount),
    resetAfter(s, count, nextCount), s.keepAlive)
end

if op == 'take' or op == 'peek' then
  local s = load()
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits')
  if n > s.l then
    fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits (' .. n .. ') exceed the limit (' .. s.l .. ') of ' ..
      label .. ' ' .. KEYS[1] .. ': they could never be granted in one window')
  end
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait') end
  local wait = s.nextStart - nowUs           -- until the next window starts
  local count, nextCount = s.count, s.nextCount
  local allowed, delay, retry = 0, 0, 0
  if count + n <= s.l then
    allowed, count = 1, count + n
  elseif nextCount + n <= s.l and wait <= maxWait then
    allowed, delay, nextCount = 1, wait, nextCount + n
  elseif nextCount + n <= s.l then
    retry = wait - maxWait                   -- the next window takes them: from its start, or
                                             -- as a reservation maxWait before it
  else
    -- The next window is full too: the one after it takes them, or a reservation made in the
    -- next window at most maxWait before it starts.
    retry = wait + s.wus - maxWait
    if retry < wait then retry = wait end
  end
  if op == 'peek' then
    count, nextCount = s.count, s.nextCount
  elseif allowed == 1 then
    store(s, count, nextCount)
  end
  return {allowed, s.l - count, retry, resetAfter(s, count, nextCount), s.l, nowUs, delay, s.l, s.windowMs}
end

if op == 'refund' then
  local s = load()
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund')
  local count = s.count - n
  if count < 0 then count = 0 end
  if count ~= s.count then store(s, count, s.nextCount) end
  return s.l - count
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'reset' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or reset') end
  local l = countArg(ARGV[5], 1, MAX_U32, 'limit')
  local windowMs = countArg(ARGV[6], 1, MAX_U32, 'window (ms)')
  local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)')
  if readPacked('W', label) and mode == 'try' then return {0, 0, 0, 0} end
  local s = {l = l, windowMs = windowMs, keepAlive = keepAlive, wus = windowMs * 1000}
  s.start = nowUs - math.fmod(nowUs, s.wus)
  s.nextStart = s.start + s.wus
  store(s, 0, 0)
  return {1, l, l, windowMs}
end

if op == 'config' then
  local s = load()
  return {s.l, s.l, s.windowMs, s.l, s.windowMs, s.keepAlive}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for fixed_window.lua')
