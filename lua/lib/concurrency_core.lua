-- lib/concurrency_core.lua: lease sets, the state of a Limiter's concurrency policy (concurrency.lua) and of
-- a concurrency limit decided in a MultiLimit (multi.lua). One key per limit: a sorted set whose
-- members are lease ids (32 lowercase hex digits, made by the client) and whose scores are the
-- leases' expiries in epoch µs on the server's clock (integers: exact in a double below 2^53). A
-- lease is live while now < expiry.
--
-- Bounded work: a load reads at most LEASE_RECLAIM expired leases (the lowest ranks), which the
-- next write removes, plus O(log n) reads (ZSCORE, ZCOUNT, the two latest leases, one lease by
-- rank): never a scan of every lease. Expired leases not reclaimed yet are not live (ZCOUNT counts
-- only live ones). A write keeps the key's TTL at the latest live expiry (rounded up to ms), so it
-- vanishes once no lease can be live; a write that leaves no live lease deletes it (UNLINK).
--
-- Every member and score a load reads is checked before the caller's first write (a member that is
-- not a lease id, a score that is not an integer expiry in 0..9e15 or lies further ahead than two
-- longest TTLs: REDLIMIT_INVALID_STATE; a key of another type: REDLIMIT_INVALID_CONFIG).
--
-- Self-contained: it uses nothing of lib/base.lua, so concurrency.lua includes it alone and pays
-- for no other library's closures (see concurrency.lua).

local LEASE_RECLAIM = 100                       -- expired leases removed per write, at most
local LEASE_MAX_TTL_US = 4294967295 * 1000      -- the longest lease TTL, µs (49.7 days)

-- The helpers below are made only if `makesLeases` is true: a local that a script which includes this
-- file sets above its `-- include:` line. A function is a closure made anew on every call
-- (cmake/EmbedLua.cmake), so a script makes only the groups it uses; the others stay nil.
local leaseFail, leaseCeilDiv, leaseIdArg, leaseWrongType, leaseCorrupt, leaseCheckId, leaseExpiryOf,
  leaseLoad, leaseLive, leaseLatestBut, leaseHeld, leaseWait, leasePut, leaseFinish
