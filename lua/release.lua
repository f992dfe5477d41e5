-- include: base redisson
-- release.lua: give permits back before they expire.
-- ARGV[1] permits to give back (>= 0), ARGV[2] the exact member to take them from ('' = the
-- newest live members, as many as needed), ARGV[3] now in epoch µs ('' = server clock),
-- ARGV[4] the rate the client saw last ('' if unknown).
-- Unlike Redisson's release(), which raises the value and leaves the log alone (so the value can
-- exceed the rate and later corrections collapse it), this shrinks or removes the members the
-- permits came from and raises the value by as much, so the invariant (value + permits in the
-- log == rate) still holds: the value never ends above rate - live permits, whatever another
-- writer left before (loadState repairs that first). At most BATCH members are looked at per
-- call; the reply says whether more could be released (the client calls again).
-- Reply: {released, value, more}.
local cfg = readConfig()
local want = parseCount(ARGV[1])
if not want or want > MAX_RATE then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits to release must be an integer in 0..' .. MAX_RATE)
end
local member = ARGV[2]
local value = loadState(cfg, currentMicros(ARGV[3]), 0, true, ARGV[4])
local zkey = cfg.permitsKey
local edge = tonumber(cfg.edge)
local plan = {}       -- members to shrink: {member, score, permits, take}
local released, more = 0, 0

-- Plans to take up to `left` permits from one member; returns how many.
local function take(m, score, left)
  local permits = permitsOf(zkey, m)
  local n = permits
  if n > left then n = left end
  if n > 0 then plan[#plan + 1] = {m, score, permits, n} end
  return n
end

if want > 0 and not cfg.frozen and cfg.left > 0 then
  if member ~= '' then
    local score = redis.call('ZSCORE', zkey, member)
    if score and tonumber(score) > edge then
      released = take(member, score, want)
    end
  else
    local offset, seen = 0, 0
    while released < want and seen < BATCH do
      -- each member holds at least one permit: fetch no more members than permits still wanted
      local fetch = want - released
      if fetch > 64 then fetch = 64 end
      if fetch > BATCH - seen then fetch = BATCH - seen end
      local newest = redis.call('ZREVRANGEBYSCORE', zkey, '+inf', '(' .. cfg.edge, 'WITHSCORES', 'LIMIT', offset, fetch)
      if #newest == 0 then break end
      for i = 1, #newest, 2 do
        seen = seen + 1
        released = released + take(newest[i], newest[i + 1], want - released)
        if released >= want then break end
      end
      offset = offset + #newest / 2
    end
    if released < want and seen >= BATCH then more = 1 end
  end
end

-- Writes, after every read and check.
writeState(cfg, value + released)
for i = 1, #plan do
  local m, score, permits, n = plan[i][1], plan[i][2], plan[i][3], plan[i][4]
  redis.call('ZREM', zkey, m)
  if permits > n then
    redis.call('ZADD', zkey, score, packMember(string.sub(m, 2, #m - 4), permits - n))
    cfg.newLog = true  -- the ZREM may have emptied (deleted) the log: re-apply the TTL
  end
end
applyTtl(cfg)
return {released, value + released, more}
