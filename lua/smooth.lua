-- smooth.lua: Guava's SmoothBursty and SmoothWarmingUp (the math of redlimit's local
-- SmoothRateLimiter, include/redlimit/smooth_rate_limiter.hpp) with its state in one Redis hash,
-- so that every process using the key paces and warms up together. Time is the server's TIME in
-- µs. Integer arithmetic only: every value below is an exact integer < 2^53 (Lua numbers are
-- doubles); the bounds that guarantee it are checked before anything is written.
--
-- KEYS[1] the limiter's hash (the only key). Fields:
--   cfg  "P:T:B:W:CN:CD"  the rate is P permits per T µs (stored reduced by their gcd); B = the
--                         bursty limiter's maxBurst in µs; W = warm-up period in µs (0 = bursty);
--                         cold factor CN/CD (1 <= CN/CD; 1:1 for a bursty limiter)
--   s    stored permits, in units of 1/K permit (K below): exact, never rounded
--   n    nextFree: epoch µs at which the limiter is next free (Guava's nextFreeTicketMicros)
--   r    "1" if a tryAcquire was refused since the last reservation, else "0" (the local
--        limiter's fix 2: a refused caller's retry gap refills only up to the threshold)
--
-- Units. With s = T/P µs per permit (Guava's stableInterval) and c = CN/CD:
--   bursty:   K = T.             maxPermits = B/s         -> maxK = B*P
--             one idle µs earns 1/s permits               -> P units
--   warm-up:  K = 2T(CD+CN).     threshold = W/(2s)       -> thrK = W*P*(CD+CN)
--             maxPermits = threshold + 2W/(s(1+c))        -> maxK = W*P*(5CD+CN)
--             coolDown = W/maxPermits: one idle µs earns  -> P*(5CD+CN) units
--   so storing, the threshold, the maximum and refilling are exact integers: K is chosen so.
-- Costs in µs, for spending stored permits (warm-up only; stored permits are free when bursty):
--   above the threshold, the trapezoid under Guava's permitsToTime(p) = s + p*slope: taking a
--   units from A units above the threshold costs
--       a * (8WP*CD^2 + (2A - a)(CN - CD)) / (16 W P^2 CD^2 (CD+CN))      truncated, as Guava
--   (the numerator can pass 2^53: mulDiv computes it exactly in 24-bit limbs); below the
--   threshold b units cost b / (2P(CD+CN)), truncated, as Guava. Fresh permits (not stored) cost
--   f units -> f / (P*m) with m = K/T, rounded UP, as the local limiter does (Guava truncates).
-- Against Guava's doubles (and the local limiter's): the stored permits here are exact where
-- Guava rounds every division, so a cost truncated to whole µs can differ by 1 µs where Guava's
-- double lands within rounding error of an integer; nothing else differs. The reference vectors
-- of reference/guava-semantics.md come out exactly (tests/integration/smooth_script_test.cpp).
--
-- ARGV[1] is the operation:
--   init P T B W CN CD  writes the configuration and the initial state (bursty: nothing stored;
--                       warm-up: cold, maxPermits stored; nextFree = now) unless the key exists.
--                       Reply {1 if created else 0, now}.
--   reserve N           Guava's reserve(N): always granted; the caller waits until the previous
--                       nextFree and the NEXT caller pays for these N permits.
--   try N TIMEOUT       Guava's tryAcquire(N, timeout): reserve only if nextFree - TIMEOUT <= now
--                       (TIMEOUT in µs, >= 0; the client clamps larger values to 2^52).
-- reserve and try reply {granted (1/0), wait, now, nextFree, storedUnits, K}: granted: wait = µs
-- the caller must wait before using the permits (0 if the limiter was free); refused: wait = µs
-- from now until the same tryAcquire could succeed (nextFree - TIMEOUT - now), nothing reserved.
-- Errors (common.lua's fail): REDLIMIT_INVALID_ARGUMENT (bad operation or numbers, or numbers
-- too large to keep exact), REDLIMIT_NOT_INITIALIZED (no key), REDLIMIT_INVALID_CONFIG (the hash
-- holds a configuration or state this script cannot use). Every check runs before the first write.

local LIMIT = 9007199254740992        -- 2^53: every integer below is exact
local MAX_TIME = 4503599627370496     -- 2^52 µs (year 2112): nextFree saturates here
local TWO24 = 16777216
local POW2 = {}
for b = 0, 23 do POW2[b] = 2 ^ b end

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

local function gcd(a, b)
  while b > 0 do a, b = b, a % b end
  return a
end

-- An integer written in decimal digits only, 0 <= n <= hi, or nil. (tostring cannot print large
-- integers, so the state is written with %.0f and read back this way.)
local function parseUnsigned(s, hi)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') or (#s > 1 and string.sub(s, 1, 1) == '0') then
    return nil
  end
  local n = tonumber(s)
  if n == nil or n > hi then return nil end
  return n
end

local function int(n) return string.format('%.0f', n) end

-- The derived constants of a configuration, or nil and the reason it cannot be used.
local function derive(P, T, B, W, CN, CD)
  if P < 1 or T < 1 then return nil, 'permits and period must be >= 1' end
  if CD < 1 or CN < CD then return nil, 'the cold factor CN/CD must be >= 1' end
  local g = gcd(P, T)
  local c = {P = P / g, T = T / g, B = B, W = W, CN = CN, CD = CD}
  P, T = c.P, c.T
  if W == 0 then
    c.K, c.m, c.earn = T, 1, P
    c.maxK = B * P
    c.thrK = c.maxK
    if c.maxK >= LIMIT then return nil, 'maxBurst x rate is too large to keep exact' end
  else
    local g2 = gcd(CN, CD)
    CN, CD = CN / g2, CD / g2
    c.CN, c.CD = CN, CD
    c.m = 2 * (CD + CN)
    c.K = T * c.m
    c.earn = P * (5 * CD + CN)
    c.thrK = W * P * (CD + CN)
    c.maxK = W * P * (5 * CD + CN)
    c.B8 = 8 * W * P * CD * CD                       -- the trapezoid's constant term
    c.D = 16 * W * P * P * CD * CD * (CD + CN)       -- and its divisor
    c.span = 8 * W * P * CD * CN                     -- bound of the numerator's second factor
    if c.K >= LIMIT or c.earn >= LIMIT or c.D > LIMIT / 2 or c.span >= LIMIT then
      return nil, 'the warm-up configuration is too large to keep exact (rate x warm-up x cold factor)'
    end
    -- the retry gap of fix 2 (coldFactor x stableInterval) earns CN*T*(5CD+CN)/CD units
    if T * (5 * CD + CN) >= LIMIT then return nil, 'period x cold factor is too large to keep exact' end
    c.retryK = mulDiv(CN, T * (5 * CD + CN), CD)
    if c.maxK + c.retryK + c.earn >= LIMIT then
      return nil, 'the warm-up configuration is too large to keep exact (rate x warm-up x cold factor)'
    end
  end
  return c
end

local op = ARGV[1]
local key = KEYS[1]

if op == 'init' then
  local v = {}
  for i = 2, 7 do
    v[i - 1] = parseUnsigned(ARGV[i], 100000000000000)
    if v[i - 1] == nil then
      fail('REDLIMIT_INVALID_ARGUMENT', 'init takes P T B W CN CD as integers in 0..10^14, argument ' ..
        (i - 1) .. ' is "' .. tostring(ARGV[i]) .. '"')
    end
  end
  local c, why = derive(v[1], v[2], v[3], v[4], v[5], v[6])
  if not c then fail('REDLIMIT_INVALID_ARGUMENT', 'smooth limiter ' .. key .. ': ' .. why) end
  local fields = readKey('REDLIMIT_INVALID_CONFIG', key, 'a hash', 'HLEN')
  local now = currentMicros(nil)
  if fields > 0 then return {0, now} end
  local stored = 0
  if c.W > 0 then stored = c.maxK end
  redis.call('HSET', key, 'cfg', table.concat({int(c.P), int(c.T), int(c.B), int(c.W), int(c.CN), int(c.CD)}, ':'),
    's', int(stored), 'n', int(now), 'r', '0')
  return {1, now}
end

if op ~= 'reserve' and op ~= 'try' then
  fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation "' .. tostring(op) .. '" (init, reserve, try)')
end
local permits = parseUnsigned(ARGV[2], LIMIT)
if not permits or permits < 1 then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits must be an integer >= 1, got "' .. tostring(ARGV[2]) .. '"')
end
local timeout = 0
if op == 'try' then
  timeout = parseUnsigned(ARGV[3], MAX_TIME)
  if not timeout then
    fail('REDLIMIT_INVALID_ARGUMENT', 'timeout must be an integer number of µs in 0..2^52, got "' ..
      tostring(ARGV[3]) .. '"')
  end
end

-- Read and check everything before any write.
local h = readKey('REDLIMIT_INVALID_CONFIG', key, 'a hash', 'HMGET', 'cfg', 's', 'n', 'r')
if not h[1] and not h[2] and not h[3] then
  fail('REDLIMIT_NOT_INITIALIZED', 'smooth limiter ' .. key .. ' is not initialized: create it first')
end
local function badConfig(why)
  fail('REDLIMIT_INVALID_CONFIG', 'smooth limiter ' .. key .. ': ' .. why .. '; delete the key or set the configuration again')
end
local parts = {}
if h[1] then
  for piece in string.gmatch(h[1], '[^:]+') do parts[#parts + 1] = parseUnsigned(piece, 100000000000000) or -1 end
end
if #parts ~= 6 then badConfig('field cfg is not "P:T:B:W:CN:CD"') end
for i = 1, 6 do if parts[i] < 0 then badConfig('field cfg is not "P:T:B:W:CN:CD"') end end
local c, why = derive(parts[1], parts[2], parts[3], parts[4], parts[5], parts[6])
if not c then badConfig('field cfg: ' .. why) end
local stored = parseUnsigned(h[2], c.maxK)
if not stored then badConfig('field s is not an integer in 0..' .. int(c.maxK)) end
local nextFree = parseUnsigned(h[3], MAX_TIME)
if not nextFree then badConfig('field n is not an epoch time in µs') end
local refused = h[4] == '1'
if h[4] ~= '1' and h[4] ~= '0' then badConfig('field r is not 0 or 1') end
if permits * c.K >= LIMIT then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits ' .. int(permits) .. ' is too many to count exactly at this rate ' ..
    '(permits x ' .. int(c.K) .. ' must stay below 2^53)')
end

local now = currentMicros(nil)

-- Guava's tryAcquire: refuse, reserving nothing, unless the previous debt fits in the timeout.
if op == 'try' and nextFree - timeout > now then
  if not refused then redis.call('HSET', key, 'r', '1') end
  return {0, nextFree - timeout - now, now, nextFree, stored, c.K}
end

-- resync: permits earned while idle (now > nextFree), exactly.
local function earned(idle, cap)  -- min(idle * earn, cap) without overflowing
  if idle >= math.ceil(cap / c.earn) then return cap end
  return idle * c.earn
end
if now > nextFree then
  local idle = now - nextFree
  if refused and c.W > 0 then
    local e = earned(idle, c.maxK + c.retryK)
    local retry = math.min(e, c.retryK)
    if stored < c.thrK then stored = math.min(c.thrK, stored + retry) end
    if e > retry then stored = math.min(c.maxK, stored + (e - retry)) end
  else
    stored = math.min(c.maxK, stored + earned(idle, c.maxK))
  end
  nextFree = now
end

-- reserve: the caller waits until the current nextFree; the permits push it on.
local moment = nextFree
local wanted = permits * c.K
local spend = math.min(wanted, stored)
local cost = 0
if c.W > 0 and spend > 0 then
  local rest = spend
  local above = stored - c.thrK
  if above > 0 then
    local a = math.min(above, rest)
    cost = mulDiv(a, c.B8 + (2 * above - a) * (c.CN - c.CD), c.D)
    rest = rest - a
  end
  if rest > 0 then cost = cost + math.floor(rest / (c.P * c.m)) end
end
local fresh = wanted - spend
if fresh > 0 then cost = cost + math.ceil(fresh / (c.P * c.m)) end
nextFree = math.min(nextFree + cost, MAX_TIME)
stored = stored - spend
redis.call('HSET', key, 's', int(stored), 'n', int(nextFree), 'r', '0')
return {1, math.max(moment - now, 0), now, nextFree, stored, c.K}
