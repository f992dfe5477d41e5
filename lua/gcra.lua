-- gcra.lua: the generic cell rate algorithm on one key. GcraRateLimiter (kind 'G') and
-- TokenBucketRateLimiter (kind 'T') both run it.
--
-- A token bucket of capacity B refilled with P permits every I, and GCRA with burst B and rate
-- P per I, are one algorithm: at time t the bucket holds B - max(0, TAT - t) / T permits, where
-- T = I / P is the time one permit takes to come back and TAT (the "theoretical arrival time")
-- the time at which the bucket is full again. So the state is one time rather than tokens plus a
-- timestamp (folly's TokenBucket also keeps a single time). Taking n permits is allowed when
-- max(TAT, now) + n*T <= now + B*T, and moves TAT there. Time is the server's, read here.
--
-- Units: T = I / P is rarely a whole number of µs. With g = gcd(P, I in µs), P' = P / g and
-- I' = I / g, one permit is exactly I' units of 1/P' µs. A time is stored as whole µs plus a
-- remainder in units (0 <= rem < P'); the script works on D = max(0, TAT - now) in units, never
-- on an absolute time in units.
--
-- Bounds (the client checks a configuration before sending it, and this script checks it again):
--   B, P in 1..2^32-1; I in 1..2^32-1 ms; keepAlive in 0..2^32-1 ms; B*I' <= 2^50.
--   A reservation waits at most W = floor(2^52 / P') µs (at least 2^20 µs; for rates whose
--   reduced P' is 1, e.g. 1000 per second, 142 years), so D <= B*I' + W*P' <= 2^50 + 2^52, and
--   D + n*I' (n <= B) < 2^53: every value below is an exact integer.
-- Layout (28 bytes): kind 'G' or 'T', B (uint32), P (uint32), I ms (uint32), keepAlive ms
--   (uint32), TAT µs (uint56), TAT's remainder in units (uint32).
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind):
--   take n maxWaitUs   takes n permits if the bucket holds them; with maxWaitUs > 0, also if it
--                      will hold them within maxWaitUs: a reservation, which moves TAT past
--                      now + B*T (the bucket goes into debt) and tells the caller to wait
--                      `delay`. Writes only when it takes.
--   peek n             what `take n 0` would decide, with remaining and resetAfter as they are
--                      now; writes nothing
--   refund n           gives n permits back, up to a full bucket
--   set mode B P I keepAlive initial
--                      mode 'try' writes only if the key does not exist; 'reset' overwrites the
--                      configuration of a limiter of this kind and restarts its state with
--                      `initial` permits (0..B). Reply {written, B, localRate, localIntervalMs}.
--   config             {B, localRate, localIntervalMs, B, P, I, keepAlive}
-- Reply of take and peek: {allowed, remaining, retryAfterUs, resetAfterUs, B, nowUs, delayUs,
--   localRate, localIntervalMs}. retryAfter (denied) is exact: the same call succeeds at
--   now + retryAfter and not a µs earlier, if nobody else takes permits. localRate per
--   localIntervalMs (B permits, refilled at the same average rate) is what the client's Local
--   failure policy runs when Redis cannot be asked.
-- TTL: none unless keepAlive > 0; then the time until the bucket is full again plus keepAlive.
local LAYOUT = '<c1I4I4I4I4I7I4'
local op, kind = ARGV[1], ARGV[3]
local label
if kind == 'G' then
  label = 'GcraRateLimiter'
elseif kind == 'T' then
  label = 'TokenBucketRateLimiter'
else
  fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for gcra.lua')
end
local nowUs = currentMicros(ARGV[2])

-- P' and I' of P permits per intervalMs.
local function units(p, intervalMs)
  local ius = intervalMs * 1000
  local g = gcd(p, ius)
  return p / g, ius / g
end

-- nil if the configuration is usable, else what is wrong with it.
local function configProblem(b, p, intervalMs, keepAlive)
  if b < 1 or b > MAX_U32 then return 'the burst (capacity) must be in 1..' .. MAX_U32 end
  if p < 1 or p > MAX_U32 then return 'the permits per interval must be in 1..' .. MAX_U32 end
  if intervalMs < 1 or intervalMs > MAX_U32 then return 'the interval must be in 1..' .. MAX_U32 .. ' ms' end
  if keepAlive > MAX_U32 then return 'keepAlive must be in 0..' .. MAX_U32 .. ' ms' end
  local _, ip = units(p, intervalMs)
  if b * ip > TWO50 then
    return 'burst x (interval in µs / gcd(permits, interval in µs)) exceeds 2^50'
  end
  return nil
end

-- The limiter's configuration and D, checked before anything is written.
local function load()
  local v = readPacked(kind, label)
  if not v then notInitialized(label) end
  local _, b, p, intervalMs, keepAlive, tatUs, tatRem = struct.unpack(LAYOUT, v)
  local bad = configProblem(b, p, intervalMs, keepAlive)
  if bad then
    fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. label .. ' ' .. KEYS[1] .. ': ' .. bad ..
      '; fix it with setConfig()')
  end
  local s = {b = b, p = p, intervalMs = intervalMs, keepAlive = keepAlive}
  s.pp, s.ip = units(p, intervalMs)
  if tatRem >= s.pp or tatUs >= TWO52 * 2 then
    fail('REDLIMIT_INVALID_STATE', 'key ' .. KEYS[1] .. ' of ' .. label ..
      ' holds a time redlimit did not write; reset it with setConfig()')
  end
  s.cap = b * s.ip                         -- B*I' <= 2^50
  s.maxWait = floorDiv(TWO52, s.pp)        -- W, µs: W*P' <= 2^52
  local dmax = s.cap + s.maxWait * s.pp
  s.d = 0
  if tatUs >= nowUs then
    local dt = tatUs - nowUs
    if dt > ceilDiv(dmax, s.pp) then
      s.d = dmax                           -- the server's clock went back: as far ahead as TAT can be
    else
      s.d = dt * s.pp + tatRem             -- <= dmax + 2P' < 2^53
      if s.d > dmax then s.d = dmax end
    end
  end
  return s
end

-- The bucket the Local failure policy runs: B permits per the time B permits take to come back
-- (an estimate for an emergency; doubles are fine here).
local function localRate(s)
  local ms = math.ceil(s.b * s.intervalMs / s.p)
  if ms < 1 then ms = 1 end
  if ms > 1e12 then ms = 1e12 end
  return s.b, ms
end

-- Stores TAT = now + d units.
local function store(s, d)
  local q, r = floorDiv(d, s.pp)
  writePacked(struct.pack(LAYOUT, kind, s.b, s.p, s.intervalMs, s.keepAlive, nowUs + q, r), ceilDiv(d, s.pp),
    s.keepAlive)
end

local function permitsArg(s, arg)
  local n = countArg(arg, 1, MAX_U32, 'permits')
  if n > s.b then
    fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits (' .. n .. ') exceed the burst (' .. s.b .. ') of ' ..
      label .. ' ' .. KEYS[1] .. ': they could never be granted at once')
  end
  return n
