-- multi.lua: several one-key limiters (token bucket, GCRA, fixed window, sliding window counter,
-- calendar quota) and concurrency limits, any mix, decided in one call, all or nothing. MultiLimit
-- runs it. Each limit is computed by the same code as its own script (lua/lib/gcra_core.lua,
-- lua/lib/fixed_window_core.lua, lua/lib/sliding_window_core.lua, lua/lib/calendar_core.lua,
-- lua/lib/concurrency_core.lua): same layout, bounds, exactness.
--
-- KEYS: the limiters' keys, 1..32, distinct (the client also checks that they share one hash
-- slot). ARGV[1] the operation, ARGV[2] now in epoch µs or '' (TIME is read once: every limit
-- decides at the same instant), ARGV[3] the kinds, one byte per key in KEYS order ('T' token
-- bucket, 'G' GCRA, 'W' fixed window, 'V' sliding window counter, 'Q' calendar quota, 'C' concurrency limit:
-- lib/concurrency_core.lua's lease set). Every key is read and checked (Redis type, kind, configuration, state), and the permits
-- against every limit, before anything is written: a call that fails has written nothing, and its
-- error names the key.
-- Operations:
--   take n maxWaitUs   takes n permits from every limit, or from none; with maxWaitUs > 0, also
--                      ahead of time (a reservation) if all can take them within maxWaitUs. Writes
--                      when it takes; a denial writes only the states clamped after a clock step,
--                      or holding another configuration (below).
--   peek n             what `take n 0` would decide; writes nothing
--   refund n           gives n permits back to every limit (each as its own script's refund)
--   take n maxWaitUs cfg1..cfgk, peek n 0 cfg1..cfgk, refund n 0 cfg1..cfgk
--                      the limits in the call (Limiters of a policy that is not stored): cfgi is
--                      the configuration of KEYS[i] packed as its key's header (as gcra.lua and
--                      fixed_window.lua take it), or '' for the one stored in the key. Each limit
--                      follows its own script's rules: a key without a configuration is decided
--                      as a full (empty) limiter of cfgi, one holding cfgi as it is, one holding
--                      another configuration with cfgi, its permits in use (counts) kept; what
--                      writes writes cfgi with the state, and a take that denies writes every such
--                      key (the change applies from then on: the combined retryAfter is exact).
--                      A concurrency limit always has its cfgi: "limit:ttlMs" (nothing of it is
--                      stored). With one or more, take has the lease id at ARGV[6 + k] (32 lowercase
--                      hex digits, made by the client), and maxWait must be 0: a place cannot be
--                      taken ahead of time.
--                      A calendar quota always has its cfgi too (nothing of it is stored but its
--                      window and count): 'Q', unit, L (uint32), keepAlive ms (uint32), then its
--                      table of windows around the client's idea of now (lib/calendar_core.lua).
--                      Its permits are taken now or not at all (its next window is not booked
--                      ahead): with one, maxWait counts as 0. So does a sliding window counter's
--                      (cfgi its key's 13-byte header), which takes permits now or not at all.
--                      If the server's now is outside any
--                      calendar limit's table, the reply of every operation is that now as a bare
--                      INTEGER and nothing is written: the client recomputes the tables around it
--                      and calls once more.
--   renew id 0 cfg1..cfgk, release id 0 cfg1..cfgk
--                      every key a concurrency limit: a lease of a take, in all of them. renew: if
--                      it is live in every one, each expiry becomes now + its ttlMs; if it is not
--                      (expired in one, released), it is removed from every one (a lease is live
--                      only while live in all). release removes it from every one. Reply of renew
--                      {renewed, the soonest new expiry (0 if not renewed), nowUs}; of release
--                      {released (1 if it was live in every one), nowUs}.
--
-- The combined decision. Alone, a limit can take the n permits at the times (from now, if nobody
-- else takes any) of a set: [wait, inf) for GCRA and the token bucket, whole windows for the fixed
-- window (the current one if it has room, the next one if it has room, every later one), the
-- calendar quota's window in force if it has room, every time from its end on, and for the sliding
-- window counter [wait, inf) (its estimate only falls: lib/sliding_window_core.lua's slidingWait). E, the
-- earliest time at which all can, is the left end of one of these pieces, so it is the smallest
-- candidate (0, each GCRA's wait, each window's next start and the start of the one after, each
-- calendar window's end) that every limit accepts.
--   Granted iff E <= maxWait (cut to each GCRA's longest reservation W) and every fixed window can
--   count the permits at E (in its current or next window: it keeps no count further ahead).
--   Then every limit takes n at E, and delay = E: a GCRA takes them at the first instant that
--   rounds up to now + E whole µs, (E - 1) µs plus one unit (1/P' µs) after now (gcraAfterAt;
--   at now for E = 0), so TAT moves to max(TAT, now + (E - 1) µs + 1 unit) + n*T (exact in units
--   for the time the permits are used; as its own script when E is its own wait); a window counts
--   them in the window E falls in. A GCRA whose own wait is shorter than E thus holds, until
--   now + E, up to (E - its wait) / T permits more than a bucket with separate tokens would: one
--   stored time cannot say "free now, booked later".
--   Denied: retryAfter = the smallest r for which the same call made at now + r is granted, if
--   nobody else takes permits: max(E - maxWait, and for each fixed window that could not count
--   them, the first window start after now + E - 2 windows). Exact: at now + r - 1 µs it fails.
--   With only GCRA and token buckets and maxWait = 0 this is the largest of the denying limits'
--   own retryAfter; a fixed window can push it further (its next window full: the one after).
--   deniedBy = the limit whose own earliest time is the latest (the first of equals), 1-based.
--   A concurrency limit takes one place per call whatever n is (it counts calls in flight); its
--   earliest time is 0 if fewer than its limit are live (or the call's lease is live there: a take
--   sent twice), else until enough leases expire (lib/concurrency_core.lua's leaseWait). Granted,
--   it adds the lease with expiry now + ttlMs.
-- Reply of take and peek: {allowed, remaining, retryAfterUs, resetAfterUs, limit, nowUs, delayUs,
--   deniedBy (0 if allowed), then 7 per limit in KEYS order: allowedAlone, remaining,
--   retryAfterAloneUs, resetAfterUs, limit, localRate, localIntervalMs, then, if any limit is a
--   concurrency limit, the lease's expiry (the soonest of the limits'; 0 if denied or peek)}. A
--   concurrency limit's remaining and limit count places (leases), its resetAfter runs until its
--   last live lease expires, its localRate/localIntervalMs are limit per ttlMs.
--   Per limit: allowedAlone and retryAfterAlone are what its own script would answer to the same
--   call; remaining and resetAfter are its state after this call (permits taken only if granted).
--   Combined: remaining = the least of the limits' (what one call could take at once from all),
--   resetAfter = the longest (until all are full again), limit = the least (the most permits one
--   call can ever get from all).
-- Reply of refund: the remaining permits of each limit, in KEYS order (a concurrency limit: its
-- free places; a refund gives it nothing back: its place is freed by release).
-- Reserve, then settle (lib/reservation_core.lua's multi record; the record key is the LAST key,
-- after the k limits, in their slot):
--   reserve n ttlMs [cfg1..cfgk]
--                      `take n 0` (all or nothing, as decide) and, when it grants, ONE record of
--                      the n permits for every limit (each fixed window's start included) with a
--                      TTL of ttlMs, in this call. A record there already (of these limits, n
--                      permits): nothing is taken, the reply is the grant again as the limits are
--                      now. Reply: take's, then repeated (0 or 1).
--   settle actual 0 [cfg1..cfgk]
--                      an open record of r permits: every limit settles as its own script's
--                      settle does (gives back r - actual, or charges actual - r up to its debt
--                      rule), the record is marked settled with every answer. Reply {status (1 now,
--                      2 before: the stored answer, 0 no record), reserved, actual, then per limit
--                      returned, charged, unpaid, remaining}.
-- A decision across Redis Cluster slots (MultiLimit's slot by slot: one reserve per slot group, the
-- last group's record its commit) adds to reserve and settle, after the configurations (each
-- present, '' for a stored one):
--   reserve n ttlMs cfg1..cfgk holdMs member, with the group's pending set after the record key:
--                      a grant also adds `member` ("<id>:<n>") to the pending set with the score
--                      now + holdMs (ms), the set living ttlMs; a fence in the record key (see
--                      resolve) denies, nothing taken, `repeated` 2. The reply then lists the
--                      members (at most 4) whose hold has ended (score <= now): decisions whose
--                      caller went away before settling them, for the caller to resolve.
--   reserve n ttlMs cfg1..cfgk, the last group's: as reserve; a fence denies as above.
--   settle actual 0 cfg1..cfgk keepMs [member], [the pending set after the record key]: as settle;
--                      the record keeps at most keepMs of its TTL, and `member` leaves the pending
--                      set whether or not a record was found.
--   resolve ttlMs      KEYS[1] a last group's record key: 1 if that decision's last group granted
--                      (its record is there), else 0, having written a fence there for ttlMs (or
--                      found one): the decision's reserve, if it comes late, will deny. Its earlier
--                      groups' grants are then settled (resolve 1: actual n, nothing given back) or
--                      given back (0) by whoever resolved it.

-- The libraries' helpers this call makes (each is a closure made anew on every call): those of the
-- kinds in the call and, for reserve and settle, the records'. A MultiLimit of GCRA limits makes
-- none of the fixed window's, calendar's or lease set's. Kinds are checked below, before any helper
-- is used.
local kindBytes = ARGV[3]
if type(kindBytes) ~= 'string' then kindBytes = '' end
local makesGcra = string.find(kindBytes, '[TG]') ~= nil
local makesWindow = string.find(kindBytes, 'W', 1, true) ~= nil
local makesSliding = string.find(kindBytes, 'V', 1, true) ~= nil
local makesCalendar = string.find(kindBytes, 'Q', 1, true) ~= nil
local makesLeases = string.find(kindBytes, 'C', 1, true) ~= nil
local makesRecords = ARGV[1] == 'reserve' or ARGV[1] == 'settle' or ARGV[1] == 'resolve'
local slidingFastCall = false                  -- lib/sliding_window_fast.lua: its arithmetic only
-- include: sliding_window_fast base onekey gcra_core fixed_window_core sliding_window_core reservation_core concurrency_core calendar_core
local MAX_LIMITS = 32
local op = ARGV[1]
local k = #KEYS

-- resolve ttlMs: see the header.
if op == 'resolve' then
  local ttl = countArg(ARGV[4], 1, MAX_RECORD_TTL_MS, 'record TTL (ms)', KEYS[1])
  if k ~= 1 then fail('REDLIMIT_INVALID_ARGUMENT', 'resolve takes one record key') end
  local v = multiRecordValue(KEYS[1], KEYS[1])
  if v and v ~= MULTI_FENCE then return 1 end
  if not v then multiRecordFence(KEYS[1], ttl) end
  return 0
end

local rkey = nil                               -- reserve and settle: the record key, after the limits
local pkey = nil                               -- across slots: the slot group's pending set, after it
if op == 'reserve' or op == 'settle' then
  k = #kindBytes
  rkey, pkey = KEYS[k + 1], KEYS[k + 2]
  if #KEYS > k + 2 then fail('REDLIMIT_INVALID_ARGUMENT', op .. ' takes the limits, a record and a pending set') end
  if string.find(ARGV[3] or '', '[^TGWVQ]') then  -- the record holds what these kinds give back
    fail('REDLIMIT_INVALID_ARGUMENT', 'reserve and settle take token bucket, GCRA, fixed window, sliding window and ' ..
      'calendar limits only')
  end
end
if k < 1 or k > MAX_LIMITS then
  fail('REDLIMIT_INVALID_ARGUMENT', 'a multi-limit decides 1..' .. MAX_LIMITS .. ' limits, got ' .. k)
end
local kinds = ARGV[3]
if type(kinds) ~= 'string' or #kinds ~= k then
  fail('REDLIMIT_INVALID_ARGUMENT', 'multi.lua needs one kind byte per key')
end
local owner = table.concat(KEYS, ' + ', 1, math.max(k, 0))
local seen = {}
for i = 1, k do
  if seen[KEYS[i]] then
    fail('REDLIMIT_INVALID_ARGUMENT', 'key ' .. KEYS[i] .. ' appears twice in a multi-limit')
  end
  seen[KEYS[i]] = true
  local c = string.sub(kinds, i, i)
  if c ~= 'T' and c ~= 'G' and c ~= 'W' and c ~= 'V' and c ~= 'Q' and c ~= 'C' then
    fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind "' .. c .. '" for key ' .. KEYS[i])
  end
end
local nowUs = currentMicros(ARGV[2])
local leases = string.find(kinds, 'C', 1, true) ~= nil

-- A concurrency limit's configuration in the call, "limit:ttlMs": limit, ttlMs.
local function leaseConfig(key, cfg)
  if cfg == nil or cfg == '' then
    fail('REDLIMIT_INVALID_ARGUMENT', 'concurrency limit ' .. key .. ' needs its limit and lease TTL in the call')
  end
  local l, ttl = string.match(cfg, '^(%d+):(%d+)$')
  return countArg(l, 1, MAX_U32, 'limit', key), countArg(ttl, 1, MAX_U32, 'lease TTL (ms)', key)
end

-- Every limit, loaded and checked before anything is written: with the configuration in the call
-- (ARGV[5 + i], when not '') or the stored one. nil when the server's now is outside a calendar
-- limit's table (every limit checked first: a bad call fails as it would).
local function loadAll(leaseId)
  local all, outside = {}, false
  for i = 1, k do
    local kind = string.sub(kinds, i, i)
    local cfg = ARGV[5 + i]
    if cfg == '' then cfg = nil end
    if kind == 'Q' then
      all[i] = calendarWithConfig(KEYS[i], nowUs, cfg)
      if not all[i] then outside, all[i] = true, {} end
    elseif kind == 'C' then
      local s = leaseLoad(KEYS[i], nowUs, leaseId)
      s.lease, s.limit, s.ttl = true, leaseConfig(KEYS[i], cfg)
      all[i] = s
    elseif kind == 'W' then
      if cfg then all[i] = windowWithConfig(KEYS[i], nowUs, cfg) else all[i] = windowLoad(KEYS[i], nowUs) end
    elseif kind == 'V' then
      if cfg then all[i] = slidingWithConfig(KEYS[i], nowUs, cfg) else all[i] = slidingLoad(KEYS[i], nowUs) end
      all[i].sliding = true
    elseif cfg then
      all[i] = gcraWithConfig(KEYS[i], kind, nowUs, cfg)
    else
      all[i] = gcraLoad(KEYS[i], kind, nowUs)
    end
    all[i].window = kind == 'W'
  end
  if outside then return nil end
  return all
end

-- reserve n ttlMs [cfg1..cfgk]: `take n 0` and, when it grants, the record (both in this call),
-- by the take branch below (finishReserve); a record there already: its `peek`, answered as the
-- grant again (finishReserve). See the reserve operation in the header.
local reserving = nil
if op == 'reserve' then
  if not rkey then fail('REDLIMIT_INVALID_ARGUMENT', 'reserve needs the record key as the last key') end
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', owner)
  local ttl = countArg(ARGV[5], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', owner)
  local r = multiRecordRead(rkey, KEYS, k, kinds, owner)
  if r and r.state ~= 'A' and r.reserved ~= n then
    fail('REDLIMIT_INVALID_ARGUMENT', 'reservation ' .. rkey .. ' holds ' .. r.reserved .. ' permits, not ' .. n ..
      ': a reservation id names one reservation')
  end
  reserving = {ttl = ttl, n = n, repeated = r ~= nil, fenced = r ~= nil and r.state == 'A'}
  if pkey then                                 -- read (and type-checked) before anything is written
    reserving.hold = countArg(ARGV[6 + k], 1, MAX_RECORD_TTL_MS, 'hold (ms)', owner)
    reserving.member = ARGV[7 + k]
    if type(reserving.member) ~= 'string' or reserving.member == '' then
      fail('REDLIMIT_INVALID_ARGUMENT', 'a reserve across slots needs its pending member')
    end
    reserving.nowMs = math.floor(nowUs / 1000)
    reserving.ended = redis.call('ZRANGEBYSCORE', pkey, '-inf', reserving.nowMs, 'LIMIT', 0, 4)
  end
  if r then op = 'peek' else op = 'take' end
  ARGV[5] = '0'                                -- take's maxWait: now or not at all
end

-- The reply of a reserve, from the take (or peek) branch's reply: the record written when granted,
-- then `repeated` (0 or 1) appended.
local function finishReserve(reply, all)
  if reserving.ended then                      -- across slots: the pending members whose hold ended
    local ended = reserving.ended
    reserving.ended = nil
    reply = finishReserve(reply, all)
    for i = 1, #ended do reply[#reply + 1] = ended[i] end
    return reply
  end
  if reserving.fenced then                     -- given up by a resolve: denied, nothing taken
    reply[1], reply[7], reply[8] = 0, 0, 0
    reply[#reply + 1] = 2
    return reply
  end
  if reserving.repeated then                   -- the first grant again, as the limits are now
    reply[1], reply[3], reply[7], reply[8] = 1, 0, 0, 0
    for i = 1, k do
      local base = 8 + 7 * (i - 1)
      reply[base + 1], reply[base + 3] = 1, 0
    end
    reply[#reply + 1] = 1
    return reply
  end
  if reply[1] == 1 then
    local limits = {}
    for i = 1, k do
      local start = 0
      if all[i].window or all[i].sliding or all[i].calendar then start = all[i].start end  -- maxWait 0: counted now
      limits[i] = {start = start, returned = 0, charged = 0, unpaid = 0, remaining = 0}
    end
    redis.call('SET', rkey, multiRecordPack(KEYS, k, kinds, 'O', reserving.n, 0, limits), 'PX', reserving.ttl)
    if reserving.member then
      redis.call('ZADD', pkey, reserving.nowMs + reserving.hold, reserving.member)
      redis.call('PEXPIRE', pkey, reserving.ttl)
    end
  end
  reply[#reply + 1] = 0
  return reply
end

if op == 'take' or op == 'peek' then
  local n = countArg(ARGV[4], 1, MAX_U32, 'permits', owner)
  local maxWait = 0
  if op == 'take' then maxWait = countArg(ARGV[5], 0, 1e14 - 1, 'maxWait', owner) end
  local leaseId = nil
  if leases then
    if maxWait > 0 then
      fail('REDLIMIT_INVALID_ARGUMENT', 'a concurrency limit cannot be taken ahead of time (maxWait must be 0) in ' ..
        owner)
    end
    if op == 'take' then leaseId = leaseIdArg(ARGV[6 + k], owner) end
  end
  local all = loadAll(leaseId)
  if not all then return nowUs end             -- outside a calendar table: asked again around nowUs
  local maxWaitAll = maxWait                   -- cut to every GCRA's longest reservation, 0 by a calendar
  for i = 1, k do
    local s = all[i]
    if s.calendar then
      calendarCheckPermits(s, n)
      maxWaitAll = 0
    elseif s.lease then
      s.held = leaseHeld(s)
      s.latest = leaseLatestBut(s, nil)
      if leaseLive(s) then s.wait = 0 else s.wait = leaseWait(s, s.held, s.limit) end
    elseif s.window then
      windowCheckPermits(s, n)
    elseif s.sliding then
      slidingCheckPermits(s, n)
      maxWaitAll = 0
    else
      gcraCheckPermits(s, n)
      if maxWaitAll > s.maxWait then maxWaitAll = s.maxWait end
    end
  end

  -- Each limit alone: its own answer, its earliest time, and the candidates for E.
  local candidates = {0}
  local latest, deniedBy = -1, 0
  for i = 1, k do
    local s = all[i]
    local earliest
    if s.calendar then
      local ok, _, retryAlone = calendarTake(s, n)
      s.ownAllowed, s.ownRetry = ok, retryAlone
      local wait = s.finish - nowUs
      candidates[#candidates + 1] = wait
      if ok == 1 then earliest = 0 else earliest = wait end
    elseif s.lease then
      earliest = s.wait
      s.ownRetry = earliest
      if earliest == 0 then s.ownAllowed = 1 else s.ownAllowed = 0 end
      candidates[#candidates + 1] = earliest
    elseif s.window then
      local ok, _, retryAlone = windowTake(s, n, maxWait)
      s.ownAllowed, s.ownRetry = ok, retryAlone
      local wait = s.nextStart - nowUs
      candidates[#candidates + 1] = wait
      candidates[#candidates + 1] = wait + s.wus
      if s.count + n <= s.l then
        earliest = 0
      elseif s.nextCount + n <= s.l then
        earliest = wait
      else
        earliest = wait + s.wus
      end
    elseif s.sliding then
      s.wait = slidingWait(s, s.count, n)
      earliest, s.ownRetry = s.wait, s.wait
      if earliest == 0 then s.ownAllowed = 1 else s.ownAllowed = 0 end
      candidates[#candidates + 1] = earliest
    else
      local ok, _, retryAlone = gcraTake(s, n, maxWait)
      s.ownAllowed, s.ownRetry = ok, retryAlone
      earliest = gcraWait(s, n)
      candidates[#candidates + 1] = earliest
    end
    if earliest > latest then latest, deniedBy = earliest, i end
  end
  table.sort(candidates)
  local e = nil
  for c = 1, #candidates do
    local t = candidates[c]
    local fits = true
    for i = 1, k do
      local s = all[i]
      if s.calendar then
        fits = t >= s.finish - nowUs or s.count + n <= s.l
      elseif s.lease or s.sliding then
        fits = t >= s.wait
      elseif s.window then
        fits = windowFitsAt(s, n, t)
      else
        fits = t >= gcraWait(s, n)
      end
      if not fits then break end
    end
    if fits then
      e = t
      break
    end
  end
  -- e exists: the largest candidate is accepted by every limit.

  local retry = e - maxWaitAll
  if retry < 0 then retry = 0 end
  for i = 1, k do
    local s = all[i]
    if s.window and e >= s.nextStart - nowUs + s.wus then
      local q = floorDiv(nowUs + e - 2 * s.wus, s.wus)
      local r = (q + 1) * s.wus - nowUs        -- from then on, now + e is at most the next window
      if r > retry then retry = r end
    end
  end
  local allowed, delay = 0, 0
  if retry == 0 then allowed, delay, deniedBy = 1, e, 0 end
  -- A stale state (clamped after a clock step, or another configuration kept under the one in the
  -- call: lib/gcra_core.lua, lib/fixed_window_core.lua) is written back by a take that denies; one
  -- that grants writes every limit below anyway.
  if allowed == 0 and op == 'take' then
    for i = 1, k do
      local s = all[i]
      if s.stale and s.window then windowStore(s, s.count, s.nextCount)
      elseif s.stale and s.sliding then slidingStore(s, s.count)
      elseif s.stale then gcraStore(s, s.d) end
    end
  end

  -- Each limit's state after the call: written only when granted (take).
  local reply = {allowed, 0, retry, 0, 0, nowUs, delay, deniedBy}
  local remaining, resetAfter, limit = nil, 0, nil
  local leaseExpiry = 0                        -- the lease's: the soonest of the limits'
  for i = 1, k do
    local s = all[i]
    local rem, reset, lim, lr, lms
    if s.calendar then
      local count = s.count
      if allowed == 1 then                     -- E = 0 (maxWait 0): counted in the window in force
        count = count + n
        if op == 'take' then calendarStore(s, count) end
      end
      if op == 'peek' then count = s.count end
      rem, reset, lim, lr, lms = s.l - count, calendarResetAfter(s, count), s.l, s.l, calendarWindowMs(s)
    elseif s.lease then
      local held, latest = s.held, s.latest
      if allowed == 1 and op == 'take' then
        local expiry = s.own
        if not leaseLive(s) then           -- a take sent twice finds its lease live: nothing to add
          expiry, held = nowUs + s.ttl * 1000, held + 1
          if expiry > latest then latest = expiry end
          leasePut(s, leaseId, expiry, latest)
        end
        if leaseExpiry == 0 or expiry < leaseExpiry then leaseExpiry = expiry end
      end
      rem, lim, lr, lms = s.limit - held, s.limit, s.limit, s.ttl
      if rem < 0 then rem = 0 end
      reset = 0
      if latest > nowUs then reset = latest - nowUs end
    elseif s.window then
      local count, nextCount = s.count, s.nextCount
      if allowed == 1 then
        if e < s.nextStart - nowUs then count = count + n else nextCount = nextCount + n end
        if op == 'take' then windowStore(s, count, nextCount) end
      end
      if op == 'peek' then count, nextCount = s.count, s.nextCount end
      rem, reset, lim, lr, lms = s.l - count, windowResetAfter(s, count, nextCount), s.l, s.l, s.windowMs
    elseif s.sliding then
      local count = s.count
      if allowed == 1 then                     -- E = 0 (maxWait 0): counted now
        count = count + n
        if op == 'take' then slidingStore(s, count) end
      end
      if op == 'peek' then count = s.count end
      rem, reset, lim, lr, lms = slidingRemaining(s, count), slidingResetAfter(s, count), s.l, s.l, s.windowMs
    else
      local after = s.d
      if allowed == 1 and op == 'take' then
        after = gcraAfterAt(s, n, e)
        gcraStore(s, after)
      end
      rem, reset, lim = gcraRemaining(s, after), gcraResetAfter(s, after), s.b
      lr, lms = gcraLocalRate(s)
    end
    if remaining == nil or rem < remaining then remaining = rem end
    if reset > resetAfter then resetAfter = reset end
    if limit == nil or lim < limit then limit = lim end
    local base = #reply
    reply[base + 1] = s.ownAllowed
    reply[base + 2] = rem
    reply[base + 3] = s.ownRetry
    reply[base + 4] = reset
    reply[base + 5] = lim
    reply[base + 6] = lr
    reply[base + 7] = lms
  end
  reply[2], reply[4], reply[5] = remaining, resetAfter, limit
  if reserving then return finishReserve(reply, all) end
  if leases then reply[#reply + 1] = leaseExpiry end
  return reply
end

if op == 'refund' then
  local n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', owner)
  local all = loadAll()
  if not all then return nowUs end
  local reply = {}
  for i = 1, k do
    local s = all[i]
    if s.calendar then
      reply[i] = s.l - calendarRefund(s, n)
    elseif s.lease then
      reply[i] = s.limit - leaseHeld(s)
      if reply[i] < 0 then reply[i] = 0 end
    elseif s.window then
      reply[i] = s.l - windowRefund(s, n)
    elseif s.sliding then
      reply[i] = slidingRemaining(s, slidingRefund(s, n))
    else
      reply[i] = gcraRemaining(s, gcraRefund(s, n))
    end
  end
  return reply
end

if op == 'settle' then
  if not rkey then fail('REDLIMIT_INVALID_ARGUMENT', 'settle needs the record key as the last key') end
  local actual = countArg(ARGV[4], 0, MAX_U32, 'actual permits', owner)
  local keep = nil                             -- across slots: the most of its TTL the record keeps
  if ARGV[6 + k] and ARGV[6 + k] ~= '' then keep = countArg(ARGV[6 + k], 1, MAX_RECORD_TTL_MS, 'keep (ms)', owner) end
  local member = ARGV[7 + k]
  if pkey and (type(member) ~= 'string' or member == '') then
    fail('REDLIMIT_INVALID_ARGUMENT', 'a settle across slots needs its pending member')
  end
  local all = loadAll()
  if not all then return nowUs end
  local r = multiRecordRead(rkey, KEYS, k, kinds, owner)
  if pkey then redis.call('ZREM', pkey, member) end
  if not r or r.state == 'A' then return multiRecordUnknown(k) end
  if r.state == 'S' then return multiRecordAnswer(r, k) end
  -- Everything is read and checked: from here on every limit settles.
  for i = 1, k do
    local s, l = all[i], r.limits[i]
    if s.window then
      l.returned, l.charged, l.unpaid, l.remaining = windowSettle(s, r.reserved, l.start, actual)
    elseif s.sliding then
      l.returned, l.charged, l.unpaid, l.remaining = slidingSettle(s, r.reserved, l.start, actual)
    elseif s.calendar then
      l.returned, l.charged, l.unpaid, l.remaining = calendarSettle(s, r.reserved, l.start, actual)
    else
      l.returned, l.charged, l.unpaid, l.remaining = gcraSettle(s, r.reserved, actual)
    end
  end
  local packed = multiRecordPack(KEYS, k, kinds, 'S', r.reserved, actual, r.limits)
  local ttl = redis.call('PTTL', rkey)
  if keep and (ttl <= 0 or ttl > keep) then ttl = keep end
  if ttl > 0 then redis.call('SET', rkey, packed, 'PX', ttl) else redis.call('SET', rkey, packed) end
  r.actual = actual
  local reply = multiRecordAnswer(r, k)
  reply[1] = 1
  return reply
end

if op == 'renew' or op == 'release' then
  if string.find(kinds, '[^C]') then
    fail('REDLIMIT_INVALID_ARGUMENT', op .. ' takes concurrency limits only, got kinds ' .. kinds)
  end
  local id = leaseIdArg(ARGV[4], owner)
  local all = loadAll(id)
  local live = true
  for i = 1, k do
    if not leaseLive(all[i]) then live = false end
  end
  -- Everything is read and checked: from here on every limit writes.
  if op == 'renew' and live then
    local soonest = 0
    for i = 1, k do
      local s = all[i]
      local expiry = nowUs + s.ttl * 1000
      local latest = leaseLatestBut(s, id)
      if expiry > latest then latest = expiry end
      leasePut(s, id, expiry, latest, 'XX')
      if soonest == 0 or expiry < soonest then soonest = expiry end
    end
    return {1, soonest, nowUs}
  end
  for i = 1, k do                              -- released, or no longer live in every limit: gone from all
    local s = all[i]
    leaseFinish(s, leaseLatestBut(s, id), s.own and id)
  end
  if op == 'renew' then return {0, 0, nowUs} end
  if live then return {1, nowUs} end
  return {0, nowUs}
end

fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for multi.lua')
