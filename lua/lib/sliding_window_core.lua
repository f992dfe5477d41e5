-- lib/sliding_window_core.lua: the sliding-window counter, at most about L permits per window of W
-- ms, on one packed key: the count of the current window (aligned to the epoch, as the fixed
-- window's) and of the previous one, which is weighted by the part of it still inside the sliding
-- window that ends now. For sliding_window.lua (one limiter) and multi.lua (several decided
-- together). Policy::slidingWindow (kind 'V') runs it.
--
-- The rule (as Cloudflare's and Upstash's counters, in exact integers): with e µs of the current
-- window gone, p the previous window's count and c the current one's, n permits are granted iff
--   p x (W - e) / W + c + n <= L,  compared as  p x (W - e) <= (L - c - n) x W,
-- products of up to 74 bits computed exactly (lib/sliding_window_fast.lua's slidingCmp and
-- slidingQuot: in doubles while below 2^53, else in two parts): no rounding anywhere, so
-- every decision, remaining and retryAfter is exact and the same on every server.
-- The estimate assumes the previous window's permits were spread evenly over it. When they were
-- all taken at its very end, the sliding window that ends just before the current window does holds
-- them all and the current window's, taken as the weight shrinks: the most any W-long interval can
-- hold is L + floor(L x (W - 2 µs) / W), i.e. 2L - 1 while W >= 2L µs (docs/algorithms.md). The exact
-- sliding log (RateLimiter) never passes L; the fixed window reaches 2L.
-- Layout (28 bytes, as the fixed window's): kind 'V', L (uint32), W ms (uint32), keepAlive ms
--   (uint32), current window start µs (uint56), previous window's count (uint32), current count
--   (uint32).
-- Bounds: L in 1..2^32-1, W in 1..2^32-1 ms, keepAlive in 0..2^32-1 ms; counts <= L.
-- TTL: none unless keepAlive > 0; then the time until no permit is counted (the end of the window
--   after the current one while the current count is not 0, else of the current one) plus keepAlive.
-- Clock steps: as the fixed window's. A stored window ahead of the server's current one stays
--   current (its permits count fully until it begins), at most one window ahead (clamped, written
--   back: s.stale).
-- Permits are taken now or not at all: a permit booked for later would have to be counted in a
--   window that has not begun, and every estimate until then would carry it (the client refuses
--   waits for this policy; the script fails a maxWait > 0). A reservation (reserve, then settle)
--   counts its permits now, as a take, and its settle gives back to the window they were counted in
--   while that window still counts (slidingSettle).
--
-- A limiter is a table s: key, nowUs, l, windowMs, keepAlive, wus (W in µs), start (of the window
-- counted as current), prev, count, left (µs of the sliding window still over the previous window:
-- W - e, W before the current window begins) and stale.
local SLIDING_LAYOUT = '<c1I4I4I4I7I4I4'
local SLIDING_LABEL = 'sliding window counter'

-- Made only if `makesSliding` is set above the include line (see lib/fixed_window_core.lua). The
-- exact products and quotients (slidingCmp, slidingQuot, slidingCeil) are lib/sliding_window_fast.lua's, which
-- every script that includes this file names before it.
local slidingConfigProblem, slidingNew, slidingLoad, slidingWithConfig, slidingCheckPermits,
  slidingWait, slidingTake, slidingRemaining, slidingResetAfter, slidingStore, slidingRefund, slidingSettle
if makesSliding then
  function slidingConfigProblem(l, windowMs, keepAlive)
    if l < 1 or l > MAX_U32 then return 'the limit must be in 1..' .. MAX_U32 end
    if windowMs < 1 or windowMs > MAX_U32 then return 'the window must be in 1..' .. MAX_U32 .. ' ms' end
    if keepAlive > MAX_U32 then return 'keepAlive must be in 0..' .. MAX_U32 .. ' ms' end
    return nil
  end

  -- The part of the sliding window over the previous window, from the window counted as current.
  local function slidingPlace(s)
    local gone = s.nowUs - s.start
    if gone < 0 then gone = 0 end
    s.left = s.wus - gone
  end

  -- An empty limiter with a checked configuration at nowUs.
  function slidingNew(key, nowUs, l, windowMs, keepAlive)
    local s = {key = key, nowUs = nowUs, l = l, windowMs = windowMs, keepAlive = keepAlive, wus = windowMs * 1000}
    s.start = nowUs - math.fmod(nowUs, s.wus)
    s.prev, s.count = 0, 0
    slidingPlace(s)
    return s
  end

  -- The limiter of `key` with its counts as of nowUs, checked before anything is written.
  function slidingLoad(key, nowUs)
    local v = readPacked('V', SLIDING_LABEL, key)
    if not v then notInitialized(SLIDING_LABEL, key) end
    local _, l, windowMs, keepAlive, start, prev, count = struct.unpack(SLIDING_LAYOUT, v)
    local bad = slidingConfigProblem(l, windowMs, keepAlive)
    if bad then
      fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. SLIDING_LABEL .. ' ' .. key .. ': ' .. bad ..
        '; fix it with Limiter::setPolicy')
    end
    local s = slidingNew(key, nowUs, l, windowMs, keepAlive)
    if start >= TWO52 * 2 or math.fmod(start, s.wus) ~= 0 or count > l or prev > l then
      fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' of ' .. SLIDING_LABEL ..
        ' holds a window or count redlimit did not write; delete it (Limiter::deleteKey)')
    end
    if start == s.start then
      s.prev, s.count = prev, count
    elseif start + s.wus == s.start then
      s.prev = count                           -- the stored window is the previous one now
    elseif start > s.start then
      -- The server's clock went back: the stored window stays current (its permits count fully
      -- until it begins), at most one window ahead.
      if start > s.start + s.wus then start, s.stale = s.start + s.wus, true end
      s.start, s.prev, s.count = start, prev, count
      slidingPlace(s)
    end                                        -- else both windows are over: nothing counted
    return s
  end

  -- The sliding window counter of `key` at nowUs under the caller's configuration `cfg` (the key's
  -- 13-byte header: 'V', L, W ms, keepAlive ms): empty if the key does not exist, as stored if it
  -- holds cfg, and with another configuration stored, its counts kept under cfg (each at most the
  -- new L; in the same windows if W is the same, else as the new current and previous windows)
  -- and stale (written with cfg by the next call that may write).
  function slidingWithConfig(key, nowUs, cfg)
    if #cfg ~= 13 then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call must be 13 bytes') end
    local k, l, windowMs, keepAlive = struct.unpack('<c1I4I4I4', cfg)
    if k ~= 'V' then
      fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call is not one of a ' .. SLIDING_LABEL)
    end
    local bad = slidingConfigProblem(l, windowMs, keepAlive)
    if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. SLIDING_LABEL .. ' ' .. key .. ': ' .. bad) end
    local v = readPacked('V', SLIDING_LABEL, key)
    if not v then return slidingNew(key, nowUs, l, windowMs, keepAlive) end
    local old = slidingLoad(key, nowUs)
    if string.sub(v, 1, 13) == cfg then return old end
    local s = slidingNew(key, nowUs, l, windowMs, keepAlive)
    s.prev, s.count = math.min(old.prev, l), math.min(old.count, l)
    if old.wus == s.wus then
      s.start = old.start
      slidingPlace(s)
    end
    s.stale = true
    return s
  end

  -- Fails with REDLIMIT_INVALID_ARGUMENT if n permits can never be granted.
  function slidingCheckPermits(s, n)
    if n > s.l then
      fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits (' .. n .. ') exceed the limit (' .. s.l .. ') of ' ..
        SLIDING_LABEL .. ' ' .. s.key .. ': they could never be granted')
    end
  end

  -- The earliest time, µs from now, at which n more permits (n <= L) fit with `count` counted in the
  -- current window, if nobody else takes any: 0 if they fit now. Exact: one µs earlier they do not.
  -- The estimate only falls as time passes (it is continuous where a window ends), so every later
  -- time fits too.
  function slidingWait(s, count, n)
    local a = s.l - count - n
    if a >= 0 then
      if s.prev == 0 or slidingCmp(s.prev, s.left, a, s.wus) <= 0 then return 0 end
      -- p x (W - e) <= a x W from W - e <= floor(a x W / p), which is below W here (a < p)
      return s.start + s.wus - slidingQuot(a, s.wus, s.prev) - s.nowUs
    end
    -- Not in the current window: in the next one, where this count is the previous window's.
    local nextStart = s.start + s.wus - s.nowUs
    local a2 = s.l - n
    if a2 >= count then return nextStart end
    return nextStart + s.wus - slidingQuot(a2, s.wus, count)
  end

  -- Taking n permits (n <= L) now if they fit: allowed (1 or 0), retryAfter (slidingWait: 0 when
  -- allowed) and the current window's count after the call. Writes nothing.
  function slidingTake(s, n)
    local retry = slidingWait(s, s.count, n)
    if retry == 0 then return 1, 0, s.count + n end
    return 0, retry, s.count
  end

  -- What one more call could take now with `count` counted in the current window: L - count -
  -- ceil(p x (W - e) / W), at least 0.
  function slidingRemaining(s, count)
    local r = s.l - count - slidingCeil(s.prev, s.left, s.wus)
    if r < 0 then return 0 end
    return r
  end

  -- Time until no permit is counted any more, µs.
  function slidingResetAfter(s, count)
    if count > 0 then return s.start + 2 * s.wus - s.nowUs end
    if s.prev > 0 then return s.start + s.wus - s.nowUs end
    return 0
  end

  function slidingStore(s, count)
    writePacked(struct.pack(SLIDING_LAYOUT, 'V', s.l, s.windowMs, s.keepAlive, s.start, s.prev, count),
      slidingResetAfter(s, count), s.keepAlive, s.key)
  end

  -- Gives n permits back to the current window (its count does not go below 0) and stores the
  -- result if it changed or s is stale; returns the count.
  function slidingRefund(s, n)
    local count = s.count - n
    if count < 0 then count = 0 end
    if count ~= s.count or s.stale then slidingStore(s, count) end
    return count
  end

  -- Settles a reservation of `reserved` permits counted in the window starting at `start` that used
  -- `actual` (sliding_window.lua's and multi.lua's settle): gives back reserved - actual to that
  -- window while it still counts (the current window's count, or the previous one's, which still
  -- weighs; else there is nothing to give back), or counts actual - reserved more in the current
  -- window, up to L (the rest is unpaid). Stores what changed, or s when stale. Returns returned,
  -- charged, unpaid, remaining.
  function slidingSettle(s, reserved, start, actual)
    local prev, count, returned, charged, unpaid = s.prev, s.count, 0, 0, 0
    if actual < reserved then
      if start == s.start then
        returned = math.min(reserved - actual, count)
        count = count - returned
      elseif start + s.wus == s.start then
        returned = math.min(reserved - actual, prev)
        prev = prev - returned
      end
    elseif actual > reserved then
      charged = math.min(actual - reserved, s.l - count)
      count = count + charged
      unpaid = actual - reserved - charged
    end
    if count ~= s.count or prev ~= s.prev or s.stale then
      s.prev = prev
      slidingStore(s, count)
    end
    return returned, charged, unpaid, slidingRemaining(s, count)
  end
end
