-- calendar_quota.lua: at most L permits per calendar window (a day, a week starting on a given
-- weekday, or a month) of an IANA time zone. A Limiter under Policy::calendar (kind 'Q') runs it.
--
-- Lua has no time zone database, so the client computes the windows' bounds from its own (the
-- system's tzdata) and sends a small TABLE of consecutive windows around its idea of now; this
-- script still decides WHICH window is in force with the server's clock (TIME), and the key, not
-- the table, is authoritative for a window once it has been opened:
--
--   * A window is identified by its calendar LABEL, not its start instant: the local day number
--     since 1970-01-01 (days), the day number of the week's first day (weeks), year x 12 +
--     month - 1 (months). Labels only grow.
--   * The key stores {unit, L, label, startUs, endUs, count}. While now < the stored end, the
--     stored window is in force, whatever the caller's table says (two clients whose databases put
--     midnight at different instants count in the window opened first).
--   * Once now >= the stored end, the new window is the table's entry containing now; if its label
--     is <= the stored one (the caller's database says the stored day is not over yet), the first
--     entry with a greater label is opened instead. A new window starts at max(its start, stored
--     end), and at the stored end if that would be after now. So windows never overlap and never
--     reopen a label: two clients that disagree on the database cannot open two windows for one
--     day; at worst one window is shortened or lengthened by their disagreement.
--   * now outside the table (the client's clock is far off the server's): the reply is the
--     server's now as an INTEGER, nothing is written; the client recomputes its table around that
--     time and calls once more.
--
-- Operations (ARGV[1]; ARGV[2] is now in epoch µs or '' for the server's TIME, ARGV[3] the kind 'Q'):
--   take n L unit keepAliveMs table   takes n permits if the window in force has them left
--   peek n L unit keepAliveMs table   what take would decide (remaining and resetAfter as the window
--                                     is, nothing taken); writes nothing
--   reserve n L unit keepAliveMs table ttlMs
--                                     take n and, when granted, a record of them in KEYS[2] (the
--                                     window's start with it) that lives ttlMs; the record there
--                                     already: nothing taken, the first grant answered (repeated)
--   settle actual L unit keepAliveMs table
--                                     settles the record in KEYS[2] once: gives reserved - actual
--                                     back to the window in force if the grant was counted in it
--                                     (a window that has ended took its count with it: nothing), or
--                                     charges actual - reserved more in it, up to L (the rest
--                                     unpaid: the key holds one window, nothing is booked ahead)
--   refund n L unit keepAliveMs table gives n back to the window in force (its count not below 0)
-- The records, their layout and the repeat and settle rules are lib/reservation_core.lua's, as the
-- fixed window's (fixed_window.lua); the windows, the key and take, settle and refund are
-- lib/calendar_core.lua's, as multi.lua's calendar limits.
-- unit is 'D', 'W' or 'M'; table is 1..8 windows packed as '<i8i8i8' (label, startUs, endUs),
-- consecutive (each starts where the one before ends, labels increasing), each 1 µs..32 days.
-- The limit is the caller's: a key written with another keeps its count (remaining may go below 0).
-- A key written with another unit keeps its window until that ends.
--
-- Key layout (28 bytes, '<c1c1I4i4I7I7I4'): 'Q', unit, L, label, startUs, endUs, count. Written
-- only by a grant, or a settle or refund that changes the count, with PX = the time to the window's end (ms, rounded up) + keepAliveMs, so an
-- idle key is gone soon after its window ends. A key of another kind, another Redis type, or a
-- window that cannot be (start >= end, longer than 32 days) fails before anything is written.
--
-- Reply of take and peek: lib/onekey.lua's packed decision (65 bytes): allowed, remaining,
-- retryAfterUs, resetAfterUs, L, nowUs, 0, L, window length (ms). retryAfter of a denial is exact:
-- the window's end minus now (n <= L, so the next window takes them). resetAfter is the same
-- while permits are counted in the window, 0 when none are. reserve: the same nine values as an
-- array, then repeated (0 or 1), as fixed_window.lua's. settle: {status, reserved, actual,
-- returned, charged, unpaid, remaining} (status 0 no record, 1 settled now, 2 settled before).
-- refund: {remaining} (an array: a bare integer is the answer "outside the table" of every
-- operation, sent before anything is read or written but the key).
--
-- The fast path (above the `-- include:` line, so it runs before the libraries' helpers are made:
-- each `local function` of a library is a new closure on every call, about 0.02 µs each, 33 of them
-- here; it uses none of them): `take` on a key whose stored window is in force (now in
-- [start, end), the stored unit the caller's) with usable arguments and table is decided right here
-- with locals only, by exactly the arithmetic of lib/calendar_core.lua (calendarRows' checks of the
-- table, calendarLoad of a window in force, calendarTake, calendarStore, calendarResetAfter,
-- calendarWindowMs) and lib/onekey.lua's packDecision. Anything else (a missing key, a window that
-- has ended, a bad argument or table, another kind, size or type of key) falls through to the full
-- code below, which checks everything in order and fails with the precise error before writing
-- anything; the fast path has written nothing then. The tests hold it to the full code: the same
-- calls on the same keys, by this script and by this script with the path's `if` made `if false`.
-- Quotients: now >= start, so end - now <= end - start <= 32 days in µs (< 2^42), and
-- math.ceil(x / 1000) and math.floor(x / 1000) are exact (ceilDiv's and calendarWindowMs' values).
if ARGV[1] == 'take' and ARGV[3] == 'Q' and type(ARGV[8]) == 'string' then
  -- What decide(1) sends compares as one interned string; anything else goes through tonumber.
  local nowUs, n, l, unit, keepAlive, tbl = ARGV[2], ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[8]
  if n == '1' then n = 1 else n = tonumber(n) end
  if nowUs == '' then
    nowUs = 0                              -- read below, once the key is known to be usable
  else
    nowUs = tonumber(nowUs)
    if nowUs and (nowUs < 0 or nowUs > 9e15 or nowUs % 1 ~= 0) then nowUs = nil end
  end
  local usable = nowUs and n and l and keepAlive and n >= 1 and n % 1 == 0 and n <= l and l <= 4294967295 and
    l % 1 == 0 and keepAlive >= 0 and keepAlive <= 4294967295 and keepAlive % 1 == 0 and
    (unit == 'D' or unit == 'W' or unit == 'M') and #tbl > 0 and #tbl % 24 == 0 and #tbl <= 192
  if usable then                           -- calendarRows' checks, without making the rows
    local prevLabel, prevEnd = nil, nil
    for at = 1, #tbl, 24 do
      local label, s, e = struct.unpack('<i8i8i8', tbl, at)
      if label < -2147483648 or label > 2147483647 or s < 0 or e > 72057594037927935 or s >= e or
          e - s > 2764800000000 or (prevLabel and (s ~= prevEnd or label <= prevLabel)) then
        usable = false
        break
      end
      prevLabel, prevEnd = label, e
    end
  end
  local v = usable and redis.pcall('GET', KEYS[1])
  if type(v) == 'string' and #v == 28 then
    local k, u, _, label, start, finish, count = struct.unpack('<c1c1I4i4I7I7I4', v)
    if k == 'Q' and u == unit and start < finish and finish - start <= 2764800000000 then
      if ARGV[2] == '' then
        local t = redis.call('TIME')
        nowUs = t[1] * 1000000 + t[2]
      end
      if start <= nowUs and nowUs < finish then  -- the stored window is in force
        local allowed, retry = 1, 0
        if count + n <= l then
          count = count + n
          redis.call('SET', KEYS[1], struct.pack('<c1c1I4i4I7I7I4', 'Q', u, l, label, start, finish, count), 'PX',
            math.ceil((finish - nowUs) / 1000) + keepAlive)
        else
          allowed, retry = 0, finish - nowUs
        end
        local resetUs = 0
        if count > 0 then resetUs = finish - nowUs end
        return struct.pack('<Bi8i8i8i8i8i8i8i8', 160 + allowed, l - count, retry, resetUs, l, nowUs, 0, l,
          math.floor((finish - start) / 1000))
      end
    end
  end
end
-- The libraries' helpers this call makes (each is a closure made anew on every call).
local makesCalendar, makesRecords = true, ARGV[1] == 'reserve' or ARGV[1] == 'settle'
-- include: base onekey reservation_core calendar_core
local key = KEYS[1]

if ARGV[3] ~= 'Q' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for calendar_quota.lua') end
local op = ARGV[1]
local takes = op == 'take' or op == 'peek' or op == 'reserve'
if not takes and op ~= 'settle' and op ~= 'refund' then
  fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for calendar_quota.lua')
end
local nowUs = currentMicros(ARGV[2])
local n                                    -- permits to take, the actual permits, or to refund
if takes then
  n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
elseif op == 'settle' then
  n = countArg(ARGV[4], 0, MAX_U32, 'actual permits', key)
else
  n = countArg(ARGV[4], 0, MAX_U32, 'permits to refund', key)
end
local l = countArg(ARGV[5], 1, MAX_U32, 'limit', key)
local unit = ARGV[6]
calendarCheckUnit(unit, key)
local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)', key)
if takes and n > l then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits ' .. n .. ' exceed the limit ' .. l .. ' of limiter ' .. key)
end
local ttl, rkey = 0, nil
if op == 'reserve' then ttl = countArg(ARGV[9], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', key) end
if op == 'reserve' or op == 'settle' then rkey = recordKey() end

-- The caller's table, checked whole before anything is read or written; the window in force.
local s = calendarLoad(key, nowUs, l, unit, keepAlive, calendarRows(ARGV[8], key))
if not s then return nowUs end             -- outside the caller's table: it asks again around nowUs
local windowMs = calendarWindowMs(s)

if op == 'refund' then return {l - calendarRefund(s, n)} end

if op == 'settle' then
  return recordSettle(rkey, 'Q', CALENDAR_LABEL, n, function(reserved, start, used)
    return calendarSettle(s, reserved, start, used)
  end)
end

if op == 'reserve' then
  local r = recordRead(rkey, 'Q', CALENDAR_LABEL)
  if r then
    recordCheckRepeat(r, rkey, n)
    return {1, l - s.count, 0, calendarResetAfter(s, s.count), l, nowUs, 0, l, windowMs, 1}
  end
end

local allowed, count, retry = calendarTake(s, n)
if op == 'peek' then count = s.count end  -- remaining and resetAfter as the window is
if op ~= 'peek' and allowed == 1 then
  calendarStore(s, count)
  if op == 'reserve' then recordOpen(rkey, 'Q', n, s.start, ttl) end
end
if op == 'reserve' then
  return {allowed, l - count, retry, calendarResetAfter(s, count), l, nowUs, 0, l, windowMs, 0}
end
return packDecision(allowed, l - count, retry, calendarResetAfter(s, count), l, nowUs, 0, l, windowMs)
