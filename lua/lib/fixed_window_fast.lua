-- lib/fixed_window_fast.lua: the fast path of `take` on a fixed window key, written once for
-- fixed_window.lua (its own call) and batch.lua (each decision of kind 'W').
--
-- windowFastTake(v, n, maxWait, nowUs, cfg) decides `take n maxWait [cfg]` on a key whose value
-- the caller read (v: GET's string, false or nil for a missing key; redis.pcall's error table
-- for a key of another Redis type, whose length is 0, is not decided here), at nowUs (a number, a
-- decimal string, or '' = the server's TIME, read only once the key is known to be usable), with
-- cfg the caller's configuration (the key's first 13 bytes) or nil. A key that holds a fixed
-- window with a usable configuration and state, and usable arguments, is decided here with locals
-- only, by exactly the arithmetic of lib/fixed_window_core.lua (windowLoad, windowTake,
-- windowStore, windowResetAfter). It returns the reply, the 65-byte packed decision of
-- lib/onekey.lua's packDecision packed inline, then what the caller writes to the key as
-- windowStore would: its value (nil: nothing to write) and PX in ms (0: no TTL), and countOnly:
-- true when only the count changed, in the window the key holds, which counted permits already.
-- Then the key's TTL (when keepAlive > 0: the end of that window, or of the next one with permits
-- reserved there, plus keepAlive) stays as it is, and the caller may write the 4 bytes of the count
-- alone (offset 20) with SETRANGE, which keeps the TTL: about a third of what a whole SET with PX
-- costs. It writes nothing itself, so a batch writes a key taken several times once. Anything else
-- returns nil: the full code (lib/fixed_window_core.lua) decides it, checking everything in order,
-- and fails with the precise error. A grant costs two Redis calls, the GET and one write, and TIME
-- when nowUs is '' (always, from the limiters' own calls). A key updated in place is stored raw
-- instead of embstr; MEMORY USAGE is the same (88 bytes for a 14-byte name). A TTL set on the key
-- from outside (with keepAlive 0) lasts until the next whole SET, at the next window. a % b for integers
-- 0 <= a < 2^53, b >= 1 is exact in doubles. With the configuration in the call, the key must begin
-- with it; a missing key is decided as the configuration with window 0.
--
-- This file uses no other library and is included before them (first on the include line), so
-- that its one closure is made before theirs. A script whose own call is the take sets
-- `windowFastCall` above its include line: the take is then decided right here, before any helper
-- of the libraries after this one is made (each is a closure made anew on every call; see
-- cmake/EmbedLua.cmake), and the script goes on past its include line only when it was not. The
-- key is read with redis.call, so a key of another Redis type fails with Redis's WRONGTYPE error;
-- ScriptCore, which knows the key, turns it into ScriptError (InvalidConfig).
local function windowFastTake(v, n, maxWait, nowUs, cfg)
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
  -- A missing key under the configuration in the call is that configuration with window 0 (long
  -- past: nothing counted, windowWithConfig's windowNew), so the fast path decides it too.
  if not v and cfg and #cfg == 13 then v = cfg .. '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0' end
  if v and #v == 28 and nowUs and n and maxWait and n >= 1 and n % 1 == 0 and maxWait >= 0 and
      maxWait < 1e14 and maxWait % 1 == 0 then
    local k, l, windowMs, keepAlive, start, count, nextCount = struct.unpack('<c1I4I4I4I7I4I4', v)
    local wus = windowMs * 1000
    if k == 'W' and n <= l and windowMs >= 1 and start < 9007199254740992 and start % wus == 0 and
        count <= l and nextCount <= l and (cfg == nil or string.find(v, cfg, 1, true) == 1) then
      if serverTime then
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
      local packed, px = nil, 0
      if allowed == 1 or clamped then      -- a clamped window is written back, also on a denial
        packed = struct.pack('<c1I4I4I4I7I4I4', 'W', l, windowMs, keepAlive, start, count, nextCount)
        if keepAlive > 0 then px = math.ceil(resetUs / 1000) + keepAlive end
      end
      return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, l - count, retry, resetUs, l, nowUs, delay, l, windowMs),
        packed, px, allowed == 1 and delay == 0 and start == stored and counted and not clamped
    end
  end
  return nil
end

if windowFastCall then
  local decided, packed, px, countOnly = windowFastTake(redis.call('GET', KEYS[1]), ARGV[4], ARGV[5], ARGV[2], ARGV[6])
  if decided then
    if countOnly then
      redis.call('SETRANGE', KEYS[1], '20', string.sub(packed, 21, 24))
    elseif px > 0 then redis.call('SET', KEYS[1], packed, 'PX', px) elseif packed then redis.call('SET', KEYS[1], packed) end
    return decided
  end
end
