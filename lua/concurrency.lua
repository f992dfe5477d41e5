-- concurrency.lua: a Limiter's concurrency policy (kind 'C'): at most `limit` leases held at once, each with a
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
--                           resetAfterUs, held}: retryAfter (denied) until fewer than `limit` are
--                           live if none is released (the soonest live lease's expiry when `limit`
--                           are held), resetAfter until the last one expires.
--   renew id ttlMs          a live lease's expiry becomes now + ttl. Reply {renewed, expiryUs, nowUs}.
--   release id              removes lease `id`. Reply {released (1 if it was live), nowUs}.
--   held                    live leases. Reply {held, nowUs}. Writes nothing.
--
-- The lease set (its layout, bounded work, checks) is lib/concurrency_core.lua's, which a MultiLimit
-- (multi.lua) shares: every member and score a call reads is checked before its first write, so a
-- call that fails has written nothing.
--
-- Self-contained: it includes lib/concurrency_core.lua alone, which uses nothing of lib/base.lua,
-- so no helper it does not use is made (each `local function` of a library is a closure made on
-- every call). Measured with 20 000 pipelined EVALSHA (acquire then release, 10 other leases held,
-- on a loaded 2-core machine): 12.4 µs per call self-contained, 17.3 µs with lib/base.lua's and
-- lib/redisson.lua's helpers and lib/onekey.lua in front; gcra.lua's take: 5.2 µs in the same run.
-- Sharing lib/concurrency_core.lua with multi.lua cost about 0.5 µs on a denial (12.3 against
-- 11.7 µs, 10 leases held, 100 000 acquires by redis-benchmark -P 16, INFO commandstats) and
-- nothing measurable on a grant (18.2 against 18.1 µs, leases of 2 ms piling up and being
-- reclaimed).

-- The libraries' helpers this call makes (each is a closure made anew on every call).
local makesLeases = true
-- include: concurrency_core
local MAX_U32 = 4294967295
local key, op = KEYS[1], ARGV[1]

-- A count argument in lo..hi (an integer that tonumber reads), or REDLIMIT_INVALID_ARGUMENT.
local function countArg(s, lo, hi, what)
  local n = tonumber(s)
  if n == nil or n % 1 ~= 0 or n < lo or n > hi then
    leaseFail('REDLIMIT_INVALID_ARGUMENT', what .. ' must be an integer in ' .. lo .. '..' .. hi .. ' for limiter ' ..
      key .. ', got "' .. string.sub(tostring(s), 1, 40) .. '"')
  end
  return n
end

if ARGV[3] ~= 'C' then leaseFail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for concurrency.lua') end
local nowUs
if ARGV[2] == '' then
  local t = redis.call('TIME')
  nowUs = t[1] * 1000000 + t[2]
else
  nowUs = countArg(ARGV[2], 0, 9e15, 'time (epoch µs)')
end

if op == 'acquire' then
  local id = leaseIdArg(ARGV[4], key)
  local limit = countArg(ARGV[5], 1, MAX_U32, 'limit')
  local ttl = countArg(ARGV[6], 1, MAX_U32, 'lease TTL (ms)')
  local s = leaseLoad(key, nowUs, id)
  local held = leaseHeld(s)
  local latest = leaseLatestBut(s, nil)
  local granted, expiry, retry = 0, 0, 0
  if leaseLive(s) then
    granted, expiry = 1, s.own             -- sent twice: the lease the first call granted
  elseif held < limit then
    granted, expiry, held = 1, nowUs + ttl * 1000, held + 1
    if expiry > latest then latest = expiry end
  else
    retry = leaseWait(s, held, limit)
  end
  if granted == 1 and expiry ~= s.own then
    leasePut(s, id, expiry, latest)
  else
    leaseFinish(s, latest)
  end
  local remaining = limit - held
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if latest > nowUs then reset = latest - nowUs end
  return {granted, expiry, remaining, limit, nowUs, retry, reset, held}
end

if op == 'renew' then
  local id = leaseIdArg(ARGV[4], key)
  local ttl = countArg(ARGV[5], 1, MAX_U32, 'lease TTL (ms)')
  local s = leaseLoad(key, nowUs, id)
  local latest = leaseLatestBut(s, id)
  if leaseLive(s) then
    local expiry = nowUs + ttl * 1000
    if expiry > latest then latest = expiry end
    leasePut(s, id, expiry, latest, 'XX')
    return {1, expiry, nowUs}
  end
  leaseFinish(s, latest, s.own and id)     -- an expired lease is gone for good
  return {0, 0, nowUs}
end

if op == 'release' then
  local id = leaseIdArg(ARGV[4], key)
  local s = leaseLoad(key, nowUs, id)
  leaseFinish(s, leaseLatestBut(s, id), s.own and id)
  if leaseLive(s) then return {1, nowUs} end
  return {0, nowUs}
end

if op == 'held' then
  local live = redis.pcall('ZCOUNT', key, '(' .. string.format('%d', nowUs), '+inf')
  if type(live) == 'table' then leaseWrongType(key, live) end
  return {live, nowUs}
end

leaseFail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for concurrency.lua')
