-- gcra.lua: the generic cell rate algorithm on one key. A Limiter of Policy::gcra (kind 'G') or
-- Policy::tokenBucket (kind 'T') runs it. The algorithm, its exact integer units, bounds,
-- layout (28 bytes) and TTL are described in lua/lib/gcra_core.lua, which multi.lua shares.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind):
--   take n maxWaitUs   takes n permits if the bucket holds them; with maxWaitUs > 0, also if it
--                      will hold them within maxWaitUs: a reservation, which moves TAT past
--                      now + B*T (the bucket goes into debt) and tells the caller to wait
--                      `delay`; maxWaitUs is cut to the horizon H = max(B*T, I) (see
--                      lib/gcra_core.lua: it bounds how far ahead TAT can legally be, so a
--                      server clock stepped back costs at most H + n*T). Writes when it takes; a
--                      denial writes only a state clamped after a clock step, or another
--                      configuration (below).
--   peek n             what `take n 0` would decide, with remaining and resetAfter as they are
--                      now; writes nothing
--   refund n           gives n permits back, up to a full bucket
--   reserve n ttlMs    KEYS[2] the record key (lib/reservation_core.lua): `take n 0`, and when it
--                      grants, an open record of n permits with a TTL of ttlMs, in the same call.
--                      A record there already: nothing is taken, the reply is the grant again as
--                      the bucket is now (it must hold n permits). Reply: take's, then repeated
--                      (0 or 1).
--   settle actual      KEYS[2] the record key. An open record of r permits: gives back r - actual
--                      (refund's arithmetic, up to a full bucket), or takes actual - r more as
--                      debt, TAT at most B*T + H ahead (what a reservation with the longest wait
--                      may owe; the rest is unpaid), and marks the record settled with the answer.
--                      Reply {status (1 settled now, 2 settled before: its stored answer, 0 no
--                      record), reserved, actual, returned, charged, unpaid, remaining}.
--   reserve n ttlMs cfg, settle actual cfg
--                      with the configuration in the call (ARGV[6]), as take's.
--   set mode B P I keepAlive initial
--                      mode 'try' writes only if the key does not exist, with `initial` permits
--                      (0..B); 'keep' writes the configuration and keeps the permits in use
--                      (gcraRescale; `initial` only for a key that does not exist), and changes
--                      nothing when the key holds this configuration.
--                      Reply {written, B, localRate, localIntervalMs}.
--   take n maxWaitUs cfg, peek n 0 cfg, refund n 0 cfg
--                      the limit in the call (the keyed limiters, and the handles made with a
--                      configuration): cfg is the caller's
--                      configuration packed as the key's first 17 bytes (kind, B, P, I ms,
--                      keepAlive ms). A key without one is decided as an idle bucket of cfg; a
--                      key holding cfg as it is; a key holding another configuration of this kind
--                      is decided with cfg, its permits in use kept (gcraRescale). take writes
--                      cfg with the state when it takes, and also when it denies if the key held
--                      another configuration: the change applies from then on, so the permits in
--                      use come back at cfg's rate and the denial's retryAfter is exact (refund
--                      writes when it gives back or the key held another configuration; peek
--                      writes nothing and answers what take would).
-- Reply of take and peek: ONE 65-byte string (lib/onekey.lua's packDecision: byte 0xA0 + allowed,
--   then remaining, retryAfterUs, resetAfterUs, B, nowUs, delayUs, localRate, localIntervalMs as
--   little-endian signed 64-bit integers; the fast path packs the same layout inline). retryAfter (denied) is exact: the same call succeeds at
--   now + retryAfter and not a µs earlier, if nobody else takes permits. localRate per
--   localIntervalMs (B permits, refilled at the same average rate) is what the client's Local
--   failure policy runs when Redis cannot be asked.
--
-- The fast path (above the `-- include:` line, so it runs before the libraries' closures are
-- made; it uses none of them): `take` on a key that holds a limiter of the asked
-- kind with a usable configuration and state, and usable arguments, is decided right here with
-- locals only (no tables, no closures), by exactly the arithmetic of lib/gcra_core.lua (gcraLoad,
-- gcraTake, gcraAfterAt, gcraStore, gcraRemaining, gcraResetAfter, gcraLocalRate). Anything else
-- (a missing key, another kind or size, a configuration or state that is out of bounds, a bad
-- argument) falls through to the full code below, which checks everything in order and fails
-- with the precise error before writing anything. A key of another Redis type fails the GET with
-- Redis's WRONGTYPE error; ScriptCore, which knows the key, turns it into ScriptError (InvalidConfig).
-- With the configuration in the call (ARGV[6]), the fast path also requires the key to begin with
-- it: one plain string.find, no new string (measured with 20 000 pipelined EVALSHA, median of 11
-- runs: 4.19 µs per call against 4.12 µs for the stored-config call; the difference is Redis
-- making the 17-byte argument). A missing key is decided here as the configuration with TAT 0 (a
-- full bucket: what gcraWithConfig decides); the checks below are gcraConfigProblem's, so a
-- configuration that fails them goes on to the full code and its precise error. A key holding
-- another configuration goes to gcraWithConfig below.
-- Quotients: floor(a / b) of integers 0 <= a < 2^53, b >= 1 is exact in doubles (a/b is at least
-- 1/b away from an integer it is not, and that is more than half an ulp below 2^53).
local op, kind, key = ARGV[1], ARGV[3], KEYS[1]
if op == 'take' and (kind == 'T' or kind == 'G') then
  local v = redis.call('GET', key)
  -- What decide(1) sends compares as one interned string; anything else goes through tonumber.
  local n, maxWait, nowUs, cfg = ARGV[4], ARGV[5], ARGV[2], ARGV[6]
  if n == '1' then n = 1 else n = tonumber(n) end
  if maxWait == '0' then maxWait = 0 else maxWait = tonumber(maxWait) end
  if nowUs == '' then
    nowUs = 0                              -- read below, once the key is known to be usable
  else
    nowUs = tonumber(nowUs)
    if nowUs and (nowUs < 0 or nowUs > 9e15 or nowUs % 1 ~= 0) then nowUs = nil end
  end
  -- A missing key under the configuration in the call is that configuration with TAT 0 (long
  -- past: a full bucket, gcraWithConfig's gcraNew), so the fast path decides it too.
  if not v and cfg and #cfg == 17 then v = cfg .. '\0\0\0\0\0\0\0\0\0\0\0' end
  if v and #v == 28 and nowUs and n and maxWait and n >= 1 and n % 1 == 0 and maxWait >= 0 and
      maxWait < 1e14 and maxWait % 1 == 0 then
    local k, b, p, intervalMs, keepAlive, tatUs, tatRem = struct.unpack('<c1I4I4I4I4I7I4', v)
    if k == kind and n <= b and p >= 1 and intervalMs >= 1 and tatUs < 9007199254740992 and
        (cfg == nil or string.find(v, cfg, 1, true) == 1) then
      local ius = intervalMs * 1000
      local g, r = p, ius                  -- gcd(P, I in µs); both < 2^43, so % is exact
      while r > 0 do g, r = r, g % r end
      local pp, ip = p / g, ius / g
      local cap = b * ip
      if cap <= 1125899906842624 and tatRem < pp then
        local floor = math.floor
        if ARGV[2] == '' then
          local t = redis.call('TIME')
          nowUs = t[1] * 1000000 + t[2]
        end
        local d = 0                        -- D = max(0, TAT - now) in units
        local h = 0                        -- H, the horizon (gcraHorizon), when needed
        local clamped = false
        if tatUs >= nowUs then
          local dt = tatUs - nowUs
          d = dt * pp + tatRem
          if dt * pp > cap then            -- in debt (reservations), or the clock went back
            h = floor(cap / pp)
            if h < ius then h = ius end
            local w = floor(4503599627370496 / pp)
            if h > w then h = w end
            local dmax = cap + h * pp      -- clamped: as far ahead as TAT can legally be
            if dt > -floor(-dmax / pp) or d > dmax then d, clamped = dmax, true end
          end
        end
        if maxWait > 0 then
          if h == 0 then
            h = floor(cap / pp)
            if h < ius then h = ius end
            local w = floor(4503599627370496 / pp)
            if h > w then h = w end
          end
          if maxWait > h then maxWait = h end
        end
        local wait, allowed, retry, after = d + n * ip - cap, 1, 0, d
        if wait <= 0 then
          wait = 0
          after = d + n * ip
        else
          wait = -floor(-wait / pp)
          if wait <= maxWait then
            after = wait * pp - pp + 1
            if after < d then after = d end
            after = after + n * ip
          else
            allowed, retry, wait = 0, wait - maxWait, 0
          end
        end
        local resetUs = -floor(-after / pp)
        if allowed == 1 or clamped then    -- a clamped state is written back, also on a denial
          local q = floor(after / pp)
          local packed = struct.pack('<c1I4I4I4I4I7I4', kind, b, p, intervalMs, keepAlive, nowUs + q, after - q * pp)
          if keepAlive > 0 then
            redis.call('SET', key, packed, 'PX', -floor(-resetUs / 1000) + keepAlive)
          else
            redis.call('SET', key, packed)
          end
        end
        local remaining = 0
        if after < cap then remaining = floor((cap - after) / ip) end
        local localMs = -floor(-(b * intervalMs / p))
        if localMs < 1 then localMs = 1 elseif localMs > 1e12 then localMs = 1e12 end
        return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, remaining, retry, resetUs, b, nowUs, wait, b, localMs)
      end
    end
  end
