-- lib/redisson.lua: the helpers of the scripts on Redisson's data layout (acquire.lua,
-- acquire_batch.lua, available_permits.lua, release.lua, set_rate.lua; ttl.lua needs none of them).
-- Uses lib/base.lua, included before it.
--
-- Every script of RateLimiter gets the same five keys, in Redisson's order (one hash slot when the name
-- has no '{'; see README "Compatibility with Redisson"):
--   KEYS[1] config hash      N
--   KEYS[2] value            {N}:value
--   KEYS[3] client value     {N}:value:<clientId>
--   KEYS[4] permits          {N}:permits
--   KEYS[5] client permits   {N}:permits:<clientId>
-- acquire.lua gets a sixth: {N}:grant:<hex id>, the record of a partial grant (see there).
-- Data layout (Redisson 3.38+): hash fields rate, interval (ms), type (0 OVERALL, 1 PER_CLIENT),
-- keepAliveTime (ms, 0 or absent = none); value = permits left (decimal); permits = sorted set,
-- score = grant time in epoch ms, member = 0x10 + 16 random bytes + permits as little-endian
-- uint32 (older Redisson: 0x08 + 8 bytes; the length byte says which). redlimit stamps with
-- microsecond precision: the score is fractional epoch ms ("1700000000000.123"), which Redisson's
-- numeric range queries read like any other score.
--
-- Invariant: value + (permits of every member still in the log) == rate. A member that has
-- expired (score <= now - interval) but is not yet reclaimed still counts as in use, so the
-- invariant implies value + live permits <= rate: at most `rate` permits are granted in any
-- window. Every script keeps it, and repairs it when another writer broke it (see loadState).
--
-- Bounded work: no call reads, unpacks or removes more than BATCH members. Expired members are
-- reclaimed BATCH at a time (until then they count as in use: the limiter can only under-admit);
-- a log that has expired completely is dropped with one UNLINK (freed off the main thread).
--
-- Every script reads and checks everything it uses (key types, the value as an integer,
-- members as packed entries) before its first write, so a failing script has written nothing.

local MAX_RATE = 4294967295          -- permits are stored as uint32 in a member
local MAX_INTERVAL = 1000000000000   -- ms (about 31 years); keeps every sum exact and printable
local BATCH = 1000                   -- members read, unpacked or removed per call, at most
-- The value stored while the permits in use are unknown (a rebuild or repair over more than
-- BATCH members): far below any real value, so every client (Redisson too) denies until the
-- whole log has expired and the value is reset to the rate. Any value below FROZEN_BELOW is frozen.
local FROZEN = -10000000000000
local FROZEN_BELOW = -1000000000000