if makesLeases then
  function leaseFail(code, message)
    error({err = code .. ' ' .. message})
  end

  -- ceil(a / b) for integers 0 <= a < 2^53, b >= 1: exact in doubles (see gcra.lua).
  function leaseCeilDiv(a, b)
    return -math.floor(-a / b)
  end

  -- A lease id argument for the limiter(s) `owner`: 32 lowercase hex digits.
  function leaseIdArg(s, owner)
    if type(s) ~= 'string' or #s ~= 32 or not string.find(s, '^[0-9a-f]+$') then
      leaseFail('REDLIMIT_INVALID_ARGUMENT', 'lease id must be 32 lowercase hex digits for limiter ' .. owner)
    end
    return s
  end

  -- The first read of key failed (`r` is its error reply): a key of another type, or an error to pass on.
  function leaseWrongType(key, r)
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      leaseFail('REDLIMIT_INVALID_CONFIG', 'key ' .. key .. ' holds another Redis type, not a concurrency limit ' ..
        '(another program wrote it); delete it or use another limiter name')
    end
    error(r)
  end

  function leaseCorrupt(key, what)
    leaseFail('REDLIMIT_INVALID_STATE', 'sorted set ' .. key .. ' of a concurrency limit holds ' .. what ..
      ' (another program wrote it); delete it (deleteKey) or use another limiter name')
  end

  function leaseCheckId(key, m)
    if type(m) ~= 'string' or #m ~= 32 or not string.find(m, '^[0-9a-f]+$') then
      leaseCorrupt(key, 'a member that is not a lease id')
    end
  end

  function leaseExpiryOf(key, score, nowUs)
    local e = tonumber(score)
    if e == nil or e % 1 ~= 0 or e < 0 or e > 9e15 or e > nowUs + 2 * LEASE_MAX_TTL_US then
      leaseCorrupt(key, 'a score that is not a lease expiry in epoch microseconds')
    end
    return e
  end

  -- Reads (and checks) what every call on the lease set `key` needs at `nowUs`: the expired batch to
  -- reclaim (s.n of them), lease `id`'s expiry (s.own, nil if absent or id is nil), the two latest
  -- leases (s.top = {id, expiry, id, expiry}).
  function leaseLoad(key, nowUs, id)
    local nowArg = string.format('%d', nowUs)
    local expired = redis.pcall('ZRANGEBYSCORE', key, '-inf', nowArg, 'WITHSCORES', 'LIMIT', 0, LEASE_RECLAIM)
    if expired.err then leaseWrongType(key, expired) end
    for i = 1, #expired, 2 do
      leaseCheckId(key, expired[i])
      leaseExpiryOf(key, expired[i + 1], nowUs)
    end
    local own = nil                              -- ZSCORE answers false for no lease: keep nil
    if id then
      local score = redis.call('ZSCORE', key, id)
      if score then own = leaseExpiryOf(key, score, nowUs) end
    end
    local top = redis.call('ZREVRANGE', key, 0, 1, 'WITHSCORES')
    for i = 1, #top, 2 do
      leaseCheckId(key, top[i])
      top[i + 1] = leaseExpiryOf(key, top[i + 1], nowUs)
    end
    -- One constructor: the table is made at its size once (a multi-limit adds a few fields later).
    return {key = key, now = nowUs, nowArg = nowArg, n = #expired / 2, own = own, top = top}
  end

  -- True if lease `id` (loaded by leaseLoad) is live.
  function leaseLive(s)
    return s.own ~= nil and s.own > s.now
  end

  -- The latest expiry among the two latest leases other than lease `except`; 0 if none.
  function leaseLatestBut(s, except)
    for i = 1, #s.top, 2 do
      if s.top[i] ~= except then return s.top[i + 1] end
    end
    return 0
  end

  -- Live leases now.
  function leaseHeld(s)
    return redis.call('ZCOUNT', s.key, '(' .. s.nowArg, '+inf')
  end

  -- How long until fewer than `limit` of the `held` live leases are left, if none is released and
  -- none added: 0 when held < limit, else until the (held - limit + 1)-th soonest live lease
  -- expires: the soonest when held == limit (one read), else by rank, past the expired leases not
  -- reclaimed yet (O(log n) each: no offset scan when a handle with a lower limit asks).
  function leaseWait(s, held, limit)
    if held < limit then return 0 end
    local e
    if held == limit then
      e = redis.call('ZRANGEBYSCORE', s.key, '(' .. s.nowArg, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    else
      local rank = redis.call('ZCOUNT', s.key, '-inf', s.nowArg) + held - limit
      e = redis.call('ZRANGE', s.key, rank, rank, 'WITHSCORES')
    end
    leaseCheckId(s.key, e[1])
    return leaseExpiryOf(s.key, e[2], s.now) - s.now
  end

  -- Writes lease `id` with `expiry` ('XX': only if it is there), after reclaiming the expired batch,
  -- and keeps the key's TTL at `latest` (the latest live expiry, this one included).
  function leasePut(s, id, expiry, latest, flag)
    if s.n > 0 then redis.call('ZREMRANGEBYRANK', s.key, 0, s.n - 1) end
    if flag then
      redis.call('ZADD', s.key, flag, string.format('%d', expiry), id)
    else
      redis.call('ZADD', s.key, string.format('%d', expiry), id)
    end
    redis.call('PEXPIRE', s.key, string.format('%d', leaseCeilDiv(latest - s.now, 1000)))
  end

  -- The writes of a call that adds nothing: reclaim the expired batch (first: the lowest ranks),
  -- remove lease `remove` (nil: none), then keep the key's TTL at the latest live expiry `latest`,
  -- or delete the key when no lease is live. Writes nothing when there is nothing to remove.
  function leaseFinish(s, latest, remove)
    if s.n == 0 and not remove then return end
    if latest <= s.now then
      redis.call('UNLINK', s.key)
      return
    end
    if s.n > 0 then redis.call('ZREMRANGEBYRANK', s.key, 0, s.n - 1) end
    if remove then redis.call('ZREM', s.key, remove) end
    redis.call('PEXPIRE', s.key, string.format('%d', leaseCeilDiv(latest - s.now, 1000)))
  end
end