end

-- The libraries' helpers this call makes (each is a closure made anew on every call).
local makesGcra, makesRecords = true, op == 'reserve' or op == 'settle'
-- include: base onekey gcra_core reservation_core
local label = GCRA_LABELS[kind]
if not label then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for gcra.lua') end
local nowUs = currentMicros(ARGV[2])

if op == 'take' or op == 'peek' then
  local s
  if ARGV[6] then s = gcraWithConfig(key, kind, nowUs, ARGV[6]) else s = gcraLoad(key, kind, nowUs) end
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  gcraCheckPermits(s, n)
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', key) end
  local allowed, delay, retry, after = gcraTake(s, n, maxWait)
  if op == 'peek' then
    after = s.d
  elseif allowed == 1 then
    gcraStore(s, after)
  elseif s.stale then
    gcraStore(s, s.d)                      -- clamped, or another configuration (lib/gcra_core.lua)
  end
  local lr, lms = gcraLocalRate(s)
  return packDecision(allowed, gcraRemaining(s, after), retry, gcraResetAfter(s, after), s.b, nowUs, delay, lr, lms)
end

if op == 'refund' then
  local s
  if ARGV[6] then s = gcraWithConfig(key, kind, nowUs, ARGV[6]) else s = gcraLoad(key, kind, nowUs) end
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return gcraRemaining(s, gcraRefund(s, n))
end

