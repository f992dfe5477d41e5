-- lib/fixed_window_core.lua: at most L permits per window of W ms on one packed key, windows
-- aligned to the epoch (window start = floor(now / W) * W on the server's clock), so every host
-- agrees where a window starts. For fixed_window.lua (one limiter) and multi.lua (several decided
-- together). Policy::fixedWindow (kind 'W') runs it.
--
-- The textbook counter is INCRBY on a key per window plus PEXPIRE; here the window's start and its
-- count live in the limiter's one key beside the configuration, and a count from an earlier
-- window reads as 0 (the expiry). One more count is kept: permits reserved in the next window
-- (a caller denied now may book the next window and wait for it to start).
-- Layout (28 bytes): kind 'W', L (uint32), W ms (uint32), keepAlive ms (uint32), window start µs
--   (uint56), count in that window (uint32), count reserved in the window after it (uint32).
-- Bounds: L in 1..2^32-1, W in 1..2^32-1 ms, keepAlive in 0..2^32-1 ms; every value is an exact
--   integer below 2^53 (times are epoch µs, counts <= L).
-- TTL: none unless keepAlive > 0; then the time until no permit is counted plus keepAlive.
-- Clock steps: a writer stores its own current window, so a stored window that starts after the
--   current one was written by a clock ahead of the server's clock now. Less than a window ahead it
--   stays current until the clock is past it (exact: its count is not forgotten); further ahead it
--   is clamped to the next window, its counts kept, and written back so by the next take (also
--   when it denies: s.stale).
-- Another configuration (windowWithConfig: the caller's, the key holding another one) applies from
--   the first call that may write: take, reserve, refund and settle write the counts kept under the
--   caller's configuration also when they deny or change nothing else (s.stale), so a denial's
--   retryAfter, in the new windows, is exact (no count is left in a window of the stored length);
--   peek writes nothing and answers what take would.
--
-- A limiter is a table s: key, nowUs, the configuration (l, windowMs, keepAlive), wus = W in µs,
-- and as of nowUs: start (of the current window), nextStart, count, nextCount, and stale: the key
-- does not hold s (a window clamped after a clock step, another configuration), so every call that
-- may write writes s back, also one that denies or changes nothing else.
local WINDOW_LAYOUT = '<c1I4I4I4I7I4I4'
local WINDOW_LABEL = 'fixed window limiter'

-- The helpers below are made only if `makesWindow` is true: a local that a script which includes this
-- file sets above its `-- include:` line. A function is a closure made anew on every call
-- (cmake/EmbedLua.cmake), so a script makes only the groups it uses; the others stay nil.
local windowConfigProblem, windowNew, windowLoad, windowResetAfter, windowStore, windowCheckPermits,
  windowTake, windowFitsAt, windowRefund, windowRescale, windowWithConfig, windowSettle
if makesWindow then
  function windowConfigProblem(l, windowMs, keepAlive)
    if l < 1 or l > MAX_U32 then return 'the limit must be in 1..' .. MAX_U32 end
    if windowMs < 1 or windowMs > MAX_U32 then return 'the window must be in 1..' .. MAX_U32 .. ' ms' end
    if keepAlive > MAX_U32 then return 'keepAlive must be in 0..' .. MAX_U32 .. ' ms' end
    return nil
  end

  -- An empty limiter with a checked configuration: the current window at nowUs, nothing counted.
  function windowNew(key, nowUs, l, windowMs, keepAlive)
    local s = {key = key, nowUs = nowUs, l = l, windowMs = windowMs, keepAlive = keepAlive, wus = windowMs * 1000}
    s.start = nowUs - math.fmod(nowUs, s.wus)
    s.nextStart = s.start + s.wus
    s.count, s.nextCount = 0, 0
    return s
  end

  -- The limiter of `key` with its counts as of nowUs, checked before anything is written.
  function windowLoad(key, nowUs)
    local v = readPacked('W', WINDOW_LABEL, key)
    if not v then notInitialized(WINDOW_LABEL, key) end
    local _, l, windowMs, keepAlive, start, count, nextCount = struct.unpack(WINDOW_LAYOUT, v)
    local bad = windowConfigProblem(l, windowMs, keepAlive)
    if bad then
      fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. WINDOW_LABEL .. ' ' .. key .. ': ' .. bad ..
        '; fix it with Limiter::setPolicy')
    end
    local s = windowNew(key, nowUs, l, windowMs, keepAlive)
    if start >= TWO52 * 2 or math.fmod(start, s.wus) ~= 0 or count > l or nextCount > l then
      fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' of ' .. WINDOW_LABEL ..
        ' holds a window or count redlimit did not write; reset it with Limiter::setPolicy')
    end
    if start == s.start then
      s.count, s.nextCount = count, nextCount
    elseif start + s.wus == s.start then
      s.count, s.nextCount = nextCount, 0      -- the reserved window has begun
    elseif start > s.start then
      -- The server's clock went back: the stored window stays current until the clock is past it,
      -- but it is never more than one window ahead (clamped, counts kept): a step back costs at
      -- most the rest of this window and one more, whatever its size.
      if start > s.start + s.wus then start, s.stale = s.start + s.wus, true end
      s.start, s.count, s.nextCount = start, count, nextCount
      s.nextStart = start + s.wus
    end                                        -- else expired: nothing counted
    return s
  end

  -- Time until no permit is counted any more, µs.
  function windowResetAfter(s, count, nextCount)
    if nextCount > 0 then return s.nextStart + s.wus - s.nowUs end
    if count > 0 then return s.nextStart - s.nowUs end
    return 0
  end

  function windowStore(s, count, nextCount)
    writePacked(struct.pack(WINDOW_LAYOUT, 'W', s.l, s.windowMs, s.keepAlive, s.start, count, nextCount),
      windowResetAfter(s, count, nextCount), s.keepAlive, s.key)
  end

  -- Fails with REDLIMIT_INVALID_ARGUMENT if n permits can never be granted in one window.
  function windowCheckPermits(s, n)
    if n > s.l then
      fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits (' .. n .. ') exceed the limit (' .. s.l .. ') of ' ..
        WINDOW_LABEL .. ' ' .. s.key .. ': they could never be granted in one window')
    end
  end

  -- Taking n permits (n <= L) in the current window if they are left; otherwise, with maxWait (µs) at
  -- least the time until the next window starts, reserving them there. Returns allowed (1 or 0),
  -- the delay before the permits may be used, retryAfter (denied: the time from which the same call
  -- succeeds, exactly, if nobody else takes permits), and the counts after the call.
  function windowTake(s, n, maxWait)
    local wait = s.nextStart - s.nowUs         -- until the next window starts
    local count, nextCount = s.count, s.nextCount
    if count + n <= s.l then return 1, 0, 0, count + n, nextCount end
    if nextCount + n <= s.l then
      if wait <= maxWait then return 1, wait, 0, count, nextCount + n end
      return 0, 0, wait - maxWait, count, nextCount  -- the next window takes them: from its start,
                                                     -- or as a reservation maxWait before it
    end
    -- The next window is full too: the one after it takes them, or a reservation made in the next
    -- window at most maxWait before it starts.
    local retry = wait + s.wus - maxWait
    if retry < wait then retry = wait end
    return 0, 0, retry, count, nextCount
  end

  -- Whether n permits (n <= L) could be counted at e µs from now if nobody else takes any: in the
  -- current window, the next one, or any later one (empty by then).
  function windowFitsAt(s, n, e)
    local wait = s.nextStart - s.nowUs
    if e < wait then return s.count + n <= s.l end
    if e < wait + s.wus then return s.nextCount + n <= s.l end
    return true
  end

  -- Gives n permits back to the current window (its count does not go below 0) and stores the
  -- result if it changed or s is stale; returns the count.
  function windowRefund(s, n)
    local count = s.count - n
    if count < 0 then count = 0 end
    if count ~= s.count or s.stale then windowStore(s, count, s.nextCount) end
    return count
  end

  -- The counts of `old` (another configuration of a fixed window, at the same now) kept in `s`: the
  -- permits counted in the current window and reserved in the next one stay counted, each at most
  -- the new limit (more is the same answer: the window is full). The same window length keeps the
  -- windows; another length counts them in the new current and next windows (aligned to the epoch
  -- by the new length), until those end. Counts of earlier windows are gone already, as always.
  -- s is then stale (the key holds old).
  function windowRescale(old, s)
    s.count, s.nextCount = math.min(old.count, s.l), math.min(old.nextCount, s.l)
    if old.wus == s.wus then s.start, s.nextStart = old.start, old.nextStart end
    s.stale = true
  end

  -- The fixed window of `key` at nowUs under the caller's configuration `cfg` (the key's 13-byte
  -- header: 'W', L, W ms, keepAlive ms): empty if the key does not exist, the stored counts if it
  -- holds cfg, the stored counts kept under cfg (windowRescale) if it holds another configuration
  -- (stale: the next call that may write writes them, with cfg).
  -- Fails with REDLIMIT_INVALID_ARGUMENT for a cfg that is not a usable fixed window configuration.
  function windowWithConfig(key, nowUs, cfg)
    if #cfg ~= 13 then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call must be 13 bytes') end
    local k, l, windowMs, keepAlive = struct.unpack('<c1I4I4I4', cfg)
    if k ~= 'W' then
      fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call is not one of ' .. WINDOW_LABEL)
    end
    local bad = windowConfigProblem(l, windowMs, keepAlive)
    if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. WINDOW_LABEL .. ' ' .. key .. ': ' .. bad) end
    local v = readPacked('W', WINDOW_LABEL, key)
    if not v then return windowNew(key, nowUs, l, windowMs, keepAlive) end
    local old = windowLoad(key, nowUs)
    if string.sub(v, 1, 13) == cfg then return old end
    local s = windowNew(key, nowUs, l, windowMs, keepAlive)
    windowRescale(old, s)
    return s
  end

  -- Settles a reservation of `reserved` permits counted in the window starting at `start` that used
  -- `actual` (fixed_window.lua's and multi.lua's settle): gives back reserved - actual to that window
  -- if it is still the current one (else its count is gone: nothing to give back), or counts
  -- actual - reserved more in the current window, then in the next one, each up to L (the rest is
  -- unpaid). Stores what changed, or s when stale. Returns returned, charged, unpaid, remaining.
  function windowSettle(s, reserved, start, actual)
    local count, nextCount, returned, charged, unpaid = s.count, s.nextCount, 0, 0, 0
    if actual < reserved then
      if start == s.start then returned = math.min(reserved - actual, count) end
      count = count - returned
    elseif actual > reserved then
      local extra = actual - reserved
      local now = math.min(extra, s.l - count)
      local later = math.min(extra - now, s.l - nextCount)
      count, nextCount, charged = count + now, nextCount + later, now + later
      unpaid = extra - charged
    end
    if count ~= s.count or nextCount ~= s.nextCount or s.stale then windowStore(s, count, nextCount) end
    return returned, charged, unpaid, s.l - count
  end
end
