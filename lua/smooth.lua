-- include: base onekey
-- smooth.lua: Guava's SmoothBursty and SmoothWarmingUp (the math of redlimit's local
-- SmoothRateLimiter, include/redlimit/smooth_rate_limiter.hpp) on one key, so that every process
-- using the key paces and warms up together. A Limiter of Policy::smoothBursty or smoothWarmingUp
-- (kind 'S') runs it. It answers the operations of gcra.lua with the same reply shapes.
--
-- The model (Guava's): one permit costs the stable interval s = I / P. `nextFree` is the time at
-- which the limiter is next free; a request waits only until the current nextFree and then pushes
-- it on by its own cost (the NEXT caller pays). While idle (now > nextFree) the limiter stores
-- permits, up to maxPermits: free ones for a bursty limiter (a burst of maxBurst's worth), costly
-- ones for a warming-up limiter (above the threshold a stored permit costs up to coldFactor x s,
-- so an idle limiter starts slowly and reaches the stable rate after the warm-up period of use).
--
-- Units. With P' = P / g, T' = I(µs) / g (g = gcd(P, I in µs)), s = T'/P' µs, c = cold factor:
--   bursty:   K = T' units per permit.  maxK = B(µs) * P'  (maxPermits = B / s)
--             one idle µs earns P' units (coolDown = s)
--   warm-up:  K = T' * m, m = 2(1 + c). thrK = W P' (1 + c)   (threshold = W / 2s)
--             maxK = W P' (5 + c)        (maxPermits = threshold + 2W / (s(1 + c)))
--             one idle µs earns P'(5 + c) units (coolDown = W / maxPermits)
--   so storing, the threshold, the maximum and refilling are exact integers: K is chosen so.
-- Costs in µs. Fresh permits (not stored): f units cost ceil(f / (P' m)) (m = 1 bursty), rounded
-- up as the local limiter does (Guava truncates). Stored permits are free when bursty; warm-up,
-- above the threshold, taking a units from A above it costs the trapezoid under Guava's
-- permitsToTime(p) = s + p * slope:  a (8WP' + (2A - a)(c - 1)) / (16 W P'^2 (1 + c)), truncated as
-- Guava (mulDiv forms the numerator exactly in 24-bit limbs when it passes 2^53); below the
-- threshold b units cost floor(b / (P' m)). Against Guava's doubles, stored permits here are exact
-- where Guava rounds every division, so a truncated cost can differ by 1 µs where Guava's double
-- lands within rounding error of an integer; the reference vectors come out exactly
-- (tests/integration/smooth_script_test.cpp).
--
-- One fix of the local limiter is kept (its "fix 2"): a refused take (tryAcquire) records that
-- demand is waiting; in the first idle gap after it, the first c x s µs refill stored permits only
-- up to the threshold (retryK units), so a stream of tryAcquire() cannot keep the limiter cold.
--
-- Layout (28 bytes, as the rest of the family: one 48-byte allocation in Redis):
--   kind 'S', P (uint32), I ms (uint32), L ms (uint32: maxBurst when bursty, the warm-up period
--   when warming up), C (uint8: the cold factor 1..127, 0 = bursty; +128 = a take was refused
--   since the last reservation), stored units' low 48 bits (uint48), nextFree's low 48 bits
--   (uint48), byte A (stored's bits 48..52, then e's bits 0..2 as bits 5..7), byte B (nextFree's
--   bits 48..51, then e's bits 3..5 as bits 4..6, and bit 7 set). e is the clamp's exponent (see
--   Clock steps). The first 14 bytes are the configuration. Before the clamp the last 14 bytes
--   were stored and nextFree as two uint56 (no e): byte B's bit 7 is 0 there (nextFree < 2^52),
--   and such a value is read with no clamp until the next write stores this layout.
--   keepAlive is not stored (no room in 28 bytes): it travels in the call (the limit in the
--   call), and a limiter whose configuration is stored keeps its key.
-- Bounds (checked here before anything is written, and by the client before it sends):
--   P in 1..2^32-1, I in 1..2^32-1 ms, L in 0..2^32-1 ms (> 0 when warming up), C in 0..127;
--   maxK <= 2^52; warm-up also K, P'(5+c), 8WP'c, T'(5+c), P'm < 2^53, 16WP'^2(1+c) <= 2^52 and
--   maxK + retryK + P'(5+c) < 2^53; per call n x K < 2^53. Then every value is an exact integer.
--   nextFree saturates at 2^52 - 1 µs (year 2112). keepAlive in 0..2^32-1 ms.
-- Clock steps: Guava's model lets one call leave any debt (a free limiter grants acquire(1000) at
--   1/s, and the next caller waits 1000 s), so no bound on nextFree follows from the
--   configuration. The debt owed at the write does: every write stores e, the least e with
--   nextFree - now <= 2^e - 1 µs (e = 0: nothing owed). Nothing makes nextFree - now larger until
--   the next write, so a stored nextFree more than 2^e - 1 µs ahead of now was written by a clock
--   ahead of the server's clock now (stepped back, or a failover to a replica whose clock is
--   behind), and it is clamped to now + 2^e - 1, the furthest legal value: a step back costs at
--   most twice the debt owed at the write, whatever its size. The next take writes a clamped state back (also when it
--   refuses), so the step is not met again.
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '' for the server's TIME, ARGV[3] 'S'):
--   take n maxWaitUs   Guava's tryAcquire(n, maxWait): granted iff nextFree - maxWait <= now; then
--                      reserves n (delay = nextFree - now, what the caller sleeps; 0 if free). With
--                      maxWait 0: granted iff the limiter is free now. A refusal reserves nothing
--                      (it records the refusal, see above, for a warming-up limiter).
--   peek n             what `take n 0` would decide, with remaining and resetAfter as of now;
--                      writes nothing
--   refund n           gives back n permits' time: nextFree moves back by n x s (not before now);
--                      a bursty limiter stores what is left, up to maxPermits (a warming-up one
--                      does not: stored permits are how cold it is, not credit). Reply: remaining.
--   set mode P I L C [keepAlive]
--                      mode 'try' writes only if the key does not exist, starting as Guava:
--                      bursty with nothing stored, warming up cold (maxPermits stored); nextFree
--                      = now. 'keep' writes the configuration keeping the state (rescale below; a
--                      key without one starts as Guava), and changes nothing when the key holds
--                      this configuration. keepAlive (not stored) is the TTL rule of this write
--                      (see TTL). Reply {written, limit, localRate, localIntervalMs}.
--   take n maxWaitUs cfg, peek n 0 cfg, refund n 0 cfg
--                      the limit in the call: cfg is the caller's configuration, 18 bytes: the
--                      key's first 14 ('S', P, I ms, L ms, C) and keepAlive ms. A key without
--                      one is decided as a limiter idle for long (bursty: maxPermits stored, free;
--                      warming up: cold), which is what an expired key was; a key holding cfg as
--                      it is; a key holding another configuration with cfg, its state kept
--                      (rescale). Only what writes anyway writes cfg with the state.
-- Reply of take and peek: {allowed, remaining, retryAfterUs, resetAfterUs, limit, nowUs, delayUs,
--   localRate, localIntervalMs}. remaining = whole stored permits (bursty: free permits on top of
--   the one the next caller pays for; warming up: how cold the limiter is, not free permits);
--   limit = whole maxPermits; retryAfter (denied) = nextFree - maxWait - now, exact; resetAfter =
--   time until stored permits are back at maxPermits. localRate per localIntervalMs is the Local
--   failure policy's bucket: a bursty limiter's burst + 1 (or 1 when warming up) at the stable rate.
-- TTL: the keepAlive in the call (the limit in the call, or set's) > 0: the time until the
--   limiter holds maxPermits again (resetAfter: full, or cold) plus keepAlive, so an idle key
--   vanishes then and decides as a new one. Otherwise none; state writes keep a TTL set on the key
--   by hand (SET KEEPTTL), set clears it.
local LAYOUT = '<c1I4I4I4BI6I6BB'
local OLD_LAYOUT = '<c1I4I4I4BI7I7'
local CONFIG_LAYOUT = '<c1I4I4I4BI4'
local TWO48 = 281474976710656
local label = 'smooth limiter'
local op = ARGV[1]
if ARGV[3] ~= 'S' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for smooth.lua') end
local nowUs = currentMicros(ARGV[2])

local LIMIT = 9007199254740992        -- 2^53: every integer below is exact
local MAX_TIME = TWO52 - 1            -- nextFree saturates here (µs, year 2112)
local MAX_COLD = 127
local TWO24 = 16777216
local POW2 = {}
for b = 0, 63 do POW2[b] = 2 ^ b end      -- mulDiv's limbs use 0..23; the clamp's 2^e up to 63

-- floor(x * y / d) for integers 0 <= x, y < 2^53, 1 <= d <= 2^52, when the result is < 2^53.
-- A product below 2^53 is exact and then so is the floor of its quotient (for N, d < 2^53 the
-- correctly rounded N/d never crosses an integer). A larger product is formed exactly in six
-- 24-bit limbs and divided bit by bit (the remainder stays below 2d <= 2^53).
local function mulDiv(x, y, d)
  local p = x * y
  if p < LIMIT then return math.floor(p / d) end
  local x0, y0 = x % TWO24, y % TWO24
  local x1, y1 = math.floor(x / TWO24) % TWO24, math.floor(y / TWO24) % TWO24
  local x2, y2 = math.floor(x / 281474976710656), math.floor(y / 281474976710656)
  local z = {x0 * y0, x0 * y1 + x1 * y0, x0 * y2 + x1 * y1 + x2 * y0, x1 * y2 + x2 * y1, x2 * y2, 0}
  local carry = 0
  for i = 1, 6 do
    local v = z[i] + carry
    z[i] = v % TWO24
    carry = math.floor(v / TWO24)
  end
  local q, r = 0, 0
  for i = 6, 1, -1 do
    local v = z[i]
    for b = 23, 0, -1 do
      local bit = 0
      if v >= POW2[b] then bit = 1; v = v - POW2[b] end
      r = r * 2 + bit
      q = q * 2
      if r >= d then r = r - d; q = q + 1 end
    end
  end
  return q
end

-- The derived constants of P per I ms with L ms and cold factor C (0 = bursty), or nil and what
-- is wrong. (Products of exact integers that pass 2^53 round to >= 2^53, so the checks hold.)
local function derive(p, intervalMs, lms, cold)
  if p < 1 or p > MAX_U32 then return nil, 'the permits per interval must be in 1..' .. MAX_U32 end
  if intervalMs < 1 or intervalMs > MAX_U32 then return nil, 'the interval must be in 1..' .. MAX_U32 .. ' ms' end
  if lms > MAX_U32 then return nil, 'maxBurst / the warm-up period must be in 0..' .. MAX_U32 .. ' ms' end
  if cold > MAX_COLD then return nil, 'the cold factor must be in 1..' .. MAX_COLD end
  local g = gcd(p, intervalMs * 1000)
  local P, T = p / g, intervalMs * 1000 / g
  local c = {p = p, intervalMs = intervalMs, L = lms, cold = cold, P = P, T = T}
  if cold == 0 then
    c.K, c.m, c.earn = T, 1, P
    c.maxK = lms * 1000 * P
    c.thrK = c.maxK
    c.retryK = 0
    if c.maxK > TWO52 then return nil, 'maxBurst x rate is too large to keep exact (maxBurst in µs x P\' > 2^52)' end
  else
    local W = lms * 1000
    if W == 0 then return nil, 'a warming-up limiter needs a warm-up period > 0' end
    c.m = 2 * (1 + cold)
    c.K = T * c.m
    c.earn = P * (5 + cold)
    c.thrK = W * P * (1 + cold)
    c.maxK = W * P * (5 + cold)
    c.B8 = 8 * W * P                         -- the trapezoid's constant term
    c.D = 16 * W * P * P * (1 + cold)        -- and its divisor
    c.retryK = cold * T * (5 + cold)         -- units earned in c x s µs
    if c.K >= LIMIT or c.earn >= LIMIT or c.maxK > TWO52 or c.D > TWO52 or 8 * W * P * cold >= LIMIT or
        T * (5 + cold) >= LIMIT or P * c.m >= LIMIT or c.maxK + c.retryK + c.earn >= LIMIT then
      return nil, 'rate x warm-up period x cold factor is too large to keep exact'
    end
  end
  c.limit = floorDiv(c.maxK, c.K)
  -- The Local failure policy's bucket (an estimate for an emergency; doubles are fine here).
  c.lr = 1
  if cold == 0 then c.lr = c.limit + 1 end
  local ms = math.ceil(c.lr * intervalMs / p)
  if ms < 1 then ms = 1 end
  if ms > 1e12 then ms = 1e12 end
  c.lms = ms
  return c
end

-- The limiter's configuration and state (the packed value v, read), checked before anything is
-- written, with nextFree clamped after a clock step (see above).
local function unpackState(v)
  local _, p, intervalMs, lms, cbyte, stored, nextFree
  local bound = nil                          -- 2^e - 1 µs, the furthest legal nextFree from now
  if string.byte(v, 28) >= 128 then
    local a, b
    _, p, intervalMs, lms, cbyte, stored, nextFree, a, b = struct.unpack(LAYOUT, v)
    stored = stored + (a % 32) * TWO48
    nextFree = nextFree + (b % 16) * TWO48
    bound = POW2[math.floor(a / 32) + (math.floor(b / 16) % 8) * 8] - 1
  else
    _, p, intervalMs, lms, cbyte, stored, nextFree = struct.unpack(OLD_LAYOUT, v)
  end
  local refused = cbyte >= 128
  if refused then cbyte = cbyte - 128 end
  local c, why = derive(p, intervalMs, lms, cbyte)
  if not c then
    fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. label .. ' ' .. KEYS[1] .. ': ' .. why ..
      '; fix it with Limiter::setPolicy')
  end
  if stored > c.maxK or nextFree > MAX_TIME then
    fail('REDLIMIT_INVALID_STATE', 'key ' .. KEYS[1] .. ' of ' .. label ..
      ' holds stored permits or a time redlimit did not write; reset it with Limiter::setPolicy')
  end
  local clamped = false
  if bound and nextFree > nowUs + bound then
    nextFree, clamped = nowUs + bound, true  -- the server's clock went back: clamped
  end
  c.keepAlive, c.stored, c.nextFree, c.refused, c.clamped = 0, stored, nextFree, refused, clamped
  return c
end

local function load()
  local v = readPacked('S', label)
  if not v then notInitialized(label) end
  return unpackState(v)
end

-- min(idle * earn, cap) without leaving the exact range (idle * earn < cap + earn < 2^53).
local function earned(c, idle, cap)
  if idle >= ceilDiv(cap, c.earn) then return cap end
  return idle * c.earn
end

-- Guava's resync: permits stored while idle (now > nextFree); nextFree moves to now.
local function resync(c)
  if nowUs <= c.nextFree then return end
  local idle = nowUs - c.nextFree
  if c.refused and c.cold > 0 then
    local e = earned(c, idle, c.maxK + c.retryK)
    local retry = math.min(e, c.retryK)
    if c.stored < c.thrK then c.stored = math.min(c.thrK, c.stored + retry) end
    if e > retry then c.stored = math.min(c.maxK, c.stored + (e - retry)) end
  else
    c.stored = math.min(c.maxK, c.stored + earned(c, idle, c.maxK))
  end
  c.refused = false
  c.nextFree = nowUs
end

-- Guava's reserveEarliestAvailable (after resync): spends stored permits first, pushes nextFree
-- on by the cost; returns the time the caller may proceed (the nextFree before).
local function reserve(c, n)
  local moment = c.nextFree
  local wanted = n * c.K
  local spend = math.min(wanted, c.stored)
  local cost = 0
  if c.cold > 0 and spend > 0 then
    local rest = spend
    local above = c.stored - c.thrK
    if above > 0 then
      local a = math.min(above, rest)
      cost = mulDiv(a, c.B8 + (2 * above - a) * (c.cold - 1), c.D)
      rest = rest - a
    end
    if rest > 0 then cost = cost + floorDiv(rest, c.P * c.m) end
  end
  local fresh = wanted - spend
  if fresh > 0 then cost = cost + ceilDiv(fresh, c.P * c.m) end
  c.nextFree = math.min(c.nextFree + cost, MAX_TIME)
  c.stored = c.stored - spend
  c.refused = false
  return moment
end

-- µs from now until stored permits are back at maxPermits, if nobody takes any.
local function resetAfter(c)
  local busy = 0
  if c.nextFree > nowUs then busy = c.nextFree - nowUs end
  if c.stored >= c.maxK then return busy end
  local need = c.maxK - c.stored
  if c.refused and c.cold > 0 then
    local s1 = c.stored
    if s1 < c.thrK then s1 = math.min(c.thrK, s1 + c.retryK) end
    need = c.retryK + (c.maxK - s1)
  end
  return busy + ceilDiv(need, c.earn)
end

-- Writes the state at now. keepAlive > 0: with the TTL above; else keepTtl keeps the key's TTL.
local function store(c, keepTtl)
  local cb = c.cold
  if c.refused then cb = cb + 128 end
  local e = 0                                -- the least e with debt <= 2^e - 1 (debt < 2^52)
  while POW2[e] - 1 < c.nextFree - nowUs do e = e + 1 end
  local sHi, fHi = math.floor(c.stored / TWO48), math.floor(c.nextFree / TWO48)
  local v = struct.pack(LAYOUT, 'S', c.p, c.intervalMs, c.L, cb, c.stored - sHi * TWO48, c.nextFree - fHi * TWO48,
    sHi + (e % 8) * 32, fHi + math.floor(e / 8) * 16 + 128)
  if c.keepAlive > 0 then
    redis.call('SET', KEYS[1], v, 'PX', ceilDiv(resetAfter(c), 1000) + c.keepAlive)
  elseif keepTtl then
    redis.call('SET', KEYS[1], v, 'KEEPTTL')
  else
    redis.call('SET', KEYS[1], v)
  end
end

-- The state of `old` (another configuration, at now) kept in `n`: Guava's setRate, resync at the
-- old configuration, then stored permits scaled to the new maximum (stored x newMax / oldMax,
-- rounded down; 0 when oldMax is 0), nextFree and the refusal kept (the next request still pays the
-- debt owed at the old rate). The same for a change of maxBurst, of the warm-up or of the mode: an
-- idle limiter stays idle (full, or cold), a busy one stays as busy.
local function rescale(old, n)
  resync(old)
  n.nextFree, n.refused, n.stored, n.clamped = old.nextFree, old.refused, 0, old.clamped
  if old.maxK > 0 then n.stored = mulDiv(old.stored, n.maxK, old.maxK) end
end

-- The limiter under the caller's configuration cfg (18 bytes), see `take n maxWaitUs cfg` above.
local function withConfig(cfg)
  if #cfg ~= 18 then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call must be 18 bytes') end
  local k, p, intervalMs, lms, cold, keepAlive = struct.unpack(CONFIG_LAYOUT, cfg)
  if k ~= 'S' then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call is not one of ' .. label) end
  local n, why = derive(p, intervalMs, lms, cold)
  if not n then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. KEYS[1] .. ': ' .. why) end
  n.keepAlive = keepAlive
  local v = readPacked('S', label)
  -- The same configuration: bytes 2..13 and the cold factor (byte 14 without the refusal bit).
  if v and string.sub(v, 2, 13) == string.sub(cfg, 2, 13) and string.byte(v, 14) % 128 == cold then
    local c = unpackState(v)
    c.keepAlive = keepAlive
    return c
  end
  if v then
    rescale(unpackState(v), n)
  else
    n.stored, n.nextFree, n.refused = n.maxK, nowUs, false  -- idle for long: full, or cold
  end
  return n
end

-- The limiter: with the caller's configuration (ARGV[6]) or the stored one.
local function current()
  if ARGV[6] then return withConfig(ARGV[6]) end
  return load()
end

local function permitsArg(c, arg, lo, what)
  local n = countArg(arg, lo, MAX_U32, what)
  if n * c.K >= LIMIT then
    fail('REDLIMIT_INVALID_ARGUMENT', what .. ' (' .. n .. ') are too many for ' .. label .. ' ' .. KEYS[1] ..
      ' to count exactly at its rate (permits x ' .. c.K .. ' units must stay below 2^53)')
  end
  return n
end

local function answer(c, allowed, retry, delay)
  return {allowed, floorDiv(c.stored, c.K), retry, resetAfter(c), c.limit, nowUs, delay, c.lr, c.lms}
end

if op == 'take' or op == 'peek' then
  local c = current()
  local n = permitsArg(c, ARGV[4], 1, 'permits')
  local maxWait = 0
  if op == 'take' then
    maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait')
    if maxWait > MAX_TIME then maxWait = MAX_TIME end
  end
  local due = c.nextFree - maxWait
  if due > nowUs then
    if op == 'take' and c.cold > 0 and not c.refused then
      c.refused = true
      store(c, true)
    elseif op == 'take' and c.clamped then
      store(c, true)                         -- a clock step: written back clamped
    end
    return answer(c, 0, due - nowUs, 0)
  end
  resync(c)
  if op == 'peek' then return answer(c, 1, 0, 0) end
  local moment = reserve(c, n)
  store(c, true)
  local delay = 0
  if moment > nowUs then delay = moment - nowUs end
  return answer(c, 1, 0, delay)
end

if op == 'refund' then
  local c = current()
  local n = permitsArg(c, ARGV[4], 0, 'permits to refund')
  resync(c)
  local units = n * c.K
  local back = math.min(c.nextFree - nowUs, (floorDiv(units, c.P * c.m)))
  c.nextFree = c.nextFree - back
  if c.cold == 0 then c.stored = math.min(c.maxK, c.stored + (units - back * c.P * c.m)) end
  store(c, true)
  return (floorDiv(c.stored, c.K))
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'keep' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or keep') end
  local p = countArg(ARGV[5], 1, MAX_U32, 'permits per interval')
  local intervalMs = countArg(ARGV[6], 1, MAX_U32, 'interval (ms)')
  local lms = countArg(ARGV[7], 0, MAX_U32, 'maxBurst or warm-up period (ms)')
  local cold = countArg(ARGV[8], 0, MAX_COLD, 'cold factor')
  local keepAlive = 0
  if ARGV[9] then keepAlive = countArg(ARGV[9], 0, MAX_U32, 'keepAlive (ms)') end
  local c, why = derive(p, intervalMs, lms, cold)
  if not c then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. KEYS[1] .. ': ' .. why) end
  c.keepAlive = keepAlive
  local v = readPacked('S', label)
  if v and mode == 'try' then return {0, 0, 0, 0} end
  -- A stored configuration or state that cannot be used has nothing to keep: 'keep' resets it.
  local usable, old = false, nil
  if v then usable, old = pcall(unpackState, v) end
  if usable then
    if string.sub(v, 2, 13) == struct.pack('<I4I4I4', p, intervalMs, lms) and string.byte(v, 14) % 128 == cold then
      return {1, c.limit, c.lr, c.lms}     -- the same configuration: nothing changes
    end
    rescale(old, c)
  else
    c.stored, c.nextFree, c.refused = 0, nowUs, false
    if cold > 0 then c.stored = c.maxK end
  end
  store(c, false)
  return {1, c.limit, c.lr, c.lms}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for smooth.lua')
