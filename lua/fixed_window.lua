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
-- The fast path (above the `-- include:` line, so it runs before the libraries' closures are
-- made; it uses none of them): `take` on a key that holds a fixed window with a
-- usable configuration and state, and usable arguments, is decided right here with locals only,
-- by exactly the arithmetic of lib/fixed_window_core.lua (windowLoad, windowTake, windowStore,
-- windowResetAfter). Anything else falls through to the full code below, which checks everything
-- in order and fails with the precise error before writing anything. A key of another Redis type
-- fails the GET with Redis's WRONGTYPE error; ScriptCore, which knows the key, turns it into
-- ScriptError (InvalidConfig). A grant costs two Redis calls and TIME when ARGV[2] is '' (always,
-- from the limiters): the GET, then SETRANGE of the count alone when the key's window is the current
-- one and counted permits already (the steady state: the TTL stays, see below), else one SET of the
-- whole key (with PX when keepAlive > 0). A key updated in place is stored raw instead of embstr;
-- MEMORY USAGE is the same (88 bytes for a 14-byte name). A TTL set on the key from outside (with
-- keepAlive 0) lasts until the next whole SET, at the next window. a % b for integers
-- 0 <= a < 2^53, b >= 1 is exact in doubles. With the configuration in the call (ARGV[6]), the fast
-- path also requires the key to begin with it.
local op, key = ARGV[1], KEYS[1]
if op == 'take' and ARGV[3] == 'W' then
  local v = redis.call('GET', key)
  -- What decide(1) sends compares as one interned string; anything else goes through tonumber.
  local n, maxWait, nowUs, cfg = ARGV[4], ARGV[5], ARGV[2], ARGV[6]
  if n == '1' then n = 1 else n = tonumber(n) end
  if maxWait == '0' then maxWait = 0 else maxWait = tonumber(maxWait) end
  if nowUs == '' then
    nowUs = 0                              -- read below, once the key is known to be usable
  else
    nowUs = tonumber(nowUs)
    if nowUs and (nowUs < 0 or nowUs > 9e15 or nowUs % 1 ~= 0) then nowUs = nil end
  end
  -- A missing key under the configuration in the call is that configuration with window 0 (long
  -- past: nothing counted, windowWithConfig's windowNew), so the fast path decides it too.
  if not v and cfg and #cfg == 13 then v = cfg .. '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0' end
  if v and #v == 28 and nowUs and n and maxWait and n >= 1 and n % 1 == 0 and maxWait >= 0 and
      maxWait < 1e14 and maxWait % 1 == 0 then
    local k, l, windowMs, keepAlive, start, count, nextCount = struct.unpack('<c1I4I4I4I7I4I4', v)
    local wus = windowMs * 1000
    if k == 'W' and n <= l and windowMs >= 1 and start < 9007199254740992 and start % wus == 0 and
        count <= l and nextCount <= l and (cfg == nil or string.find(v, cfg, 1, true) == 1) then
      if ARGV[2] == '' then
        local t = redis.call('TIME')
        nowUs = t[1] * 1000000 + t[2]
      end
      local current = nowUs - nowUs % wus
      local stored, counted, clamped = start, count > 0, false
      if start ~= current then
        if start + wus == current then
          count, nextCount = nextCount, 0  -- the reserved window has begun
        elseif start < current then
          count, nextCount = 0, 0          -- expired: nothing counted
        elseif start > current + wus then
          start, clamped = current + wus, true  -- the clock went back: clamped to the next window
        end                                -- else the clock went back: the stored window stays
      end
      if start < current then start = current end
      local wait = start + wus - nowUs     -- until the next window starts
      local allowed, delay, retry = 1, 0, 0
      if count + n <= l then
        count = count + n
      elseif nextCount + n > l then        -- the next window is full too
        allowed, retry = 0, wait + wus - maxWait
        if retry < wait then retry = wait end
      elseif wait <= maxWait then
        nextCount, delay = nextCount + n, wait
      else
        allowed, retry = 0, wait - maxWait
      end
      local resetUs = 0
      if nextCount > 0 then resetUs = wait + wus elseif count > 0 then resetUs = wait end
      if allowed == 1 and delay == 0 and start == stored and counted and not clamped then
        -- Only the count changed, in the window the key holds, which counted permits already: its
        -- TTL (when keepAlive > 0) is the end of that window, or of the next with permits reserved
        -- there, plus keepAlive, and both stay as they were. The 4 bytes of the count (offset 20)
        -- are written in place, keeping the TTL: about a third of what a whole SET with PX costs.
        redis.call('SETRANGE', key, '20', struct.pack('<I4', count))
      elseif allowed == 1 or clamped then  -- a clamped window is written back, also on a denial
        local packed = struct.pack('<c1I4I4I4I7I4I4', 'W', l, windowMs, keepAlive, start, count, nextCount)
        if keepAlive > 0 then
          redis.call('SET', key, packed, 'PX', math.ceil(resetUs / 1000) + keepAlive)
        else
          redis.call('SET', key, packed)
        end
      end
      return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, l - count, retry, resetUs, l, nowUs, delay, l, windowMs)
    end
  end
end

-- The libraries' helpers this call makes (each is a closure made anew on every call).
local makesWindow, makesRecords = true, op == 'reserve' or op == 'settle'
-- include: base onekey fixed_window_core reservation_core
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
  local rkey = recordKey()
  local r = recordRead(rkey, 'W', WINDOW_LABEL)
  if r then
    recordCheckRepeat(r, rkey, n)
    return {1, s.l - s.count, 0, windowResetAfter(s, s.count, s.nextCount), s.l, nowUs, 0, s.l, s.windowMs, 1}
  end
  local allowed, delay, retry, count, nextCount = windowTake(s, n, 0)
  if allowed == 1 then
    windowStore(s, count, nextCount)
    recordOpen(rkey, 'W', n, s.start, ttl)
  elseif s.stale then
    windowStore(s, count, nextCount)
  end
  return {allowed, s.l - count, retry, windowResetAfter(s, count, nextCount), s.l, nowUs, delay, s.l, s.windowMs, 0}
end

if op == 'settle' then
  local s = load()
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
  local rkey = recordKey()
  local r = recordRead(rkey, 'W', WINDOW_LABEL)
  if not r then return RECORD_UNKNOWN end
  if r.state == 'S' then return recordAnswer(r) end
  local returned, charged, unpaid, remaining = windowSettle(s, r.reserved, r.start, actual)
  recordClose(rkey, r, actual, returned, charged, unpaid, remaining)
  return {1, r.reserved, actual, returned, charged, unpaid, remaining}
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