-- Runs a read command on `key` with redis.pcall; a key of the wrong type fails with `code` and a
-- message naming the key and what it should hold.
local function readKey(code, key, what, command, ...)
  local r = redis.pcall(command, key, ...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      fail(code, 'key ' .. key .. ' of limiter ' .. KEYS[1] .. ' is not ' .. what ..
        ' (another program wrote it); delete it or use another limiter name')
    end
    error(r)
  end
  return r
end

-- A configuration, with the state keys of its mode: the shared pair for OVERALL ('0'), this
-- client's pair for PER_CLIENT ('1').
local function makeConfig(rate, interval, rtype, keepAlive)
  local cfg = {rate = rate, interval = interval, type = rtype, keepAlive = keepAlive,
               valueKey = KEYS[2], permitsKey = KEYS[4]}
  if rtype == '1' then
    cfg.valueKey, cfg.permitsKey = KEYS[3], KEYS[5]
  end
  return cfg
end

-- Reads and checks the configuration hash. Fails with REDLIMIT_NOT_INITIALIZED if it does not
-- exist, REDLIMIT_INVALID_CONFIG if it is not a hash or a field is missing or unusable.
local function readConfig()
  local f = readKey('REDLIMIT_INVALID_CONFIG', KEYS[1], 'a hash', 'HMGET', 'rate', 'interval', 'type', 'keepAliveTime')
  if not f[1] and not f[2] and not f[3] then
    fail('REDLIMIT_NOT_INITIALIZED', 'RateLimiter ' .. KEYS[1] ..
      ' is not initialized: call trySetRate() or setRate() first (as Redisson\'s RRateLimiter)')
  end
  local rate, interval, keepAlive = parseCount(f[1]), parseCount(f[2]), 0
  if f[4] then keepAlive = parseCount(f[4]) end
  local bad = nil
  if not rate or rate < 1 or rate > MAX_RATE then
    bad = 'field rate is not an integer in 1..' .. MAX_RATE
  elseif not interval or interval < 1 or interval > MAX_INTERVAL then
    bad = 'field interval is not an integer number of ms in 1..' .. MAX_INTERVAL
  elseif f[3] ~= '0' and f[3] ~= '1' then
    bad = 'field type is not 0 (OVERALL) or 1 (PER_CLIENT)'
  elseif not keepAlive or keepAlive > MAX_INTERVAL then
    bad = 'field keepAliveTime is not an integer number of ms'
  end
  if bad then
    fail('REDLIMIT_INVALID_CONFIG', 'configuration of limiter ' .. KEYS[1] .. ': ' .. bad ..
      '; fix it with setRate()')
  end
  return makeConfig(rate, interval, f[3], keepAlive)
end

-- The score for a time in epoch µs: epoch ms with three decimals ("1700000000000.123"). Redis
-- parses it to the nearest double, within 0.25 µs, and every client compares the same doubles.
local function scoreOf(us)
  local ms = math.floor(us / 1000)
  return string.format('%d.%03d', ms, us - ms * 1000)
end

-- A score read from Redis, in epoch µs.
local function scoreMicros(score)
  return math.floor(tonumber(score) * 1000 + 0.5)
end

local function packMember(id, permits)
  return struct.pack('<Bc0I4', #id, id, permits)
end

-- The permits of a member of `key`, after checking that it is a packed entry: a length byte n,
-- n id bytes, four bytes of little-endian permits (n = 16, or 8 from old Redisson versions).
local function permitsOf(key, member)
  local n = #member
  if n < 5 or member:byte(1) ~= n - 5 then
    fail('REDLIMIT_INVALID_STATE', 'sorted set ' .. key .. ' of limiter ' .. KEYS[1] ..
      ' holds a member that is not a permit entry (length byte, id, 4-byte permits); delete the key')
  end
  local a, b, c, d = member:byte(n - 3, n)
  return a + b * 256 + c * 65536 + d * 16777216
end

-- Sum of the permits of `members` (a reply of ZRANGE without scores), permitsOf's check and
-- arithmetic inline (a recount reads up to BATCH members: no call per member).
local function sumPermits(key, members)
  local sum = 0
  for i = 1, #members do
    local m = members[i]
    local n = #m
    if n < 5 or m:byte(1) ~= n - 5 then permitsOf(key, m) end  -- fails, naming the key
    local a, b, c, d = m:byte(n - 3, n)
    sum = sum + a + b * 256 + c * 65536 + d * 16777216
  end
  return sum
end

-- Reads the state of the limiter at `nowUs` and decides its value. Writes nothing: writeState()
-- stores the outcome. Sets on cfg: edge (the expiry score), raw (the stored value, nil if the key
-- is missing), reclaim (expired members to remove, the lowest ranks), drop (the whole log has
-- expired), frozen, left (members after the reclaim). Returns the value.
--   shift:    added to the stored value first (a keepState rate change: new rate - old rate);
--             false means the stored value cannot be trusted and is rebuilt from the log.
--   exact:    recount the permits in use whenever at most BATCH members are left (release and
--             availablePermits, which are not on the hot path).
--   expected: the rate the caller saw last ('' or nil if unknown); see below.
-- How the value is decided:
--   - the whole log has expired, or nothing is left after the reclaim: value = rate;
--   - otherwise the stored value plus the permits of the expired members reclaimed now;
--   - unless it cannot be trusted: the value key is missing; or value > rate; or value + number
--     of live members > rate (each member holds at least one permit); or the rate changed since
--     the caller last saw it (`expected`) and the value is 0 (Redisson's keepState lowering
--     stores max(0, rate - in use), which is 0 exactly when it should be negative; redlimit's own
--     stores the negative value). Then value =
--     rate - permits of the members left, counted exactly when at most BATCH are left, else
--     FROZEN (nobody is granted anything until the whole log has expired).
-- Another writer can break the invariant: Redisson's release() raises the value without touching
-- the log; its keepState lowering clamps at 0; a value key deleted by hand. The checks catch
-- every excess of single-permit grants, a keepState lowering seen by a caller that knew the old
-- rate, and, with `exact`, every excess in a log of at most BATCH members.
local function loadState(cfg, nowUs, shift, exact, expected)
  local vkey, zkey = cfg.valueKey, cfg.permitsKey
  local raw = readKey('REDLIMIT_INVALID_STATE', vkey, 'a string', 'GET')
  local value = nil
  if raw then
    value = parseInteger(raw)
    if value == nil then
      fail('REDLIMIT_INVALID_STATE', 'key ' .. vkey .. ' of limiter ' .. KEYS[1] .. ' holds "' ..
        string.sub(raw, 1, 40) .. '", not a decimal integer; delete it or call setRate()')
    end
  end
  cfg.raw = value
  cfg.edge = scoreOf(nowUs - cfg.interval * 1000)
  local expired = readKey('REDLIMIT_INVALID_STATE', zkey, 'a sorted set', 'ZRANGEBYSCORE', '-inf', cfg.edge, 'LIMIT', 0, BATCH)
  local j = #expired
  local card = redis.call('ZCARD', zkey)
  cfg.reclaim, cfg.drop, cfg.frozen = j, false, false
  local liveCount = card - j
  if j == BATCH and card > j then
    local newest = redis.call('ZREVRANGE', zkey, 0, 0, 'WITHSCORES')
    if tonumber(newest[2]) <= tonumber(cfg.edge) then
      cfg.drop, cfg.reclaim, card, liveCount = true, 0, 0, 0
    else
      liveCount = redis.call('ZCOUNT', zkey, '(' .. cfg.edge, '+inf')
    end
  end
  cfg.left = card - cfg.reclaim
  if cfg.drop or cfg.left == 0 then
    cfg.left = 0
    return cfg.rate
  end
  local reclaimed = sumPermits(zkey, expired)  -- not needed when the whole log goes
  -- A frozen value is never trusted: once at most BATCH members are left it is recounted.
  if value ~= nil and value >= FROZEN_BELOW and shift ~= false then
    local changed = expected ~= nil and expected ~= '' and tonumber(expected) ~= cfg.rate and value == 0
    value = value + (shift or 0) + reclaimed
    if not changed and value <= cfg.rate and value + liveCount <= cfg.rate and
        (not exact or cfg.left > BATCH) then
      return value
    end
  end
  -- Rebuild: count the permits of the members left (expired ones not reclaimed yet included).
  if cfg.left > BATCH then
    cfg.frozen = true
    return FROZEN
  end
  return cfg.rate - sumPermits(zkey, redis.call('ZRANGE', zkey, cfg.reclaim, -1))
end

-- Stores what loadState() decided, with `value` the value to leave (after this call's own grant
-- or release; FROZEN when loadState froze it). Reclaims expired members (lowest ranks first, or
-- the whole log); writes the value with SET ... KEEPTTL (a key that existed keeps its TTL).
local function writeState(cfg, value)
  if cfg.drop then
    redis.call('UNLINK', cfg.permitsKey)
  elseif cfg.reclaim > 0 then
    redis.call('ZREMRANGEBYRANK', cfg.permitsKey, 0, cfg.reclaim - 1)
  end
  if cfg.raw == nil then
    redis.call('SET', cfg.valueKey, value)
    cfg.rewrote = true
  elseif value ~= cfg.raw then
    redis.call('SET', cfg.valueKey, value, 'KEEPTTL')
  end
end

-- Applies the TTL rules to the state keys: keepAliveTime > 0 refreshes the idle TTL of all keys
-- on every call; otherwise a state key that was just (re)created inherits the hash's TTL (set by
-- expire/expireAt), if it has one. Keys that existed keep theirs: ZADD and ZREM do not
-- touch a TTL, nor does SET ... KEEPTTL, so the steady path needs no PTTL.
local function applyTtl(cfg)
  if cfg.keepAlive > 0 then
    redis.call('PEXPIRE', KEYS[1], cfg.keepAlive)
    redis.call('PEXPIRE', cfg.valueKey, cfg.keepAlive)
    redis.call('PEXPIRE', cfg.permitsKey, cfg.keepAlive)
  elseif cfg.rewrote or cfg.newLog then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
      redis.call('PEXPIRE', cfg.valueKey, ttl)
      redis.call('PEXPIRE', cfg.permitsKey, ttl)
    end
  end
end

-- How long a caller denied `least` permits (with `value` available now) should wait, ms, in
-- 1..interval: until enough permits will have expired. `taken` (optional): permits this call
-- granted already and has not written yet, stamped nowUs (acquire_batch.lua): the newest in use.
local function denialWait(cfg, value, least, nowUs, taken)
  local zkey = cfg.permitsKey
  local wait
  if cfg.frozen then
    -- nothing is granted until the newest member has expired
    local newest = redis.call('ZREVRANGE', zkey, 0, 0, 'WITHSCORES')
    wait = scoreMicros(newest[2]) + cfg.interval * 1000 - nowUs
  elseif cfg.reclaim == BATCH then
    wait = 1000  -- more expired members wait to be reclaimed: the next call takes the next batch
  else
    -- Walk the oldest live members until enough permits would be free; wait until that one
    -- expires. Each member holds at least one permit, so the oldest `missing` members are enough;
    -- fetching at most 64 keeps a denial cheap (each score is formatted as text for Lua). When more
    -- are missing than that (a rate lowered below the permits in use), this is the earliest time
    -- worth asking again.
    local missing = least - value
    local fetch = missing
    if fetch > 64 then fetch = 64 end
    local oldest = redis.call('ZRANGEBYSCORE', zkey, '(' .. cfg.edge, '+inf', 'WITHSCORES', 'LIMIT', 0, fetch)
    local freed, stamp = 0, nowUs
    for i = 1, #oldest, 2 do
      freed = freed + permitsOf(zkey, oldest[i])
      stamp = scoreMicros(oldest[i + 1])
      if freed >= missing then break end
    end
    -- Not enough in the log, and the rest is what this call took just now: free one interval on.
    if freed < missing and #oldest < 2 * fetch and (taken or 0) > 0 then stamp = nowUs end
    wait = stamp + cfg.interval * 1000 - nowUs
  end
  wait = math.ceil(wait / 1000)
  if wait < 1 then wait = 1 end
  if wait > cfg.interval then wait = cfg.interval end
  return wait
end
