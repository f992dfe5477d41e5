-- lib/gcra_core.lua: the generic cell rate algorithm on one packed key, for gcra.lua (one limiter)
-- and multi.lua (several decided together). Policy::gcra (kind 'G') and Policy::tokenBucket
-- (kind 'T') both run it.
--
-- A token bucket of capacity B refilled with P permits every I, and GCRA with burst B and rate
-- P per I, are one algorithm: at time t the bucket holds B - max(0, TAT - t) / T permits, where
-- T = I / P is the time one permit takes to come back and TAT (the "theoretical arrival time")
-- the time at which the bucket is full again. So the state is one time rather than tokens plus a
-- timestamp (folly's TokenBucket also keeps a single time). Taking n permits is allowed when
-- max(TAT, now) + n*T <= now + B*T, and moves TAT there. Time is the server's, read by the script.
--
-- Units: T = I / P is rarely a whole number of µs. With g = gcd(P, I in µs), P' = P / g and
-- I' = I / g, one permit is exactly I' units of 1/P' µs. A time is stored as whole µs plus a
-- remainder in units (0 <= rem < P'); the code works on D = max(0, TAT - now) in units, never
-- on an absolute time in units.
--
-- Bounds (the client checks a configuration before sending it, and the scripts check it again):
--   B, P in 1..2^32-1; I in 1..2^32-1 ms; keepAlive in 0..2^32-1 ms; B*I' <= 2^50.
--   A reservation waits at most H = max(B*T, I) µs (whole µs, the horizon: the time the whole burst
--   takes to come back, or one period if that is longer), and never more than floor(2^52 / P') µs,
--   so D <= B*I' + H*P' <= 2^50 + 2^52, and D + n*I' (n <= B) < 2^53: every value below is an exact
--   integer.
-- Clock steps: nothing puts TAT further ahead of the writer's clock than B*T + H (a full bucket
--   of debt plus the longest reservation; refund only moves it back, and its permits are >= 0).
--   A stored TAT further ahead of now than that was written by a clock that was ahead of the
--   server's clock now (a server clock stepped back, a failover to a replica whose clock is
--   behind): D is clamped to B*I' + H*P', the furthest legal value, so such a step costs at most
--   H + n*T of denials, whatever its size. A clamped state is written back by the next take, also
--   when it denies (s.stale), so the step is not met again.
-- Another configuration (gcraWithConfig: the caller's, the key holding another one) applies from
--   the first call that may write: take, reserve, refund and settle write the rescaled state with
--   the caller's configuration also when they deny or change nothing else (s.stale), so a denial's
--   retryAfter, at the new rate, is exact (nothing is left draining at the stored configuration's
--   pace); peek writes nothing and answers what take would.
-- Layout (28 bytes): kind 'G' or 'T', B (uint32), P (uint32), I ms (uint32), keepAlive ms
--   (uint32), TAT µs (uint56), TAT's remainder in units (uint32).
-- TTL: none unless keepAlive > 0; then the time until the bucket is full again plus keepAlive.
--
-- A limiter is a table s: key, kind, label, nowUs, the configuration (b, p, intervalMs,
-- keepAlive), pp = P', ip = I', cap = B*I', maxWait = H, d = D at nowUs, and stale: the key does
-- not hold s (a state clamped after a clock step, another configuration), so every call that may
-- write writes s back, also one that denies or changes nothing else.
local GCRA_LAYOUT = '<c1I4I4I4I4I7I4'
local GCRA_LABELS = {G = 'GCRA limiter', T = 'token bucket limiter'}

-- The helpers below are made only if `makesGcra` is true: a local that a script which includes this
-- file sets above its `-- include:` line. A function is a closure made anew on every call
-- (cmake/EmbedLua.cmake), so a script makes only the groups it uses; the others stay nil.
local gcraConfigProblem, gcraHorizon, gcraNew, gcraLoad, gcraLocalRate, gcraStore, gcraCheckPermits, gcraWait,
  gcraAfterAt, gcraTake, gcraRemaining, gcraResetAfter, gcraRefund, gcraRescale, gcraWithConfig, gcraSettle
if makesGcra then
  -- nil if the configuration is usable, else what is wrong with it.
  function gcraConfigProblem(b, p, intervalMs, keepAlive)
    if b < 1 or b > MAX_U32 then return 'the burst (capacity) must be in 1..' .. MAX_U32 end
    if p < 1 or p > MAX_U32 then return 'the permits per interval must be in 1..' .. MAX_U32 end
    if intervalMs < 1 or intervalMs > MAX_U32 then return 'the interval must be in 1..' .. MAX_U32 .. ' ms' end
    if keepAlive > MAX_U32 then return 'keepAlive must be in 0..' .. MAX_U32 .. ' ms' end
    local g = gcd(p, intervalMs * 1000)
    if b * (intervalMs * 1000 / g) > TWO50 then
      return 'burst x (interval in µs / gcd(permits, interval in µs)) exceeds 2^50'
    end
    return nil
  end

  -- H, the longest a reservation waits (µs): max(floor(B*T), I), at most floor(2^52 / P').
  function gcraHorizon(cap, pp, ius)
    local h = floorDiv(cap, pp)
    if h < ius then h = ius end
    local w = floorDiv(TWO52, pp)
    if h > w then h = w end
    return h
  end

  -- A limiter with a checked configuration and an idle bucket (d = 0).
  function gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive)
    local s = {key = key, kind = kind, label = GCRA_LABELS[kind], nowUs = nowUs,
               b = b, p = p, intervalMs = intervalMs, keepAlive = keepAlive}
    local ius = intervalMs * 1000
    local g = gcd(p, ius)
    s.pp, s.ip = p / g, ius / g
    s.cap = b * s.ip                         -- B*I' <= 2^50
    s.maxWait = gcraHorizon(s.cap, s.pp, ius)  -- H, µs: H*P' <= 2^52
    s.d = 0
    return s
  end

  -- The limiter of `key` at nowUs, its configuration and state checked before anything is written.
  function gcraLoad(key, kind, nowUs)
    local label = GCRA_LABELS[kind]
    local v = readPacked(kind, label, key)
    if not v then notInitialized(label, key) end
    local _, b, p, intervalMs, keepAlive, tatUs, tatRem = struct.unpack(GCRA_LAYOUT, v)
    local bad = gcraConfigProblem(b, p, intervalMs, keepAlive)
    if bad then
      fail('REDLIMIT_INVALID_CONFIG', 'configuration of ' .. label .. ' ' .. key .. ': ' .. bad ..
        '; fix it with Limiter::setPolicy')
    end
    local s = gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive)
    if tatRem >= s.pp or tatUs >= TWO52 * 2 then
      fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' of ' .. label ..
        ' holds a time redlimit did not write; reset it with Limiter::setPolicy')
    end
    local dmax = s.cap + s.maxWait * s.pp
    if tatUs >= nowUs then
      local dt = tatUs - nowUs
      if dt > ceilDiv(dmax, s.pp) then
        s.d = dmax                           -- the server's clock went back: clamped, as far ahead as TAT can be
        s.stale = true
      else
        s.d = dt * s.pp + tatRem             -- <= dmax + 2P' < 2^53
        if s.d > dmax then s.d, s.stale = dmax, true end
      end
    end
    return s
  end

  -- The bucket the Local failure policy runs: B permits per the time B permits take to come back
  -- (an estimate for an emergency; doubles are fine here).
  function gcraLocalRate(s)
    local ms = math.ceil(s.b * s.intervalMs / s.p)
    if ms < 1 then ms = 1 end
    if ms > 1e12 then ms = 1e12 end
    return s.b, ms
  end

  -- Stores TAT = now + d units.
  function gcraStore(s, d)
    local q, r = floorDiv(d, s.pp)
    writePacked(struct.pack(GCRA_LAYOUT, s.kind, s.b, s.p, s.intervalMs, s.keepAlive, s.nowUs + q, r),
      ceilDiv(d, s.pp), s.keepAlive, s.key)
  end

  -- Fails with REDLIMIT_INVALID_ARGUMENT if n permits can never be granted at once.
  function gcraCheckPermits(s, n)
    if n > s.b then
      fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits (' .. n .. ') exceed the burst (' .. s.b .. ') of ' ..
        s.label .. ' ' .. s.key .. ': they could never be granted at once')
    end
  end

  -- The first whole µs from now at which n permits (n <= B) fit in the bucket: 0 if they fit now.
  function gcraWait(s, n)
    local excess = s.d + n * s.ip - s.cap
    if excess <= 0 then return 0 end
    return ceilDiv(excess, s.pp)
  end

  -- D after taking n permits at e µs from now (e >= gcraWait(s, n)). A grant at whole µs e counts
  -- as taken at the first unit that rounds up to e, (e - 1) µs + 1 unit, so that e = gcraWait(s, n)
  -- gives D + n*I' (TAT moves by exactly n*T) and every grant is exact in units. The result is at
  -- most B*I' + e*P'.
  function gcraAfterAt(s, n, e)
    local start = e * s.pp - s.pp + 1
    if start < s.d then start = s.d end
    return start + n * s.ip
  end

  -- Taking n permits now, or as a reservation within maxWait µs (cut to H): allowed (1 or 0), the
  -- delay before the permits may be used, retryAfter (denied: when the same call succeeds, exactly,
  -- if nobody else takes permits), and D after the call.
  function gcraTake(s, n, maxWait)
    if maxWait > s.maxWait then maxWait = s.maxWait end
    local wait = gcraWait(s, n)
    if wait <= maxWait then return 1, wait, 0, gcraAfterAt(s, n, wait) end
    return 0, 0, wait - maxWait, s.d
  end

  -- Permits that can be taken at once with D = after.
  function gcraRemaining(s, after)
    if after >= s.cap then return 0 end
    return floorDiv(s.cap - after, s.ip)
  end

  -- µs until the bucket is full again with D = after.
  function gcraResetAfter(s, after)
    return ceilDiv(after, s.pp)
  end

  -- Gives n permits back (up to a full bucket) and stores the result if it changed or s is stale;
  -- returns D.
  function gcraRefund(s, n)
    local d = s.d
    if n >= ceilDiv(d, s.ip) then
      d = 0
    else
      d = d - n * s.ip                       -- n*I' < D + I'
    end
    if d ~= s.d or s.stale then gcraStore(s, d) end
    return d
  end

  -- The permits in use of `old` (D / I'), kept in `s` (another configuration of the same kind, at
  -- the same now): s.d = ceil(D_old x I'_new / I'_old) units, at most s's furthest D. The same I'
  -- keeps D exactly (a change of keepAlive or of burst only); otherwise the double product is
  -- rounded up, so a change never hands out a permit that was in use. s is then stale (the key
  -- holds old).
  function gcraRescale(old, s)
    local d = old.d
    if old.ip ~= s.ip then d = math.ceil(d / old.ip * s.ip) end
    local dmax = s.cap + s.maxWait * s.pp
    if d > dmax then d = dmax end
    s.d = d
    s.stale = true
  end

  -- The limiter of `key` at nowUs under the caller's configuration `cfg` (the key's 17-byte
  -- header: kind, B, P, I ms, keepAlive ms): idle if the key does not exist, the stored state if
  -- it holds cfg, the stored state rescaled to cfg if it holds another configuration of `kind`
  -- (stale: the next call that may write writes it, with cfg).
  -- Fails with REDLIMIT_INVALID_ARGUMENT for a cfg that is not a usable configuration of `kind`.
  function gcraWithConfig(key, kind, nowUs, cfg)
    local label = GCRA_LABELS[kind]
    if #cfg ~= 17 then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call must be 17 bytes') end
    local k, b, p, intervalMs, keepAlive = struct.unpack('<c1I4I4I4I4', cfg)
    if k ~= kind then fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call is not one of ' .. label) end
    local bad = gcraConfigProblem(b, p, intervalMs, keepAlive)
    if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. key .. ': ' .. bad) end
    local v = readPacked(kind, label, key)
    if not v then return gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive) end
    local old = gcraLoad(key, kind, nowUs)
    if string.sub(v, 1, 17) == cfg then return old end
    local s = gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive)
    gcraRescale(old, s)
    return s
  end

  -- Settles a reservation of `reserved` permits that used `actual` (gcra.lua's and multi.lua's
  -- settle): gives back reserved - actual (refund's arithmetic, up to a full bucket), or takes
  -- actual - reserved more as debt, D at most B*I' + H*P' (what a reservation with the longest wait
  -- may leave; the rest is unpaid). Stores what changed, or s when stale. Returns returned, charged,
  -- unpaid, remaining.
  function gcraSettle(s, reserved, actual)
    local d, returned, charged, unpaid = s.d, 0, 0, 0
    if actual < reserved then
      returned = math.min(reserved - actual, ceilDiv(s.d, s.ip))
      d = gcraRefund(s, reserved - actual)
    elseif actual > reserved then
      local dmax = s.cap + s.maxWait * s.pp  -- the furthest D a reservation may leave (gcraLoad's clamp)
      local room = 0
      if d < dmax then room = floorDiv(dmax - d, s.ip) end
      charged = math.min(actual - reserved, room)
      unpaid = actual - reserved - charged
      d = d + charged * s.ip
    end
    if actual >= reserved and (d ~= s.d or s.stale) then gcraStore(s, d) end
    return returned, charged, unpaid, gcraRemaining(s, d)
  end
end
