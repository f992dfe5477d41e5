-- common.lua: helpers shared by every redlimit script. The build (cmake/EmbedLua.cmake) puts this
-- text in front of each script, so what Redis runs is common.lua followed by the script.
--
-- Every script gets the same five keys, in Redisson's order (all in one hash slot when the name
-- has no '{'; see docs in README "Compatibility with Redisson"):
--   KEYS[1] config hash      N
--   KEYS[2] value            {N}:value
--   KEYS[3] client value     {N}:value:<clientId>
--   KEYS[4] permits          {N}:permits
--   KEYS[5] client permits   {N}:permits:<clientId>
-- Data layout (Redisson 3.38+): hash fields rate, interval (ms), type (0 OVERALL, 1 PER_CLIENT),
-- keepAliveTime (ms, 0 or absent = none); value = permits left (decimal); permits = sorted set,
-- score = grant time in epoch ms, member = 0x10 + 16 random bytes + permits as little-endian
-- uint32 (older Redisson: 0x08 + 8 bytes; the length byte says which).
-- Invariant: value + (permits of members with score > now - interval) == rate.

-- Redis 5.0 and later replicate a script's effects, not the script, so a script may read TIME
-- and then write (redlimit needs 5.0+; earlier versions would need redis.replicate_commands()).

-- Raises an error reply "CODE message"; the client maps the code to an exception type.
local function fail(code, message)
  error({err = code .. ' ' .. message})
end

-- A whole number in 0..10^14 written canonically ("10", not " 10", "010" or "1e1"), or nil.
-- tonumber() and tostring() rather than a pattern match: this runs several times per call and
-- patterns cost microseconds. Up to 10^14 tostring() prints every integer in full.
local function parseCount(s)
  local n = tonumber(s)
  if n == nil or n < 0 or n > 1e14 or n ~= math.floor(n) or tostring(n) ~= s then return nil end
  return n
end

local MAX_RATE = 4294967295          -- permits are stored as uint32 in a member
local MAX_INTERVAL = 1000000000000   -- ms (about 31 years); keeps every sum exact and printable

-- Reads and checks the configuration hash. Fails with REDLIMIT_NOT_INITIALIZED if it does not
-- exist, REDLIMIT_INVALID_CONFIG if a field is missing or unusable.
local function readConfig()
  local f = redis.call('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')
  if not f[1] and not f[2] and not f[3] then
    fail('REDLIMIT_NOT_INITIALIZED', 'RateLimiter is not initialized')
  end
  local rate, interval, keepAlive = parseCount(f[1]), parseCount(f[2]), 0
  if f[4] then keepAlive = parseCount(f[4]) end
  if not rate or rate < 1 or rate > MAX_RATE then
    fail('REDLIMIT_INVALID_CONFIG', 'field rate of ' .. KEYS[1] .. ' is not an integer in 1..' .. MAX_RATE)
  end
  if not interval or interval < 1 or interval > MAX_INTERVAL then
    fail('REDLIMIT_INVALID_CONFIG', 'field interval of ' .. KEYS[1] .. ' is not an integer number of ms in 1..' .. MAX_INTERVAL)
  end
  if f[3] ~= '0' and f[3] ~= '1' then
    fail('REDLIMIT_INVALID_CONFIG', 'field type of ' .. KEYS[1] .. ' is not 0 (OVERALL) or 1 (PER_CLIENT)')
  end
  if not keepAlive or keepAlive > MAX_INTERVAL then
    fail('REDLIMIT_INVALID_CONFIG', 'field keepAliveTime of ' .. KEYS[1] .. ' is not an integer number of ms')
  end
  local cfg = {rate = rate, interval = interval, type = f[3], keepAlive = keepAlive,
               valueKey = KEYS[2], permitsKey = KEYS[4]}
  if f[3] == '1' then
    cfg.valueKey, cfg.permitsKey = KEYS[3], KEYS[5]
  end
  return cfg
end

