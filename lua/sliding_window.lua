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
local op, key = ARGV[1], KEYS[1]

-- makesSliding: the sliding window counter's helpers; slidingFastCall: a take, decided by
-- lib/sliding_window_fast.lua at the include line when it can be (see there), before the other
-- libraries' helpers are made.
local makesSliding = true
local slidingFastCall = op == 'take' and ARGV[3] == 'V' and ARGV[5] == '0'
-- include: sliding_window_fast base onekey sliding_window_core
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
  local retry = slidingWait(s, s.count, n)
  local allowed, count = 0, s.count
  if retry == 0 then allowed, count = 1, count + n end
  if op == 'take' and (allowed == 1 or s.stale) then slidingStore(s, count) end
  if op == 'peek' then count = s.count end
  return packDecision(allowed, slidingRemaining(s, count), retry, slidingResetAfter(s, count), s.l, nowUs, 0, s.l,
    s.windowMs)
end

if op == 'refund' then
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
  return slidingRemaining(s, slidingRefund(s, n))
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for sliding_window.lua')
