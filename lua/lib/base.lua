-- lib/base.lua: what every script that includes a library needs: the error reply, integer
-- arguments as Lua's tonumber reads them, and the time of the call. Included by the scripts of
-- Redisson's layout (with lib/redisson.lua) and by the one-key scripts (with lib/onekey.lua).
--
-- Redis 5.0 and later replicate a script's effects, not the script, so a script may read TIME
-- and then write (redlimit needs 5.0+; earlier versions would need redis.replicate_commands()).

-- Raises an error reply "CODE message"; the client maps the code to an exception type.
local function fail(code, message)
  error({err = code .. ' ' .. message})
end

-- The integer Lua's tonumber reads in `s` ("10", " 10", "1e1" and "0x0a" are all 10), if it is one
-- with |n| < 10^14 (every sum of such numbers stays exact in a double), or nil: what Redisson's
-- scripts read with tonumber too. A value's first write in a call is SET, or (acquire.lua's fast
-- path) a DECRBY whose refusal leaves nothing written, so a value read this way cannot make a later
-- command of the same call fail; what redlimit writes is always the plain decimal form.
local function parseInteger(s)
  local n = tonumber(s)
  if n and n < 1e14 and n > -1e14 and n % 1 == 0 then return n end
  return nil
end

-- As parseInteger, and >= 0.
local function parseCount(s)
  local n = parseInteger(s)
  if n == nil or n < 0 then return nil end
  return n
end

-- Now in epoch microseconds: the server's clock, or the client's when the caller passed one.
local function currentMicros(arg)
  if arg == nil or arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local n = tonumber(arg)
  if n == nil or n ~= math.floor(n) or n < 0 or n > 9e15 then
    fail('REDLIMIT_INVALID_ARGUMENT', 'time must be epoch microseconds')
  end
  return n
end