-- Now in epoch ms: the server's clock, or the client's when the caller passed one.
local function currentTime(arg)
  if arg == nil or arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local now = parseCount(arg)
  if not now then fail('REDLIMIT_INVALID_ARGUMENT', 'time must be epoch ms') end
  return now
end

local function packMember(id, permits)
  return struct.pack('<Bc0I4', #id, id, permits)
end

-- Returns id, permits of a member; the id length comes from the first byte (16, or 8 from old
-- Redisson versions).
local function unpackMember(member)
  return struct.unpack('<Bc0I4', member)
end

local function sumPermits(members)
  local sum = 0
  for i = 1, #members do
    local _, permits = unpackMember(members[i])
    sum = sum + permits
  end
  return sum
end

-- Permits held by members with score > edge. Unpacks every live member: O(live).
local function livePermits(permitsKey, edge)
  return sumPermits(redis.call('ZRANGEBYSCORE', permitsKey, '(' .. edge, '+inf'))
end

-- Returns expired permits (score <= now - interval) to the value, keeping the invariant, and
-- returns the value. Cost: two O(log n) reads when nothing expired (the common case); a log that
-- has expired completely is dropped without unpacking its members (UNLINK frees it off the main
-- thread); otherwise the smaller side (expired or live) is unpacked. Creates the value key if it
-- is missing. Sets cfg.rewrote when it (re)wrote the value key, which drops its TTL.
-- The value may be negative after the rate was lowered below the permits still live (see
-- set_rate.lua); it then climbs back as those permits expire.
local function refill(cfg, now)
  local edge = now - cfg.interval
  local raw = redis.call('GET', cfg.valueKey)
  local value = raw and tonumber(raw) or nil  -- GET answers false for a missing key
  local consistent = value ~= nil and value <= cfg.rate
  if consistent then
    -- Fast path: the oldest member is still live, so nothing expired.
    local oldest = redis.call('ZRANGE', cfg.permitsKey, 0, 0, 'WITHSCORES')
    if #oldest > 0 and tonumber(oldest[2]) > edge then return value end
    if #oldest == 0 and value == cfg.rate then
      cfg.newLog = true  -- a grant will create the log: it needs the hash's TTL
      return value
    end
  end
  cfg.rewrote = true
  local newest = redis.call('ZREVRANGE', cfg.permitsKey, 0, 0, 'WITHSCORES')
  if #newest == 0 or tonumber(newest[2]) <= edge then
    if #newest > 0 then redis.call('UNLINK', cfg.permitsKey) end
    redis.call('SET', cfg.valueKey, cfg.rate)
    return cfg.rate
  end
  local expired = redis.call('ZCOUNT', cfg.permitsKey, '-inf', edge)
  local live = redis.call('ZCARD', cfg.permitsKey) - expired
  local fresh
  if consistent and expired <= live then
    fresh = value + sumPermits(redis.call('ZRANGEBYSCORE', cfg.permitsKey, '-inf', edge))
    redis.call('ZREMRANGEBYSCORE', cfg.permitsKey, '-inf', edge)
    if fresh > cfg.rate then
      -- another writer broke the invariant (Redisson's release() raises value without touching
      -- the log): rebuild the value from the live permits, but never below the value that was
      -- already free, since the log still holds the released permits (Redisson: 10 -> 1)
      fresh = math.max(value, cfg.rate - livePermits(cfg.permitsKey, edge))
    end
  else
    if expired > 0 then redis.call('ZREMRANGEBYSCORE', cfg.permitsKey, '-inf', edge) end
    fresh = cfg.rate - livePermits(cfg.permitsKey, edge)
    if consistent and value > fresh then fresh = value end  -- as above
  end
  redis.call('SET', cfg.valueKey, fresh)
  return fresh
end

-- Applies the TTL rules to the state keys: keepAliveTime > 0 refreshes the idle TTL of all keys
-- on every call; otherwise a state key that was just (re)created inherits the hash's TTL (set by
-- expire/expireAt), if it has one. Keys that existed keep theirs: ZADD, DECRBY and INCRBY do not
-- touch a TTL, so the steady path needs no PTTL.
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
