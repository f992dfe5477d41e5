-- lib/calendar_core.lua: at most L permits per calendar window (a day, a week starting on a given
-- weekday, or a month) of an IANA time zone, on one packed key. For calendar_quota.lua (one limiter)
-- and multi.lua (several decided together); the rules of the windows are in calendar_quota.lua's
-- header. Kind 'Q'.
--
-- The caller sends a TABLE of consecutive windows (label, startUs, endUs) around its idea of now,
-- from its time zone database; calendarLoad picks the window in force with the server's now, and
-- answers nil when now is outside the table (the script then answers the server's now as a bare
-- INTEGER and writes nothing: the client recomputes the table around that time and calls once more).
-- Key layout (28 bytes, '<c1c1I4i4I7I7I4'): 'Q', unit, L, label, startUs, endUs, count. Written
-- only when the count changes (a grant, a settle or a refund that changes it), with PX = the time
-- to the window's end (ms, rounded up) + keepAliveMs.
--
-- A limiter is a table s: key, nowUs, l, unit, keepAlive, and the window in force: label, start,
-- finish (µs), count.
local CALENDAR_LAYOUT = '<c1c1I4i4I7I7I4'
local CALENDAR_LABEL = 'calendar quota'
local CALENDAR_MAX_SPAN = 2764800000000    -- 32 days in µs: a month of 31 days plus any DST shift
local CALENDAR_MAX_US = 72057594037927935  -- 2^56 - 1: I7 in the key

-- The helpers below are made only if `makesCalendar` is true: a local that a script which includes this
-- file sets above its `-- include:` line. A function is a closure made anew on every call
-- (cmake/EmbedLua.cmake), so a script makes only the groups it uses; the others stay nil.
local calendarCheckUnit, calendarRows, calendarLoad, calendarStore, calendarResetAfter, calendarWindowMs,
  calendarCheckPermits, calendarTake, calendarRefund, calendarSettle, calendarWithConfig
