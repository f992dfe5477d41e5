-- lib/reservation_core.lua: the records of reserve-then-settle, for gcra.lua, fixed_window.lua and
-- sliding_window.lua.
-- `reserve` takes permits as `take n 0` does and, when it grants, writes a record of them in
-- KEYS[2] (the client derives that key from the limiter's name and the reservation id so that it
-- shares the limiter's hash slot); `settle` reads it once: an open record is settled (permits given
-- back or charged) and marked settled with its answer, a settled one answers that answer again and
-- changes nothing, a missing one (never reserved, or expired) changes nothing. Both are one script
-- call: the grant and its record, or the give-back and the mark, are written together or not at all.
--
-- Record layout (34 bytes, struct.pack little-endian): 'R', the limiter's kind byte, the state
--   'O' (open) or 'S' (settled), reserved permits (uint32, >= 1), the window's start (µs, uint56)
--   the grant was counted in (a fixed or sliding window's; 0 for the token bucket and GCRA), then once settled: actual,
--   returned, charged, unpaid, remaining (uint32 each; 0 while open).
-- TTL: the one reserve was given (ms); a settle keeps what is left of it.
local RECORD_LAYOUT = '<c1c1c1I4I7I4I4I4I4I4'
local RECORD_SIZE = 34
local MAX_RECORD_TTL_MS = 604800000        -- 7 days, detail::kMaxReservationTtl
local RECORD_UNKNOWN = {0, 0, 0, 0, 0, 0, 0} -- the reply of a settle that found no record

-- The record of a MultiLimit's reservation (multi.lua): ONE key for every limit of the decision,
-- in their hash slot (the client derives it from the first limit's name: <name>:mrsv:<id>). It
-- names the limits, so a settle through another MultiLimit (other keys, kinds or order) is
-- refused, and keeps each limit's fixed window start and, once settled, each limit's answer.
-- Layout (struct.pack little-endian): 'R', 'M', the state 'O' or 'S', reserved (uint32, >= 1),
--   actual (uint32; 0 while open), the number of limits k (uint8, 1..32), then per limit in KEYS
--   order: its kind byte, the fixed window's start (µs, uint56; 0 for the token bucket and GCRA),
--   returned, charged, unpaid, remaining (uint32 each; 0 while open), the length of its key
--   (uint16) and the key. TTL as the one-key record's.
-- A fence is a multi record of state 'A' (aborted), reserved 1, actual 0 and no limit (the head
--   alone): a decision across Cluster slots that was given up (multi.lua's resolve wrote it where
--   that decision's last slot group would have recorded its grant), so that its reserve, if it
--   comes late, denies.
local MULTI_HEAD = '<c1c1c1I4I4B'
local MULTI_HEAD_SIZE = 12
local MULTI_LIMIT = '<c1I7I4I4I4I4I2'
local MULTI_LIMIT_SIZE = 27
local MULTI_FENCE = 'RMA\1\0\0\0\0\0\0\0\0'  -- a fence: MULTI_HEAD of 'R', 'M', 'A', 1, 0, 0

-- The helpers below are made only if `makesRecords` is true: a local that a script which includes this
-- file sets above its `-- include:` line. A function is a closure made anew on every call
-- (cmake/EmbedLua.cmake), so a script makes only the groups it uses; the others stay nil.
local recordKey, recordRead, recordCheckRepeat, recordOpen, recordClose, recordAnswer, recordReserve, recordSettle,
  multiRecordRead,
  multiRecordPack, multiRecordAnswer, multiRecordUnknown, multiRecordValue, multiRecordFence
if makesRecords then
  -- The record key, KEYS[2]; fails with REDLIMIT_INVALID_ARGUMENT if the call did not pass one.
  function recordKey()
    local rkey = KEYS[2]
    if not rkey then fail('REDLIMIT_INVALID_ARGUMENT', 'reserve and settle need the record key as KEYS[2]') end
    return rkey
  end

  -- The record in `rkey` as a table, nil if the key does not exist. Anything redlimit did not write
  -- there, or a record of another kind of limiter, fails with REDLIMIT_INVALID_STATE naming the key:
  -- nothing has been written yet.
  function recordRead(rkey, kind, label)
    local v = redis.pcall('GET', rkey)
    if type(v) == 'table' and v.err then
      if string.find(v.err, 'WRONGTYPE', 1, true) then
        fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' of ' .. label .. ' ' .. KEYS[1] ..
          ' holds another Redis type (another program wrote it); delete it')
      end
      error(v)
    end
    if not v then return nil end
    local bad = #v ~= RECORD_SIZE
    local r = nil
    if not bad then
      local tag, k, state, reserved, start, actual, returned, charged, unpaid, remaining =
        struct.unpack(RECORD_LAYOUT, v)
      r = {kind = k, state = state, reserved = reserved, start = start, actual = actual, returned = returned,
           charged = charged, unpaid = unpaid, remaining = remaining}
      bad = tag ~= 'R' or (state ~= 'O' and state ~= 'S') or reserved < 1 or start >= TWO52 * 2
    end
    if bad then
      fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' of ' .. label .. ' ' .. KEYS[1] ..
        ' holds a value redlimit did not write; delete it')
    end
    if r.kind ~= kind then
      fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' belongs to another kind of limiter, not to ' ..
        label .. ' ' .. KEYS[1] .. '; delete it or use another reservation id')
    end
    return r
  end

  -- Fails with REDLIMIT_INVALID_ARGUMENT if the open or settled record `r` holds other permits than a
  -- repeated reserve asks for (the id was used for another reservation).
  function recordCheckRepeat(r, rkey, n)
    if r.reserved ~= n then
      fail('REDLIMIT_INVALID_ARGUMENT', 'reservation ' .. rkey .. ' holds ' .. r.reserved .. ' permits, not ' .. n ..
        ': a reservation id names one reservation')
    end
  end

  -- Writes a new open record of n permits (counted in the window starting at `start`, or 0).
  function recordOpen(rkey, kind, n, start, ttlMs)
    redis.call('SET', rkey, struct.pack(RECORD_LAYOUT, 'R', kind, 'O', n, start, 0, 0, 0, 0, 0), 'PX', ttlMs)
  end

  -- Marks the record `r` settled with its answer, keeping what is left of its TTL.
  function recordClose(rkey, r, actual, returned, charged, unpaid, remaining)
    local packed = struct.pack(RECORD_LAYOUT, 'R', r.kind, 'S', r.reserved, r.start, actual, returned, charged, unpaid,
      remaining)
    local ttl = redis.call('PTTL', rkey)
    if ttl > 0 then
      redis.call('SET', rkey, packed, 'PX', ttl)
    else
      redis.call('SET', rkey, packed)
    end
  end

  -- The reply of a settle that found `r` settled already (status 2), and of one that found nothing.
  function recordAnswer(r)
    return {2, r.reserved, r.actual, r.returned, r.charged, r.unpaid, r.remaining}
  end

  -- A one-key script's reserve of n permits under the record `rkey` of a `kind` limiter (`label` in
  -- messages), for ttlMs: a record there already (of n permits) takes nothing and answers again()'s
  -- reply, the grant as the limiter is now; else take() takes them as `take n 0` does (and stores
  -- the state) and returns its reply and the window's start they were counted in (0 without one),
  -- and a grant opens the record in the same call. The reply ends with repeated (1 or 0).
  function recordReserve(rkey, kind, label, n, ttlMs, again, take)
    local r = recordRead(rkey, kind, label)
    if r then
      recordCheckRepeat(r, rkey, n)
      local reply = again()
      reply[#reply + 1] = 1
      return reply
    end
    local reply, start = take()
    if reply[1] == 1 then recordOpen(rkey, kind, n, start, ttlMs) end
    reply[#reply + 1] = 0
    return reply
  end

  -- A one-key script's settle of `actual` permits under the record `rkey` of a `kind` limiter
  -- (`label` in messages): an open record is settled by settle(reserved, start, actual), which gives
  -- permits back or charges them and returns returned, charged, unpaid, remaining, and is marked
  -- settled with that answer; a settled record answers it again and changes nothing; no record
  -- changes nothing (RECORD_UNKNOWN). Returns settle's reply {status, reserved, actual, returned,
  -- charged, unpaid, remaining}.
  function recordSettle(rkey, kind, label, actual, settle)
    local r = recordRead(rkey, kind, label)
    if not r then return RECORD_UNKNOWN end
    if r.state == 'S' then return recordAnswer(r) end
    local returned, charged, unpaid, remaining = settle(r.reserved, r.start, actual)
    recordClose(rkey, r, actual, returned, charged, unpaid, remaining)
    return {1, r.reserved, actual, returned, charged, unpaid, remaining}
  end

  -- The string in the multi record key `rkey`, or nil; another Redis type fails naming `owner`.
  function multiRecordValue(rkey, owner)
    local v = redis.pcall('GET', rkey)
    if type(v) == 'table' and v.err then
      if string.find(v.err, 'WRONGTYPE', 1, true) then
        fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' of MultiLimit ' .. owner ..
          ' holds another Redis type (another program wrote it); delete it')
      end
      error(v)
    end
    return v or nil
  end

  -- Writes a fence in `rkey` (which holds nothing) for ttlMs.
  function multiRecordFence(rkey, ttlMs)
    redis.call('SET', rkey, MULTI_FENCE, 'PX', ttlMs)
  end

  -- The multi record in `rkey` as a table {state, reserved, actual, limits = {{kind, start, returned,
  -- charged, unpaid, remaining}...}}, nil if the key does not exist, {state = 'A'} for a fence.
  -- keys[1..k] and kinds are the caller's limits. Anything redlimit did not write fails with
  -- REDLIMIT_INVALID_STATE, and so does a record of a one-key limiter or of another MultiLimit (other
  -- limits): nothing has been written.
  function multiRecordRead(rkey, keys, k, kinds, owner)
    local v = multiRecordValue(rkey, owner)
    if not v then return nil end
    if v == MULTI_FENCE then return {state = 'A'} end
    local function corrupt()
      fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' of MultiLimit ' .. owner ..
        ' holds a value redlimit did not write; delete it')
    end
    if #v < MULTI_HEAD_SIZE then corrupt() end
    local tag, rk, state, reserved, actual, count, pos = struct.unpack(MULTI_HEAD, v)
    if tag ~= 'R' then corrupt() end
    if rk ~= 'M' then
      if #v == RECORD_SIZE then
        fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' belongs to a one-key limiter, not to ' ..
          'MultiLimit ' .. owner .. '; delete it or use another reservation id')
      end
      corrupt()
    end
    if (state ~= 'O' and state ~= 'S') or reserved < 1 or count < 1 or count > 32 then corrupt() end
    local r = {state = state, reserved = reserved, actual = actual, limits = {}}
    local same = count == k
    for i = 1, count do
      if pos + MULTI_LIMIT_SIZE - 1 > #v then corrupt() end
      local kind, start, returned, charged, unpaid, remaining, len, nextPos = struct.unpack(MULTI_LIMIT, v, pos)
      if start >= TWO52 * 2 or nextPos + len - 1 > #v then corrupt() end
      local name = string.sub(v, nextPos, nextPos + len - 1)
      pos = nextPos + len
      r.limits[i] = {kind = kind, start = start, returned = returned, charged = charged, unpaid = unpaid,
                     remaining = remaining}
      if same and (name ~= keys[i] or kind ~= string.sub(kinds, i, i)) then same = false end
    end
    if pos ~= #v + 1 then corrupt() end
    if not same then
      fail('REDLIMIT_INVALID_STATE', 'reservation record ' .. rkey .. ' belongs to another MultiLimit (other ' ..
        'limits), not to ' .. owner .. '; use another reservation id')
    end
    return r
  end

  -- The packed multi record: state, reserved, actual, and per limit (KEYS order) {start, returned,
  -- charged, unpaid, remaining}.
  function multiRecordPack(keys, k, kinds, state, reserved, actual, limits)
    local parts = {struct.pack(MULTI_HEAD, 'R', 'M', state, reserved, actual, k)}
    for i = 1, k do
      local l = limits[i]
      parts[#parts + 1] = struct.pack(MULTI_LIMIT, string.sub(kinds, i, i), l.start, l.returned, l.charged, l.unpaid,
        l.remaining, #keys[i])
      parts[#parts + 1] = keys[i]
    end
    return table.concat(parts)
  end

  -- The reply of a multi settle that found `r` settled already: {2, reserved, actual, then per limit
  -- returned, charged, unpaid, remaining}; of one that found nothing: {0, 0, 0, then 4k zeros}.
  function multiRecordAnswer(r, k)
    local reply = {2, r.reserved, r.actual}
    for i = 1, k do
      local l = r.limits[i]
      local base = 3 + 4 * (i - 1)
      reply[base + 1], reply[base + 2], reply[base + 3], reply[base + 4] = l.returned, l.charged, l.unpaid, l.remaining
    end
    return reply
  end

  function multiRecordUnknown(k)
    local reply = {0, 0, 0}
    for i = 1, 4 * k do reply[3 + i] = 0 end
    return reply
  end
end
