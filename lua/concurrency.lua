-- concurrency.lua: ConcurrencyLimiter (kind 'C'): at most `limit` leases held at once, each with a
-- TTL, so that a crashed holder's lease frees itself. One key, the limiter's name: a sorted set
-- whose members are lease ids (32 lowercase hex digits, made by the client) and whose scores are
-- the leases' expiries in epoch µs on the server's clock (integers: exact in a double below 2^53).
-- A lease is live while now < expiry. The limit is not stored: every acquire sends it.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '' for the server's TIME, ARGV[3] the kind):
--   acquire id limit ttlMs  grants lease `id` until now + ttl if fewer than `limit` are live. A
--                           live lease `id` already there (the same call sent twice) is granted
--                           again as it is: an acquire never takes two places.
--                           Reply {granted, expiryUs, remaining, limit, nowUs, retryAfterUs,
--                           resetAfterUs, held}: retryAfter (denied) until the soonest live lease
--                           expires (it may be released sooner), resetAfter until the last one does.
--   renew id ttlMs          a live lease's expiry becomes now + ttl. Reply {renewed, expiryUs, nowUs}.
--   release id              removes lease `id`. Reply {released (1 if it was live), nowUs}.
--   held                    live leases. Reply {held, nowUs}. Writes nothing.
--
-- Bounded work: a call reads at most RECLAIM expired leases (the lowest ranks) and removes them,
-- plus O(log n) reads (ZSCORE, ZCOUNT, the two latest and the soonest live lease): never a scan
-- of every lease. Expired leases left over are not live (ZCOUNT counts only live ones); the next
-- calls reclaim them. The key's TTL is kept at the latest live expiry (rounded up to ms), so it
-- vanishes once no lease can be live; a call that leaves no live lease deletes it (UNLINK: a big
-- set is freed off the main thread).
--
-- Every member and score a call reads is checked before its first write (a member that is not a
-- lease id, a score that is not an integer expiry in 0..9e15 or lies further ahead than two
-- longest TTLs: REDLIMIT_INVALID_STATE; a key of another type: REDLIMIT_INVALID_CONFIG), so a
-- call that fails has written nothing.
--
-- Self-contained: the whole script sits above its `-- @shared` line (the last), so common.lua's
-- helpers, which it does not use, are never made (each `local function` there is a closure made
-- on every call). Measured with 20 000 pipelined EVALSHA (acquire then release, 10 other leases
-- held, on a loaded 2-core machine): 12.4 µs per call self-contained, 17.3 µs with common.lua and
-- lib/onekey.lua in front; gcra.lua's take: 5.2 µs in the same run.

local RECLAIM = 100                       -- expired leases removed per call, at most
local MAX_U32 = 4294967295
local MAX_TTL_US = MAX_U32 * 1000         -- the longest lease TTL, µs (49.7 days)
local key, op = KEYS[1], ARGV[1]

-- Raises an error reply "CODE message"; the client maps the code to an exception type.
local function fail(code, message)
  error({err = code .. ' ' .. message})
end

-- A count argument in lo..hi (an integer that tonumber reads), or REDLIMIT_INVALID_ARGUMENT.
local function countArg(s, lo, hi, what)
  local n = tonumber(s)
  if n == nil or n % 1 ~= 0 or n < lo or n > hi then
    fail('REDLIMIT_INVALID_ARGUMENT', what .. ' must be an integer in ' .. lo .. '..' .. hi .. ' for limiter ' ..
      key .. ', got "' .. string.sub(tostring(s), 1, 40) .. '"')
  end
  return n
end

-- ceil(a / b) for integers 0 <= a < 2^53, b >= 1: exact in doubles (see gcra.lua).
local function ceilDiv(a, b)
  return -math.floor(-a / b)
end

if ARGV[3] ~= 'C' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for concurrency.lua') end
local nowUs
if ARGV[2] == '' then
  local t = redis.call('TIME')
  nowUs = t[1] * 1000000 + t[2]
else
  nowUs = countArg(ARGV[2], 0, 9e15, 'time (epoch µs)')
end
local nowArg = string.format('%d', nowUs)

-- The first read of a call failed (`r` is its error reply): a key of another type, or an error to pass on.
local function wrongType(r)
  if string.find(r.err, 'WRONGTYPE', 1, true) then
    fail('REDLIMIT_INVALID_CONFIG', 'key ' .. key .. ' holds another Redis type, not a ConcurrencyLimiter ' ..
      '(another program wrote it); delete it or use another limiter name')
  end
  error(r)
end

local function corrupt(what)
  fail('REDLIMIT_INVALID_STATE', 'sorted set ' .. key .. ' of ConcurrencyLimiter ' .. key .. ' holds ' .. what ..
    ' (another program wrote it); delete it (deleteLimiter) or use another limiter name')
end

local function checkId(m)
  if #m ~= 32 or not string.find(m, '^[0-9a-f]+$') then corrupt('a member that is not a lease id') end
end

local function expiryOf(score)
  local e = tonumber(score)
  if e == nil or e % 1 ~= 0 or e < 0 or e > 9e15 or e > nowUs + 2 * MAX_TTL_US then
    corrupt('a score that is not a lease expiry in epoch microseconds')
  end
  return e