if makesCalendar then
  -- Fails with REDLIMIT_INVALID_ARGUMENT unless `unit` is 'D', 'W' or 'M'.
  function calendarCheckUnit(unit, key)
    if unit ~= 'D' and unit ~= 'W' and unit ~= 'M' then
      fail('REDLIMIT_INVALID_ARGUMENT', 'calendar unit must be D, W or M for limiter ' .. key)
    end
  end

  -- The caller's table (1..8 windows packed as '<i8i8i8': label, startUs, endUs; consecutive, labels
  -- increasing, each 1 µs..32 days) as rows {label, s, e}, checked whole before anything is read.
  function calendarRows(tbl, key)
    if type(tbl) ~= 'string' or #tbl == 0 or #tbl % 24 ~= 0 or #tbl > 192 then
      fail('REDLIMIT_INVALID_ARGUMENT', 'calendar table must be 1..8 packed windows for limiter ' .. key)
    end
    local rows = {}
    for i = 1, #tbl / 24 do
      local label, s, e = struct.unpack('<i8i8i8', tbl, (i - 1) * 24 + 1)
      local prev = rows[i - 1]
      if label < -2147483648 or label > 2147483647 or s < 0 or e > CALENDAR_MAX_US or s >= e or
          e - s > CALENDAR_MAX_SPAN or (prev and (s ~= prev.e or label <= prev.label)) then
        fail('REDLIMIT_INVALID_ARGUMENT', 'calendar table window ' .. i .. ' is not usable for limiter ' .. key)
      end
      rows[i] = {label = label, s = s, e = e}
    end
    return rows
  end

  -- The limiter of `key` at nowUs under the caller's L, unit, keepAlive and table `rows`: the stored
  -- window while it is in force, else the table's window holding now (never reopening a label: see
  -- calendar_quota.lua's header). nil when now is outside the table (nothing read but the key).
  function calendarLoad(key, nowUs, l, unit, keepAlive, rows)
    local s = {key = key, nowUs = nowUs, l = l, unit = unit, keepAlive = keepAlive, calendar = true}
    local stored = nil
    local v = readPacked('Q', CALENDAR_LABEL, key)
    if v then
      local _, u, _, label, start, finish, count = struct.unpack(CALENDAR_LAYOUT, v)
      if (u ~= 'D' and u ~= 'W' and u ~= 'M') or start >= finish or finish - start > CALENDAR_MAX_SPAN then
        fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' holds a calendar quota whose window is unusable ' ..
          '(another program wrote it); delete it (deleteLimiter)')
      end
      stored = {unit = u, label = label, s = start, e = finish, count = count}
    end
    if stored and nowUs < stored.e then
      s.unit, s.label, s.start, s.finish, s.count = stored.unit, stored.label, stored.s, stored.e, stored.count
      return s
    end
    local pick = nil
    for _, r in ipairs(rows) do
      if r.s <= nowUs and nowUs < r.e then pick = r break end
    end
    if pick and stored and stored.unit == unit and pick.label <= stored.label then
      pick = nil                               -- never reopen a label: the first later one
      for _, r in ipairs(rows) do
        if r.label > stored.label then pick = r break end
      end
    end
    if not pick then return nil end            -- outside the caller's table
    local start = pick.s
    if stored and start < stored.e then start = stored.e end
    if start > nowUs then start = stored.e end -- the later label begins where the stored window ended
    s.label, s.start, s.finish, s.count = pick.label, start, pick.e, 0
    return s
  end

  -- The window in force with `count` permits counted, written back (a TTL to its end plus keepAlive).
  function calendarStore(s, count)
    redis.call('SET', s.key, struct.pack(CALENDAR_LAYOUT, 'Q', s.unit, s.l, s.label, s.start, s.finish, count), 'PX',
      ceilDiv(s.finish - s.nowUs, 1000) + s.keepAlive)
  end

  -- The time until no permit is counted (µs): the window's end while any is, else 0.
  function calendarResetAfter(s, count)
    if count > 0 then return s.finish - s.nowUs end
    return 0
  end

  -- The window's length (ms), what a decision reports as its local interval.
  function calendarWindowMs(s)
    return math.floor((s.finish - s.start) / 1000)
  end

  -- Fails with REDLIMIT_INVALID_ARGUMENT if n permits can never be granted in one window.
  function calendarCheckPermits(s, n)
    if n > s.l then
      fail('REDLIMIT_INVALID_ARGUMENT', 'permits ' .. n .. ' exceed the limit ' .. s.l .. ' of limiter ' .. s.key)
    end
  end

  -- Taking n permits (n <= L) in the window in force if they are left. Returns allowed (1 or 0), the
  -- count after the call, and retryAfter: exact, the window's end minus now (the next window takes them).
  function calendarTake(s, n)
    if s.count + n <= s.l then return 1, s.count + n, 0 end
    return 0, s.count, s.finish - s.nowUs
  end

  -- Gives n permits back to the window in force (its count not below 0), stored if it changed;
  -- returns the count.
  function calendarRefund(s, n)
    local count = s.count - n
    if count < 0 then count = 0 end
    if count ~= s.count then calendarStore(s, count) end
    return count
  end

  -- Settles a reservation of `reserved` permits counted in the window starting at `start` that used
  -- `actual`: gives back reserved - actual to that window while it is in force (an ended window took
  -- its count with it: nothing), or charges actual - reserved more in the window in force, up to L
  -- (the rest unpaid: the key holds one window, nothing is booked ahead). Stores what changed.
  -- Returns returned, charged, unpaid, remaining.
  function calendarSettle(s, reserved, start, actual)
    local count, returned, charged, unpaid = s.count, 0, 0, 0
    if actual < reserved then
      if start == s.start then returned = math.min(reserved - actual, count) end
      count = count - returned
    elseif actual > reserved then
      local extra = actual - reserved
      charged = math.max(0, math.min(extra, s.l - count))
      count, unpaid = count + charged, extra - charged
    end
    if count ~= s.count then calendarStore(s, count) end
    return returned, charged, unpaid, math.max(0, s.l - count)
  end

  -- The calendar quota of `key` at nowUs under the configuration in a multi.lua call: 'Q', unit,
  -- L (uint32), keepAlive ms (uint32), then the table (calendarRows). nil when now is outside it.
  function calendarWithConfig(key, nowUs, cfg)
    if type(cfg) ~= 'string' or #cfg < 10 then
      fail('REDLIMIT_INVALID_ARGUMENT', 'calendar quota ' .. key .. ' needs its quota and table in the call')
    end
    local kind, unit, l, keepAlive = struct.unpack('<c1c1I4I4', cfg)
    if kind ~= 'Q' then
      fail('REDLIMIT_INVALID_ARGUMENT', 'the configuration in the call is not one of a ' .. CALENDAR_LABEL)
    end
    calendarCheckUnit(unit, key)
    if l < 1 then
      fail('REDLIMIT_INVALID_ARGUMENT', 'the limit of calendar quota ' .. key .. ' must be in 1..' .. MAX_U32)
    end
    return calendarLoad(key, nowUs, l, unit, keepAlive, calendarRows(string.sub(cfg, 11), key))
  end
end