if op == 'reserve' then
  local s
  if ARGV[6] then s = gcraWithConfig(key, kind, nowUs, ARGV[6]) else s = gcraLoad(key, kind, nowUs) end
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  gcraCheckPermits(s, n)
  local ttl = countArg(ARGV[5], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', key)
  local rkey = recordKey()
  local r = recordRead(rkey, kind, label)
  local lr, lms = gcraLocalRate(s)
  if r then
    recordCheckRepeat(r, rkey, n)
    return {1, gcraRemaining(s, s.d), 0, gcraResetAfter(s, s.d), s.b, nowUs, 0, lr, lms, 1}
  end
  local allowed, delay, retry, after = gcraTake(s, n, 0)
  if allowed == 1 then
    gcraStore(s, after)
    recordOpen(rkey, kind, n, 0, ttl)
  elseif s.stale then
    gcraStore(s, s.d)
  end
  return {allowed, gcraRemaining(s, after), retry, gcraResetAfter(s, after), s.b, nowUs, delay, lr, lms, 0}
end

if op == 'settle' then
  local s
  if ARGV[6] then s = gcraWithConfig(key, kind, nowUs, ARGV[6]) else s = gcraLoad(key, kind, nowUs) end
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
  local rkey = recordKey()
  local r = recordRead(rkey, kind, label)
  if not r then return RECORD_UNKNOWN end
  if r.state == 'S' then return recordAnswer(r) end
  local returned, charged, unpaid, remaining = gcraSettle(s, r.reserved, actual)
  recordClose(rkey, r, actual, returned, charged, unpaid, remaining)
  return {1, r.reserved, actual, returned, charged, unpaid, remaining}
end

if op == 'set' then
  local mode = ARGV[4]
  if mode ~= 'try' and mode ~= 'keep' then fail('REDLIMIT_INVALID_ARGUMENT', 'set mode must be try or keep') end
  local b = countArg(ARGV[5], 1, MAX_U32, 'burst', key)
  local p = countArg(ARGV[6], 1, MAX_U32, 'permits per interval', key)
  local intervalMs = countArg(ARGV[7], 1, MAX_U32, 'interval (ms)', key)
  local keepAlive = countArg(ARGV[8], 0, MAX_U32, 'keepAlive (ms)', key)
  local initial = countArg(ARGV[9], 0, b, 'initial permits', key)
  local bad = gcraConfigProblem(b, p, intervalMs, keepAlive)
  if bad then fail('REDLIMIT_INVALID_ARGUMENT', 'configuration for ' .. label .. ' ' .. key .. ': ' .. bad) end
  local v = readPacked(kind, label, key)
  if v and mode == 'try' then return {0, 0, 0, 0} end
  local s = gcraNew(key, kind, nowUs, b, p, intervalMs, keepAlive)
  -- A stored configuration or state that cannot be used has nothing to keep: 'keep' resets it.
  local usable, old = false, nil
  if v then usable, old = pcall(gcraLoad, key, kind, nowUs) end
  if usable then
    local lr, lms = gcraLocalRate(s)
    if string.sub(v, 1, 17) == string.sub(struct.pack(GCRA_LAYOUT, kind, b, p, intervalMs, keepAlive, 0, 0), 1, 17) then
      return {1, b, lr, lms}               -- the same configuration: nothing changes
    end
    gcraRescale(old, s)
    gcraStore(s, s.d)
    return {1, b, lr, lms}
  end
  gcraStore(s, (b - initial) * s.ip)       -- <= B*I'
  local lr, lms = gcraLocalRate(s)
  return {1, b, lr, lms}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for gcra.lua')
