-- lib/onekey.lua: helpers of the one-key limiters (gcra.lua, fixed_window.lua, multi.lua), which
-- keep configuration and state together in ONE string key, the limiter's name: 28 bytes packed
-- with struct.pack (little-endian), the first byte saying which limiter it is. A hash with the
-- same fields costs 112 bytes or more in Redis (listpack with 6-7 entries); the packed string is
-- one 48-byte allocation, 88 bytes in all (MEMORY USAGE) for a name of up to 14 bytes. Every
-- script of the family takes ARGV[1] the operation, ARGV[2] now in epoch µs ('' = the server's
-- TIME; only tests pass a time), ARGV[3] the kind byte(s) the caller expects.
--
-- Arithmetic: Lua numbers are doubles, exact for integers below 2^53. Every value these scripts
-- compute is an integer below 2^53 (the bounds are stated where the values are made, and the
-- client refuses configurations that would break them); quotients go through floorDiv, which is
-- exact where a/b rounded could be off by one.

local MAX_U32 = 4294967295
local TWO50 = 1125899906842624   -- 2^50
local TWO52 = 4503599627370496   -- 2^52
local PACKED_SIZE = 28

-- The reply of `take` and `peek` (gcra.lua, fixed_window.lua, each decision of batch.lua): ONE
-- string of 65 bytes, little-endian. Byte 0 is 0xA0 + allowed (0xA0 denied, 0xA1 granted): not
-- ASCII, so batch.lua's error elements ("CODE message" text) never look like one. Then 8 signed
-- 64-bit integers: remaining, retryAfterUs, resetAfterUs, limit, nowUs, delayUs, localRate,
-- localIntervalMs. Ranges: remaining -2^32 < r <= limit (the client shows max(0, r)); limit and
-- localRate 1..2^32-1; localIntervalMs 1..1e12; nowUs 0..9e15; retryAfter, resetAfter, delay
-- 0..2^53. struct.pack's i8 goes through a C long, exact for every integer-valued double below
-- 2^63 in magnitude (checked on Redis 7.0: +-(2^53-1), 2^53 and -1 come back unchanged). One
-- bulk string is what saves the time: a 9-element table is converted and written element by
-- element (returning it costs about 0.4 us more than this string). A tighter layout (unsigned 4-
-- to 7-byte fields, 46 bytes) measured about 0.05 us less, within the noise; not taken: every
-- field here holds any value its script can make, and a negative cannot wrap silently.
local DECISION_LAYOUT = '<Bi8i8i8i8i8i8i8i8'

local function packDecision(allowed, remaining, retryUs, resetUs, limit, nowUs, delayUs, localRate, localMs)
  return struct.pack(DECISION_LAYOUT, 160 + allowed, remaining, retryUs, resetUs, limit, nowUs, delayUs, localRate,
    localMs)
end

-- floor(a / b) and a - b * floor(a / b), exactly, for integers |a| < 2^53 and 0 < b < 2^53.
-- math.fmod is exact on doubles; a - r is then an exact multiple of b, so the division is too.
local function floorDiv(a, b)
  local r = math.fmod(a, b)
  if r < 0 then r = r + b end
  return (a - r) / b, r
end

-- ceil(a / b), exactly (as floorDiv).
local function ceilDiv(a, b)
  local q, r = floorDiv(a, b)
  if r > 0 then q = q + 1 end
  return q
end

local function gcd(a, b)
  while b > 0 do a, b = b, math.fmod(a, b) end
  return a
end

-- A count argument in lo..hi, or fail with REDLIMIT_INVALID_ARGUMENT naming it and `owner` (what
-- the argument is for; default: the limiter KEYS[1]).
local function countArg(s, lo, hi, what, owner)
  owner = owner or KEYS[1]
  local n = parseCount(s)
  if n == nil or n < lo or n > hi then
    fail('REDLIMIT_INVALID_ARGUMENT', what .. ' must be an integer in ' .. lo .. '..' .. hi .. ' for limiter ' ..
      owner .. ', got "' .. string.sub(tostring(s), 1, 40) .. '"')
  end
  return n
end

-- The packed value of `key` (default KEYS[1]), checked to be one of `kind` (a byte); nil if the
-- key does not exist. A key of another type, size or kind fails with REDLIMIT_INVALID_CONFIG
-- naming the key and `label` (what the caller expected): nothing has been written yet.
local function readPacked(kind, label, key)
  key = key or KEYS[1]
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      fail('REDLIMIT_INVALID_CONFIG', 'key ' .. key .. ' holds another Redis type, not a ' .. label ..
        ' (another program wrote it); delete it or use another limiter name')
    end
    error(v)
  end
  if not v then return nil end
  if #v ~= PACKED_SIZE or string.sub(v, 1, 1) ~= kind then
    local what = 'a value redlimit did not write'
    local k = string.sub(v, 1, 1)
    if #v == PACKED_SIZE and k == 'T' then what = 'a token bucket limiter'
    elseif #v == PACKED_SIZE and k == 'G' then what = 'a GCRA limiter'
    elseif #v == PACKED_SIZE and k == 'W' then what = 'a fixed window limiter'
    elseif #v == PACKED_SIZE and k == 'S' then what = 'a smooth limiter'
    elseif #v == PACKED_SIZE and k == 'V' then what = 'a sliding window counter'
    elseif #v == PACKED_SIZE and k == 'Q' then what = 'a calendar quota' end
    fail('REDLIMIT_INVALID_CONFIG', 'key ' .. key .. ' holds ' .. what .. ', not a ' .. label ..
      '; delete it (deleteKey) or use another limiter name')
  end
  return v
end

-- Fails with REDLIMIT_NOT_INITIALIZED: the limiter `key` (default KEYS[1]) has no configuration.
local function notInitialized(label, key)
  key = key or KEYS[1]
  fail('REDLIMIT_NOT_INITIALIZED', label .. ' ' .. key ..
    ' is not initialized: store its configuration first (Limiter::trySetPolicy or setPolicy)')
end

-- Writes the packed value to `key` (default KEYS[1]); keepAlive > 0 (ms) gives the key a TTL of the time until the limiter is
-- full again (resetUs, rounded up to ms) plus keepAlive, so an idle limiter vanishes keepAlive
-- after it is full, and never while it still holds state. keepAlive = 0: no TTL (SET clears one).
local function writePacked(value, resetUs, keepAlive, key)
  key = key or KEYS[1]
  if keepAlive > 0 then
    redis.call('SET', key, value, 'PX', ceilDiv(resetUs, 1000) + keepAlive)
  else
    redis.call('SET', key, value)
  end
end
