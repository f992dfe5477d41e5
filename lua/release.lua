-- release.lua: give permits back before they expire.
-- ARGV[1] permits to give back (>= 0), ARGV[2] the exact member to take them from ('' = the
-- newest live members, as many as needed), ARGV[3] now in epoch ms ('' = server clock).
-- Unlike Redisson's release(), which raises the value and leaves the log alone (so the value can
-- exceed the rate and later corrections collapse it), this shrinks or removes the members the
-- permits came from, so value + live permits == rate still holds. The value seen by callers is
-- the same as Redisson's: min(value + permits, rate) when the state was consistent.
-- Reply: {released, value}.
local cfg = readConfig()
local want = parseCount(ARGV[1])
if not want then fail('REDLIMIT_INVALID_ARGUMENT', 'permits to release must be an integer >= 0') end
local now = currentTime(ARGV[3])
local value = refill(cfg, now)
local edge = now - cfg.interval
local released = 0

-- Takes up to `left` permits from one member; returns how many it took.
local function shrink(member, score, left)
  local id, permits = unpackMember(member)
  local take = permits
  if take > left then take = left end
  redis.call('ZREM', cfg.permitsKey, member)
  if permits > take then
    redis.call('ZADD', cfg.permitsKey, score, packMember(id, permits - take))
    cfg.newLog = true  -- the ZREM may have emptied (deleted) the log: re-apply the TTL
  end
  return take
end

if want > 0 then
  if ARGV[2] ~= '' then
    local score = redis.call('ZSCORE', cfg.permitsKey, ARGV[2])
    if score and tonumber(score) > edge then
      released = shrink(ARGV[2], score, want)
    end
  else
    while released < want do
      -- each member holds at least one permit: fetch no more members than permits still wanted
      local fetch = want - released
      if fetch > 64 then fetch = 64 end
      local newest = redis.call('ZREVRANGEBYSCORE', cfg.permitsKey, '+inf', '(' .. edge, 'WITHSCORES', 'LIMIT', 0, fetch)
      if #newest == 0 then break end
      for i = 1, #newest, 2 do
        released = released + shrink(newest[i], newest[i + 1], want - released)
        if released >= want then break end
      end
    end
  end
end
if released > 0 then
  value = redis.call('INCRBY', cfg.valueKey, released)
end
applyTtl(cfg)
return {released, value}
