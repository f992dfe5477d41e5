-- lib/gcra_fast.lua: the fast path of `take` on a GCRA or token bucket key, written once for
-- gcra.lua (its own call) and batch.lua (each decision of kind 'T' or 'G').
--
-- gcraFastTake(v, kind, n, maxWait, nowUs, cfg) decides `take n maxWait [cfg]` on a key whose
-- value the caller read (v: GET's string, false or nil for a missing key; redis.pcall's error
-- table for a key of another Redis type, whose length is 0, is not decided here), at nowUs (a
-- number, a decimal string, or '' = the server's TIME, read only once the key is known to be
-- usable), with `kind` 'T' or 'G' and cfg the caller's configuration (the key's first 17 bytes) or
-- nil. A key that holds a limiter of that kind with a usable configuration and state, and usable
-- arguments, is decided here with locals only (no tables, no closures), by exactly the arithmetic
-- of lib/gcra_core.lua (gcraLoad, gcraTake, gcraAfterAt, gcraStore, gcraRemaining, gcraResetAfter,
-- gcraLocalRate). It returns the reply, the 65-byte packed decision of lib/onekey.lua's
-- packDecision packed inline, then what the caller writes to the key as gcraStore would: its value
-- (nil: nothing to write, a denial) and PX in ms (0: no TTL; SET without PX clears one). It writes
-- nothing itself, so a batch writes a key taken several times once. Anything else (a missing key
-- without cfg, another kind or size, a configuration or state that is out of bounds, a bad
-- argument) returns nil: the full code (lib/gcra_core.lua) decides it, checking everything in
-- order, and fails with the precise error.
--
-- With the configuration in the call, the key must begin with it: one plain string.find, no new
-- string (measured with 20 000 pipelined EVALSHA of gcra.lua, median of 11 runs: 4.19 µs per call
-- against 4.12 µs for the stored-config call; the difference is Redis making the 17-byte argument).
-- A missing key is decided as the configuration with TAT 0 (a full bucket: what gcraWithConfig
-- decides); the checks are gcraConfigProblem's, so a configuration that fails them goes on to the
-- full code and its precise error. A key holding another configuration goes to gcraWithConfig.
-- Quotients: floor(a / b) of integers 0 <= a < 2^53, b >= 1 is exact in doubles (a/b is at least
-- 1/b away from an integer it is not, and that is more than half an ulp below 2^53).
--
-- This file uses no other library and is included before them (first on the include line), so
-- that its one closure is made before theirs. A script whose own call is the take sets
-- `gcraFastCall` above its include line: the take is then decided right here, before any helper of
-- the libraries after this one is made (each is a closure made anew on every call; see
-- cmake/EmbedLua.cmake), and the script goes on past its include line only when it was not. The
-- key is read with redis.call, so a key of another Redis type fails with Redis's WRONGTYPE error;
-- ScriptCore, which knows the key, turns it into ScriptError (InvalidConfig).
local function gcraFastTake(v, kind, n, maxWait, nowUs, cfg)
  -- What decide(1) sends compares as one interned string; anything else goes through tonumber.
  if n == '1' then n = 1 else n = tonumber(n) end
  if maxWait == '0' then maxWait = 0 else maxWait = tonumber(maxWait) end
  local serverTime = nowUs == ''
  if serverTime then
    nowUs = 0                              -- read below, once the key is known to be usable
  else
    nowUs = tonumber(nowUs)
    if nowUs and (nowUs < 0 or nowUs > 9e15 or nowUs % 1 ~= 0) then nowUs = nil end
  end
  -- A missing key under the configuration in the call is that configuration with TAT 0 (long
  -- past: a full bucket, gcraWithConfig's gcraNew), so the fast path decides it too.
  if not v and cfg and #cfg == 17 then v = cfg .. '\0\0\0\0\0\0\0\0\0\0\0' end
  if v and #v == 28 and nowUs and n and maxWait and n >= 1 and n % 1 == 0 and maxWait >= 0 and
      maxWait < 1e14 and maxWait % 1 == 0 then
    local k, b, p, intervalMs, keepAlive, tatUs, tatRem = struct.unpack('<c1I4I4I4I4I7I4', v)
    if k == kind and n <= b and p >= 1 and intervalMs >= 1 and tatUs < 9007199254740992 and
        (cfg == nil or string.find(v, cfg, 1, true) == 1) then
      local ius = intervalMs * 1000
      local g, r = p, ius                  -- gcd(P, I in µs); both < 2^43, so % is exact
      while r > 0 do g, r = r, g % r end
      local pp, ip = p / g, ius / g
      local cap = b * ip
      if cap <= 1125899906842624 and tatRem < pp then
        local floor = math.floor
        if serverTime then
          local t = redis.call('TIME')
          nowUs = t[1] * 1000000 + t[2]
        end
        local d = 0                        -- D = max(0, TAT - now) in units
        local h = 0                        -- H, the horizon (gcraHorizon), when needed
        local clamped = false
        if tatUs >= nowUs then
          local dt = tatUs - nowUs
          d = dt * pp + tatRem
          if dt * pp > cap then            -- in debt (reservations), or the clock went back
            h = floor(cap / pp)
            if h < ius then h = ius end
            local w = floor(4503599627370496 / pp)
            if h > w then h = w end
            local dmax = cap + h * pp      -- clamped: as far ahead as TAT can legally be
            if dt > -floor(-dmax / pp) or d > dmax then d, clamped = dmax, true end
          end
        end
        if maxWait > 0 then
          if h == 0 then
            h = floor(cap / pp)
            if h < ius then h = ius end
            local w = floor(4503599627370496 / pp)
            if h > w then h = w end
          end
          if maxWait > h then maxWait = h end
        end
        local wait, allowed, retry, after = d + n * ip - cap, 1, 0, d
        if wait <= 0 then
          wait = 0
          after = d + n * ip
        else
          wait = -floor(-wait / pp)
          if wait <= maxWait then
            after = wait * pp - pp + 1
            if after < d then after = d end
            after = after + n * ip
          else
            allowed, retry, wait = 0, wait - maxWait, 0
          end
        end
        local resetUs = -floor(-after / pp)
        local packed, px = nil, 0
        if allowed == 1 or clamped then    -- a clamped state is written back, also on a denial
          local q = floor(after / pp)
          packed = struct.pack('<c1I4I4I4I4I7I4', kind, b, p, intervalMs, keepAlive, nowUs + q, after - q * pp)
          if keepAlive > 0 then px = -floor(-resetUs / 1000) + keepAlive end
        end
        local remaining = 0
        if after < cap then remaining = floor((cap - after) / ip) end
        local localMs = -floor(-(b * intervalMs / p))
        if localMs < 1 then localMs = 1 elseif localMs > 1e12 then localMs = 1e12 end
        return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, remaining, retry, resetUs, b, nowUs, wait, b, localMs),
          packed, px
      end
    end
  end
  return nil
end

if gcraFastCall then
  local decided, packed, px = gcraFastTake(redis.call('GET', KEYS[1]), ARGV[3], ARGV[4], ARGV[5], ARGV[2], ARGV[6])
  if decided then
    if px > 0 then redis.call('SET', KEYS[1], packed, 'PX', px) elseif packed then redis.call('SET', KEYS[1], packed) end
    return decided
  end
end