end

-- A lease id argument: 32 lowercase hex digits.
local function idArg(s)
  if type(s) ~= 'string' or #s ~= 32 or not string.find(s, '^[0-9a-f]+$') then
    fail('REDLIMIT_INVALID_ARGUMENT', 'lease id must be 32 lowercase hex digits for limiter ' .. key)
  end
  return s
end

-- Reads (and checks) what every writing call needs: the expired batch to reclaim, the lease `id`'s
-- expiry (nil if absent), the two latest leases {id, expiry, id, expiry}.
local function load(id)
  local expired = redis.pcall('ZRANGEBYSCORE', key, '-inf', nowArg, 'WITHSCORES', 'LIMIT', 0, RECLAIM)
  if expired.err then wrongType(expired) end
  for i = 1, #expired, 2 do
    checkId(expired[i])
    expiryOf(expired[i + 1])
  end
  local own = redis.call('ZSCORE', key, id)
  if own then own = expiryOf(own) end
  local top = redis.call('ZREVRANGE', key, 0, 1, 'WITHSCORES')
  for i = 1, #top, 2 do
    checkId(top[i])
    top[i + 1] = expiryOf(top[i + 1])
  end
  return #expired / 2, own, top
end

-- The latest expiry among `top` (ZREVRANGE 0 1) other than lease `except`; 0 if none.
local function latestBut(top, except)
  for i = 1, #top, 2 do
    if top[i] ~= except then return top[i + 1] end
  end
  return 0
end

-- Live leases: expiry > now.
local function liveCount()
  return redis.call('ZCOUNT', key, '(' .. nowArg, '+inf')
end

-- The writes a call that adds nothing ends with: reclaim `n` expired leases (first: they are the
-- lowest ranks), remove lease `remove` (nil: none), then keep the key's TTL at the latest live
-- expiry `latest`, or delete the key when no lease is live.
local function finish(n, latest, remove)
  if latest <= nowUs then
    redis.call('UNLINK', key)
    return
  end
  if n > 0 then redis.call('ZREMRANGEBYRANK', key, 0, n - 1) end
  if remove then redis.call('ZREM', key, remove) end
  redis.call('PEXPIRE', key, string.format('%d', ceilDiv(latest - nowUs, 1000)))
end

if op == 'acquire' then
  local id = idArg(ARGV[4])
  local limit = countArg(ARGV[5], 1, MAX_U32, 'limit')
  local ttl = countArg(ARGV[6], 1, MAX_U32, 'lease TTL (ms)')
  local n, own, top = load(id)
  local held = liveCount()
  local latest = latestBut(top, nil)
  local granted, expiry, retry = 0, 0, 0
  if own and own > nowUs then
    granted, expiry = 1, own               -- sent twice: the lease the first call granted
  elseif held < limit then
    granted, expiry, held = 1, nowUs + ttl * 1000, held + 1
    if expiry > latest then latest = expiry end
  else
    local soonest = redis.call('ZRANGEBYSCORE', key, '(' .. nowArg, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    checkId(soonest[1])
    retry = expiryOf(soonest[2]) - nowUs
  end
  if granted == 1 and expiry ~= own then
    if n > 0 then redis.call('ZREMRANGEBYRANK', key, 0, n - 1) end
    redis.call('ZADD', key, string.format('%d', expiry), id)
    redis.call('PEXPIRE', key, string.format('%d', ceilDiv(latest - nowUs, 1000)))
  elseif n > 0 then
    finish(n, latest)
  end
  local remaining = limit - held
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if latest > nowUs then reset = latest - nowUs end
  return {granted, expiry, remaining, limit, nowUs, retry, reset, held}
end

if op == 'renew' then
  local id = idArg(ARGV[4])
  local ttl = countArg(ARGV[5], 1, MAX_U32, 'lease TTL (ms)')
  local n, own, top = load(id)
  local latest = latestBut(top, id)
  if own and own > nowUs then
    local expiry = nowUs + ttl * 1000
    if expiry > latest then latest = expiry end
    if n > 0 then redis.call('ZREMRANGEBYRANK', key, 0, n - 1) end
    redis.call('ZADD', key, 'XX', string.format('%d', expiry), id)
    redis.call('PEXPIRE', key, string.format('%d', ceilDiv(latest - nowUs, 1000)))
    return {1, expiry, nowUs}
  end
  if own or n > 0 then finish(n, latest, own and id) end  -- an expired lease is gone for good
  return {0, 0, nowUs}
end

if op == 'release' then
  local id = idArg(ARGV[4])
  local n, own, top = load(id)
  local latest = latestBut(top, id)
  if own or n > 0 then finish(n, latest, own and id) end
  if own and own > nowUs then return {1, nowUs} end
  return {0, nowUs}
end

if op == 'held' then
  local live = redis.pcall('ZCOUNT', key, '(' .. nowArg, '+inf')
  if type(live) == 'table' then wrongType(live) end
  return {live, nowUs}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for concurrency.lua')
-- @shared
