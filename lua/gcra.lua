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
-- The fast path: `take` on a key that holds a limiter of the asked kind with a usable
-- configuration and state, and usable arguments, is decided by lib/gcra_fast.lua (which batch.lua
-- shares) at the include line, before the other libraries' helpers are made; anything else goes on
-- to the full code below, which checks everything in order and fails with the precise error before
-- writing anything. A key of another Redis type fails the GET with Redis's WRONGTYPE error;
-- ScriptCore, which knows the key, turns it into ScriptError (InvalidConfig).
local op, kind, key = ARGV[1], ARGV[3], KEYS[1]
-- gcraFastCall: a take, decided by lib/gcra_fast.lua at the include line when it can be; then the
-- libraries' helpers this call makes (each is a closure made anew on every call).
local gcraFastCall = op == 'take' and (kind == 'T' or kind == 'G')
local makesGcra, makesRecords = true, op == 'reserve' or op == 'settle'
-- include: gcra_fast base onekey gcra_core reservation_core
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
  local lr, lms = gcraLocalRate(s)
  return recordReserve(recordKey(), kind, label, n, ttl, function()
    return {1, gcraRemaining(s, s.d), 0, gcraResetAfter(s, s.d), s.b, nowUs, 0, lr, lms}
  end, function()
    local allowed, delay, retry, after = gcraTake(s, n, 0)
    if allowed == 1 then
      gcraStore(s, after)
    elseif s.stale then
      gcraStore(s, s.d)
    end
    return {allowed, gcraRemaining(s, after), retry, gcraResetAfter(s, after), s.b, nowUs, delay, lr, lms}, 0
  end)
end

if op == 'settle' then
  local s
  if ARGV[6] then s = gcraWithConfig(key, kind, nowUs, ARGV[6]) else s = gcraLoad(key, kind, nowUs) end
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
  return recordSettle(recordKey(), kind, label, actual, function(reserved, _, used)
    return gcraSettle(s, reserved, used)
  end)
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
