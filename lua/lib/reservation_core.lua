-- lib/reservation_core.lua: the records of reserve-then-settle, for gcra.lua and fixed_window.lua.
-- `reserve` takes permits as `take n 0` does and, when it grants, writes a record of them in
-- KEYS[2] (the client derives that key from the limiter's name and the reservation id so that it
-- shares the limiter's hash slot); `settle` reads it once: an open record is settled (permits given
-- back or charged) and marked settled with its answer, a settled one answers that answer again and
-- changes nothing, a missing one (never reserved, or expired) changes nothing. Both are one script
-- call: the grant and its record, or the give-back and the mark, are written together or not at all.
--
-- Record layout (34 bytes, struct.pack little-endian): 'R', the limiter's kind byte, the state
--   'O' (open) or 'S' (settled), reserved permits (uint32, >= 1), the fixed window's start (µs,
--   uint56) the grant was counted in (0 for the token bucket and GCRA), then once settled: actual,
--   returned, charged, unpaid, remaining (uint32 each; 0 while open).
-- TTL: the one reserve was given (ms); a settle keeps what is left of it.
local RECORD_LAYOUT = '<c1c1c1I4I7I4I4I4I4I4'
local RECORD_SIZE = 34
local MAX_RECORD_TTL_MS = 604800000        -- 7 days, ScriptLimiter::kMaxReservationTtl

-- The record key, KEYS[2]; fails with REDLIMIT_INVALID_ARGUMENT if the call did not pass one.
local function recordKey()
  local rkey = KEYS[2]
  if not rkey then fail('REDLIMIT_INVALID_ARGUMENT', 'reserve and settle need the record key as KEYS[2]') end
  return rkey
end

-- The record in `rkey` as a table, nil if the key does not exist. Anything redlimit did not write
-- there, or a record of another kind of limiter, fails with REDLIMIT_INVALID_STATE naming the key:
-- nothing has been written yet.
local function recordRead(rkey, kind, label)
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
    local tag, k, state, reserved, start, actual, returned, charged, unpaid, remaining = struct.unpack(RECORD_LAYOUT, v)
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
local function recordCheckRepeat(r, rkey, n)
  if r.reserved ~= n then
    fail('REDLIMIT_INVALID_ARGUMENT', 'reservation ' .. rkey .. ' holds ' .. r.reserved .. ' permits, not ' .. n ..
      ': a reservation id names one reservation')
  end
end

-- Writes a new open record of n permits (counted in the window starting at `start`, or 0).
local function recordOpen(rkey, kind, n, start, ttlMs)
  redis.call('SET', rkey, struct.pack(RECORD_LAYOUT, 'R', kind, 'O', n, start, 0, 0, 0, 0, 0), 'PX', ttlMs)
end

-- Marks the record `r` settled with its answer, keeping what is left of its TTL.
local function recordClose(rkey, r, actual, returned, charged, unpaid, remaining)
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
local function recordAnswer(r)
  return {2, r.reserved, r.actual, r.returned, r.charged, r.unpaid, r.remaining}
end
local RECORD_UNKNOWN = {0, 0, 0, 0, 0, 0, 0}