end

if op == 'take' or op == 'peek' then
  local s = load()
  local n = permitsArg(s, ARGV[4])
  local maxWait = 0
  if op == 'take' then
    maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait')
    if maxWait > s.maxWait then maxWait = s.maxWait end
  end
  local need = s.d + n * s.ip
  local excess = need - s.cap
  local allowed, delay, retry, after = 0, 0, 0, s.d
  if excess <= 0 then
    allowed, after = 1, need
  else
    local wait = ceilDiv(excess, s.pp)     -- the first µs at which need - wait*P' <= B*I'
    if wait <= maxWait then
      allowed, delay, after = 1, wait, need
    else
      retry = wait - maxWait
    end
  end
  if op == 'peek' then
    after = s.d
  elseif allowed == 1 then
    store(s, after)
  end
  local remaining = 0
  if after < s.cap then remaining = floorDiv(s.cap - after, s.ip) end
  local lr, lms = localRate(s)
  return {allowed, remaining, retry, ceilDiv(after, s.pp), s.b, nowUs, delay, lr, lms}
end

if op == 'refund' then
  local s = load()
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund')
  local d = s.d
  if n >= ceilDiv(d, s.ip) then
    d = 0
  else
    d = d - n * s.ip                         -- n*I' < D + I'
  end
  if d ~= s.d then store(s, d) end
  if d >= s.cap then return 0 end
  return floorDiv(s.cap - d, s.ip)
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'reset' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or reset') end
  local b = countArg(ARGV[5], 1, MAX_U32, 'burst')
  local p = countArg(ARGV[6], 1, MAX_U32, 'permits per interval')
  local intervalMs = countArg(ARGV[7], 1, MAX_U32, 'interval (ms)')
  local keepAlive = countArg(ARGV[8], 0, MAX_U32, 'keepAlive (ms)')
  local initial = countArg(ARGV[9], 0, b, 'initial permits')
  local bad = configProblem(b, p, intervalMs, keepAlive)
  if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. KEYS[1] .. ': ' .. bad) end
  if readPacked(kind, label) and mode == 'try' then return {0, 0, 0, 0} end
  local s = {b = b, p = p, intervalMs = intervalMs, keepAlive = keepAlive}
  s.pp, s.ip = units(p, intervalMs)
  store(s, (b - initial) * s.ip)             -- <= B*I'
  local lr, lms = localRate(s)
  return {1, b, lr, lms}
end

if op == 'config' then
  local s = load()
  local lr, lms = localRate(s)
  return {s.b, lr, lms, s.b, s.p, s.intervalMs, s.keepAlive}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for gcra.lua')
