-- sliding_window.lua: the sliding-window counter, about L permits per sliding window of W ms (the
-- previous fixed window's count weighted by its overlap). A Limiter of Policy::slidingWindow (kind
-- 'V') runs it. The algorithm, its exact arithmetic, worst case, layout (28 bytes) and TTL are
-- described in lua/lib/sliding_window_core.lua, which multi.lua shares.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '', ARGV[3] the kind 'V'):
--   take n maxWaitUs [cfg]
--                      takes n permits if the estimate leaves room for them now (maxWaitUs must
--                      be 0: permits are taken now or not at all). Writes when it takes; a
--                      denial writes only a state that is stale (a clamped window, another
--                      configuration kept under cfg).
--   peek n 0 [cfg]     what `take n 0` would decide; writes nothing
--   refund n 0 [cfg]   gives n permits back to the current window (its count does not go below 0)
--   cfg (ARGV[6]): the caller's configuration packed as the key's first 13 bytes ('V', L, W ms,
--   keepAlive ms); without it the key must hold one (NotInitialized otherwise). See
--   slidingWithConfig for a key holding another configuration.
-- Reply of take and peek: ONE 65-byte string (lib/onekey.lua's packDecision): allowed, remaining
--   (what one more call could take now), retryAfterUs (exact: when the same call fits if nobody
--   else takes permits), resetAfterUs (until no permit is counted), L, nowUs, delay 0, L, W ms.
-- Reply of refund: the remaining permits.
--   reserve n ttlMs [cfg]
--                      KEYS[2] the record key (lib/reservation_core.lua): `take n 0` and, when it
--                      grants, an open record of n permits and the window they were counted in,
--                      with a TTL of ttlMs, in the same call. A record there already: nothing is
--                      taken, the reply is the grant again as the counter is now. Reply: take's
--                      values as an array, then repeated (0 or 1).
--   settle actual 0 [cfg]
--                      KEYS[2] the record key. An open record of r permits: gives back r - actual
--                      to the window they were counted in while it still counts, or counts
--                      actual - r more in the current window up to L (the rest is unpaid)
--                      (slidingSettle), and marks the record settled with the answer. Reply as
--                      fixed_window.lua's.
local op, key = ARGV[1], KEYS[1]

-- makesSliding: the sliding window counter's helpers; slidingFastCall: a take, decided by
-- lib/sliding_window_fast.lua at the include line when it can be (see there), before the other
-- libraries' helpers are made.
local makesSliding, makesRecords = true, op == 'reserve' or op == 'settle'
local slidingFastCall = op == 'take' and ARGV[3] == 'V' and ARGV[5] == '0'
-- include: sliding_window_fast base onekey sliding_window_core reservation_core
if ARGV[3] ~= 'V' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for sliding_window.lua') end
local nowUs = currentMicros(ARGV[2])

local s
if ARGV[6] then s = slidingWithConfig(key, nowUs, ARGV[6]) else s = slidingLoad(key, nowUs) end

if op == 'take' or op == 'peek' then
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  slidingCheckPermits(s, n)
  if op == 'take' and countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', key) > 0 then
    fail('REDLIMIT_INVALID_ARGUMENT', 'a ' .. SLIDING_LABEL .. ' takes permits now or not at all (maxWait must be 0)')
  end
  local allowed, retry, count = slidingTake(s, n)
  if op == 'take' and (allowed == 1 or s.stale) then slidingStore(s, count) end
  if op == 'peek' then count = s.count end
  return packDecision(allowed, slidingRemaining(s, count), retry, slidingResetAfter(s, count), s.l, nowUs, 0, s.l,
    s.windowMs)
end

if op == 'refund' then
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return slidingRemaining(s, slidingRefund(s, n))
end

if op == 'reserve' then
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
  slidingCheckPermits(s, n)
  local ttl = countArg(ARGV[5], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', key)
  return recordReserve(recordKey(), 'V', SLIDING_LABEL, n, ttl, function()
    return {1, slidingRemaining(s, s.count), 0, slidingResetAfter(s, s.count), s.l, nowUs, 0, s.l, s.windowMs}
  end, function()
    local allowed, retry, count = slidingTake(s, n)
    if allowed == 1 or s.stale then slidingStore(s, count) end
    return {allowed, slidingRemaining(s, count), retry, slidingResetAfter(s, count), s.l, nowUs, 0, s.l, s.windowMs},
      s.start
  end)
end

if op == 'settle' then
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
  return recordSettle(recordKey(), 'V', SLIDING_LABEL, actual, function(reserved, start, used)
    return slidingSettle(s, reserved, start, used)
  end)
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for sliding_window.lua')
