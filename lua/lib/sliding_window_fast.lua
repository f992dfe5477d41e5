-- lib/sliding_window_fast.lua: the exact arithmetic of the sliding-window counter, and the fast
-- path of `take` on its key, written once for sliding_window.lua and lib/sliding_window_core.lua
-- (which multi.lua shares). Included before every other library (first on the include line), so
-- that its closures are made before theirs; it uses none of them.
--
-- The arithmetic (made if `makesSliding` is set above the include line). The rule compares and
-- divides products of a count (< 2^32) and a time in µs (<= W < 2^42): up to 74 bits. While a
-- product is below 2^53 a double holds it exactly and plain arithmetic is exact (math.fmod is exact
-- on doubles); above, slidingMul splits it in two exact parts, and a quotient is the double
-- estimate, off by at most one, corrected with exact comparisons.
--
-- The fast path (run if `slidingFastCall` is set: sliding_window.lua's own `take n 0 [cfg]`): a
-- key that holds this configuration (or none, with cfg) in the current window or the one after it
-- is decided here with locals only, before any helper is made, this file's arithmetic included
-- (each is a closure made anew on every call: see cmake/EmbedLua.cmake). A product below 2^53 fits
-- a double exactly, so plain arithmetic is exact there; a product that must be exact and is not (a
-- count in the billions over a window of seconds) sends the call to the full code. It decides by
-- exactly the rule of
-- lib/sliding_window_core.lua (slidingLoad, slidingWait, slidingRemaining, slidingResetAfter,
-- slidingStore): the same reply, the same bytes written. A grant in the window the key holds,
-- which counted permits already, writes the 4 bytes of the count alone with SETRANGE (offset 24):
-- the key's TTL, set when the window's first permit was counted, already runs to the end of the
-- next window plus keepAlive. Anything else (a key without cfg that does not hold one, another
-- configuration, a clock that went back, bad arguments) goes on past the include line to the full
-- code, which checks everything in order and fails with the precise error; when the server's TIME
-- was read already, ARGV[2] carries it, so the full code decides at the same instant. The key is
-- read with redis.call, so a key of another Redis type fails with Redis's WRONGTYPE error (as
-- lib/fixed_window_fast.lua's).
local SLIDING_TWO21, SLIDING_TWO53 = 2097152, 9007199254740992

if slidingFastCall then
  local key, cfg = KEYS[1], ARGV[6]
  local v = redis.call('GET', key)
  -- A missing key under the configuration in the call is that configuration with window 0 (long
  -- past: nothing counted, as slidingWithConfig's slidingNew).
  if not v and cfg and #cfg == 13 then v = cfg .. '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0' end
  local n = ARGV[4]
  if n == '1' then n = 1 else n = tonumber(n) end
  local nowUs = ARGV[2]
  local serverTime = nowUs == ''
  if serverTime then
    nowUs = 0                                  -- read below, once the key is known to be usable
  else
    nowUs = tonumber(nowUs)
    if nowUs and (nowUs < 0 or nowUs > 9e15 or nowUs % 1 ~= 0) then nowUs = nil end
  end
  if v and #v == 28 and nowUs and n and n >= 1 and n % 1 == 0 and (cfg == nil or string.find(v, cfg, 1, true) == 1) then
    local k, l, windowMs, keepAlive, start, prev, count = struct.unpack('<c1I4I4I4I7I4I4', v)
    local wus = windowMs * 1000
    if k == 'V' and n <= l and windowMs >= 1 and start < SLIDING_TWO53 and start % wus == 0 and prev <= l and
      count <= l then
      if serverTime then
        local t = redis.call('TIME')
        nowUs = t[1] * 1000000 + t[2]
      end
      local current = nowUs - nowUs % wus
      if start <= current then                 -- else the clock went back: the full code
        local stored, counted = start, count > 0
        if start + wus == current then
          prev, count = count, 0               -- the stored window is the previous one now
        elseif start < current then
          prev, count = 0, 0                   -- both windows are over
        end
        start = current
        -- Each product is a count times a time, exact in a double below 2^53; `big` when one that
        -- must be exact is not (a count in the billions over a window of seconds): the full code.
        local left = wus - (nowUs - start)
        local a = l - count - n
        local weighed = prev * left            -- the previous window's weight, x wus
        local allowed, retry, big = 1, 0, weighed >= SLIDING_TWO53
        if a < 0 then                          -- only in the next window, with this count as its previous one
          allowed, retry = 0, start + wus - nowUs
          local a2 = l - n
          if a2 < count then                   -- + wus - floor(a2 x wus / count)
            local x = a2 * wus
            retry = retry + wus - (x - math.fmod(x, count)) / count
            big = big or x >= SLIDING_TWO53
          end
        elseif prev > 0 and weighed > a * wus then  -- exact while `weighed` is: a x wus >= 2^53 rounds to >= 2^53
          local x = a * wus                    -- - floor(a x wus / prev)
          allowed, retry = 0, start + wus - (x - math.fmod(x, prev)) / prev - nowUs
        else
          count = count + n
        end
        local r = math.fmod(weighed, wus)      -- remaining = l - count - ceil(prev x left / wus)
        local remaining = l - count - (weighed - r) / wus
        if r > 0 then remaining = remaining - 1 end
        if remaining < 0 then remaining = 0 end
        local resetUs = 0
        if count > 0 then resetUs = start + 2 * wus - nowUs elseif prev > 0 then resetUs = start + wus - nowUs end
        if big then
          -- nothing written: the full code below decides
        elseif allowed == 1 then
          if start == stored and counted then
            redis.call('SETRANGE', key, '24', struct.pack('<I4', count))
          else
            local packed = struct.pack('<c1I4I4I4I7I4I4', 'V', l, windowMs, keepAlive, start, prev, count)
            if keepAlive > 0 then
              redis.call('SET', key, packed, 'PX', math.ceil(resetUs / 1000) + keepAlive)
            else
              redis.call('SET', key, packed)
            end
          end
        end
        if not big then
          return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, remaining, retry, resetUs, l, nowUs, 0, l, windowMs)
        end
      end
      ARGV[2] = nowUs                          -- the full code decides at the same instant
    end
  end
end

local slidingCmp, slidingQuot, slidingCeil
if makesSliding then

  -- a x b as hi x 2^21 + lo (0 <= lo < 2^21), exactly, for integers with min(a, b) < 2^32 and
  -- max(a, b) <= 4294967295000: every part stays below 2^53.
  local function slidingMul(a, b)
    if a > b then a, b = b, a end
    local bl = b % SLIDING_TWO21
    local lo = a * bl
    local l2 = lo % SLIDING_TWO21
    return a * ((b - bl) / SLIDING_TWO21) + (lo - l2) / SLIDING_TWO21, l2
  end

  -- The sign of a x b - c x d (-1, 0, 1), exactly.
  function slidingCmp(a, b, c, d)
    local x, y = a * b, c * d
    if x >= SLIDING_TWO53 or y >= SLIDING_TWO53 then        -- a true product below 2^53 never rounds up to it
      local h1, l1 = slidingMul(a, b)
      local h2, l2 = slidingMul(c, d)
      if h1 ~= h2 then x, y = h1, h2 else x, y = l1, l2 end
    end
    if x < y then return -1 end
    if x > y then return 1 end
    return 0
  end

  -- floor(a x b / d), exactly, for a quotient q with q x d within slidingMul's bounds.
  function slidingQuot(a, b, d)
    local x = a * b
    if x < SLIDING_TWO53 then return (x - math.fmod(x, d)) / d end
    local q = math.floor(x / d)
    if slidingCmp(q, d, a, b) > 0 then q = q - 1 end
    if slidingCmp(q + 1, d, a, b) <= 0 then q = q + 1 end
    return q
  end

  -- ceil(a x b / d), exactly (as slidingQuot).
  function slidingCeil(a, b, d)
    local x = a * b
    if x < SLIDING_TWO53 then
      local r = math.fmod(x, d)
      if r > 0 then return (x - r) / d + 1 end
      return x / d
    end
    local q = slidingQuot(a, b, d)
    if slidingCmp(q, d, a, b) < 0 then q = q + 1 end
    return q
  end
end

