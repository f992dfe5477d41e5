-- batch.lua: up to 64 independent `take` decisions of one-key limiters (token bucket 'T', GCRA
-- 'G', fixed window 'W', any mix) in one call. Each decision is exactly what its own script's
-- `take` would answer (gcra.lua, fixed_window.lua), made by the same library code
-- (lua/lib/gcra_core.lua, lua/lib/fixed_window_core.lua), one after the other in order: a
-- decision on a key sees what the decisions before it in the batch wrote (a key may appear
-- several times). Unlike multi.lua, nothing is all or nothing: each decision takes or denies on
-- its own, and one that fails does not stop the others.
--
-- KEYS[i] the key of decision i. ARGV[1] the operation ('take', the only one), ARGV[2] now in
-- epoch µs or '' (the server's TIME, read once: every decision of a batch decides at the same
-- instant), ARGV[3] n, the number of decisions (1..64, = #KEYS), then 4 per decision i at
-- ARGV[4 + 4(i-1)] .. ARGV[7 + 4(i-1)]:
--   kind       'T', 'G' or 'W'
--   permits    as `take n` of its script
--   maxWaitUs  as `take n maxWaitUs` of its script
--   cfg        '' = the configuration stored in the key; otherwise the caller's configuration
--              packed as the key's header, exactly as gcra.lua / fixed_window.lua take it at their
--              ARGV[6] (17 bytes for 'T' and 'G', 13 for 'W')
-- A call with another operation, an n out of 1..64, #KEYS ~= n, #ARGV ~= 3 + 4n or a bad time
-- fails as a whole with REDLIMIT_INVALID_ARGUMENT before anything is read or written.
--
-- Reply: an array of n elements, in KEYS order. Element i is what the script of decision i
-- replies to `take`: the 65-byte packed decision of lib/onekey.lua (packDecision: its first byte,
-- 0xA0 or 0xA1, is not ASCII); or, when decision i fails (bad permits or maxWait, an unknown
-- kind, a key holding another Redis type, another limiter or a value redlimit did not write,
-- permits above the limit, a configuration in the call that is not usable), a string with the
-- error that script would raise, "CODE message" (e.g. "REDLIMIT_INVALID_ARGUMENT permits must
-- be ..."), naming the decision's key: text that starts with an ASCII code, so a client tells the
-- two apart by the first byte and the size. A failing decision writes nothing (the libraries check
-- everything before their one write) and the decisions after it go on.
--
-- The fast path: each decision is first offered to the fast path of its own script (lib/gcra_fast.lua,
-- lib/fixed_window_fast.lua: the same code that gcra.lua and fixed_window.lua run for their own
-- take), which decides a key that holds a usable limiter of the decision's kind with locals only;
-- only a decision it cannot decide (a missing key without a configuration in the call, a key of
-- another kind or Redis type, a configuration or state out of bounds, a bad argument) takes the
-- libraries' full, checked path, which answers exactly as the single script's full path does. What
-- a batch saves is the call's fixed cost (parsing, EVALSHA lookup, TIME, the reply) and, for the
-- Redis calls, what can be shared: every key is read with one MGET (a key MGET answers nil for is
-- read again on its own, to tell a missing key from one of another type), and a key that several
-- decisions take is written once, with what the last of them wrote and its PX, when the batch ends
-- (or before a later decision on the key takes the full path, which reads Redis). Its TTL is
-- therefore the one the decisions one by one leave. A write that Redis refuses (maxmemory, a
-- read-only replica: it refuses the first write of a script and then every one) fails, with Redis's
-- error, every decision on that key whose answer rested on it, as one by one their own writes
-- would. A key holding another Redis type goes to the full path, which reports it as
-- REDLIMIT_INVALID_CONFIG naming the key (readPacked), where the single scripts let Redis's
-- WRONGTYPE error through for the client to map (the same ScriptError, InvalidConfig).

-- Not a take of the script's own (the fast libraries decide nothing at the include line); the
-- libraries' full path, for the kinds the batch holds (each helper is a closure made anew on every
-- call).
local gcraFastCall, windowFastCall = false, false
local makesGcra, makesWindow = false, false
for at = 4, #ARGV, 4 do
  local kind = ARGV[at]
  if kind == 'W' then makesWindow = true elseif kind == 'T' or kind == 'G' then makesGcra = true end
end
-- include: gcra_fast fixed_window_fast base onekey gcra_core fixed_window_core
local MAX_DECISIONS = 64
local PER_DECISION = 4

if ARGV[1] ~= 'take' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for batch.lua') end
local decisions = ARGV[3] and parseCount(ARGV[3])
if not decisions or decisions < 1 or decisions > MAX_DECISIONS then
  fail('REDLIMIT_INVALID_ARGUMENT', 'a batch decides 1..' .. MAX_DECISIONS .. ' takes, got "' ..
    string.sub(tostring(ARGV[3]), 1, 40) .. '"')
end
if #KEYS ~= decisions then
  fail('REDLIMIT_INVALID_ARGUMENT', 'a batch of ' .. decisions .. ' takes needs ' .. decisions .. ' keys, got ' .. #KEYS)
end
if #ARGV ~= 3 + PER_DECISION * decisions then
  fail('REDLIMIT_INVALID_ARGUMENT', 'a batch of ' .. decisions .. ' takes needs ' .. (3 + PER_DECISION * decisions) ..
    ' arguments, got ' .. #ARGV)
end
local nowUs = currentMicros(ARGV[2])

-- gcra.lua's `take n maxWaitUs [cfg]` on `key` at nowUs.
local function gcraDecision(key, kind, permits, maxWaitArg, cfg)
  local s
  if cfg then s = gcraWithConfig(key, kind, nowUs, cfg) else s = gcraLoad(key, kind, nowUs) end
  local n = countArg(permits, 1, MAX_U32, 'permits', key)
  gcraCheckPermits(s, n)
  local maxWait = countArg(maxWaitArg, 0, 1e14 - 1, 'maxWait', key)
  local allowed, delay, retry, after = gcraTake(s, n, maxWait)
  if allowed == 1 then
    gcraStore(s, after)
  elseif s.stale then
    gcraStore(s, s.d)                      -- clamped, or another configuration (lib/gcra_core.lua)
  end
  local lr, lms = gcraLocalRate(s)
  return packDecision(allowed, gcraRemaining(s, after), retry, gcraResetAfter(s, after), s.b, nowUs, delay, lr, lms)
end

-- fixed_window.lua's `take n maxWaitUs [cfg]` on `key` at nowUs.
local function windowDecision(key, permits, maxWaitArg, cfg)
  local s
  if cfg then s = windowWithConfig(key, nowUs, cfg) else s = windowLoad(key, nowUs) end
  local n = countArg(permits, 1, MAX_U32, 'permits', key)
  windowCheckPermits(s, n)
  local maxWait = countArg(maxWaitArg, 0, 1e14 - 1, 'maxWait', key)
  local allowed, delay, retry, c, nextCount = windowTake(s, n, maxWait)
  if allowed == 1 or s.stale then          -- a stale window is written back, also on a denial
    windowStore(s, c, nextCount)
  end
  return packDecision(allowed, s.l - c, retry, windowResetAfter(s, c, nextCount), s.l, nowUs, delay, s.l, s.windowMs)
end

-- The full path of decision i (its own script's, past its fast path).
local function decide(key, kind, permits, maxWaitArg, cfg)
  if kind == 'W' then return windowDecision(key, permits, maxWaitArg, cfg) end
  if kind == 'T' or kind == 'G' then return gcraDecision(key, kind, permits, maxWaitArg, cfg) end
  fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind "' .. string.sub(tostring(kind), 1, 8) ..
    '" for key ' .. key .. ' (T, G or W)')
end

-- An error raised by a decision or a write, as its element of the reply.
local function errorText(e)
  if type(e) == 'table' and type(e.err) == 'string' then return e.err end  -- fail()'s, or a Redis error
  return tostring(e)
end

-- Each key as the decisions so far have left it. The batch reads every key with one MGET, which
-- answers nil for a missing key and for one of another Redis type alike: such a key is read again
-- on its own (redis.pcall: false, or the WRONGTYPE error table). What the fast path decides to
-- write is kept as the key's value (held) and written once, with the PX of its last decision, when
-- the batch ends or before a decision on the key takes the full path (which reads Redis).
local read = redis.call('MGET', unpack(KEYS))
local held = {}        -- key -> its value as the batch left it (false: missing)
local unread = {}      -- key -> true: the full path decided it since; read it again
local firstHeld = {}   -- key -> the first decision whose write is held and not yet sent
local heldPx = {}      -- key -> PX of the write held (0: none)
local reply = {}

-- Sends the write held for `key`, if any, by the decisions from firstHeld[key] to upTo. A write
-- that fails fails those of them that were decided on `key` (they answered from a state that was
-- not stored) with its error.
local function writeHeld(key, upTo)
  local from = firstHeld[key]
  if not from then return end
  firstHeld[key] = nil
  local ok
  if heldPx[key] > 0 then
    ok = redis.pcall('SET', key, held[key], 'PX', heldPx[key])
  else
    ok = redis.pcall('SET', key, held[key])
  end
  if type(ok) == 'table' and ok.err then
    for j = from, upTo do
      if KEYS[j] == key then reply[j] = ok.err end
    end
    held[key], unread[key] = nil, true
  end
end

for i = 1, decisions do
  local key, at = KEYS[i], 4 + PER_DECISION * (i - 1)
  local kind, permits, maxWait, cfg = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  if cfg == '' then cfg = nil end
  local v = held[key]
  if v == nil then
    if unread[key] then v = nil else v = read[i] end
    if not v then v = redis.pcall('GET', key) end
    unread[key] = nil
    held[key] = v
  end
  local r, packed, px
  if kind == 'T' or kind == 'G' then
    r, packed, px = gcraFastTake(v, kind, permits, maxWait, nowUs, cfg)
  elseif kind == 'W' then
    r, packed, px = windowFastTake(v, permits, maxWait, nowUs, cfg)
  end
  if r then
    if packed then
      held[key], heldPx[key] = packed, px
      if not firstHeld[key] then firstHeld[key] = i end
    end
  else
    writeHeld(key, i - 1)
    local ok, e = pcall(decide, key, kind, permits, maxWait, cfg)
    if ok then r = e else r = errorText(e) end
    held[key], unread[key] = nil, true
  end
  reply[i] = r
end
for key in pairs(firstHeld) do writeHeld(key, decisions) end
return reply
