-- include: base onekey
-- calendar_quota.lua: at most L permits per calendar window (a day, a week starting on a given
-- weekday, or a month) of an IANA time zone. CalendarRateLimiter (kind 'Q') runs it.
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
-- unit is 'D', 'W' or 'M'; table is 1..8 windows packed as '<i8i8i8' (label, startUs, endUs),
-- consecutive (each starts where the one before ends, labels increasing), each 1 µs..32 days.
-- The limit is the caller's: a key written with another keeps its count (remaining may go below 0).
-- A key written with another unit keeps its window until that ends.
--
-- Key layout (28 bytes, '<c1c1I4i4I7I7I4'): 'Q', unit, L, label, startUs, endUs, count. Written
-- only by a grant, with PX = the time to the window's end (ms, rounded up) + keepAliveMs, so an
-- idle key is gone soon after its window ends. A key of another kind, another Redis type, or a
-- window that cannot be (start >= end, longer than 32 days) fails before anything is written.
--
-- Reply of take and peek: lib/onekey.lua's packed decision (65 bytes): allowed, remaining,
-- retryAfterUs, resetAfterUs, L, nowUs, 0, L, window length (ms). retryAfter of a denial is exact:
-- the window's end minus now (n <= L, so the next window takes them). resetAfter is the same
-- while permits are counted in the window, 0 when none are.
local key = KEYS[1]
local MAX_SPAN = 2764800000000      -- 32 days in µs: a month of 31 days plus any DST shift
local MAX_US = 72057594037927935    -- 2^56 - 1: I7 in the key
local LABEL_MIN, LABEL_MAX = -2147483648, 2147483647

if ARGV[3] ~= 'Q' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown limiter kind for calendar_quota.lua') end
local op = ARGV[1]
if op ~= 'take' and op ~= 'peek' then fail('REDLIMIT_INVALID_ARGUMENT', 'unknown operation for calendar_quota.lua') end
local nowUs = currentMicros(ARGV[2])
local n = countArg(ARGV[4], 1, MAX_U32, 'permits', key)
local l = countArg(ARGV[5], 1, MAX_U32, 'limit', key)
local unit = ARGV[6]
if unit ~= 'D' and unit ~= 'W' and unit ~= 'M' then
  fail('REDLIMIT_INVALID_ARGUMENT', 'calendar unit must be D, W or M for limiter ' .. key)
end
local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)', key)
if n > l then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits ' .. n .. ' exceed the limit ' .. l .. ' of limiter ' .. key)
end

-- The caller's table, checked whole before anything is read or written.
local tbl = ARGV[8]
if type(tbl) ~= 'string' or #tbl == 0 or #tbl % 24 ~= 0 or #tbl > 192 then
  fail('REDLIMIT_INVALID_ARGUMENT', 'calendar table must be 1..8 packed windows for limiter ' .. key)
end
local rows = {}
for i = 1, #tbl / 24 do
  local label, s, e = struct.unpack('<i8i8i8', tbl, (i - 1) * 24 + 1)
  local prev = rows[i - 1]
  if label < LABEL_MIN or label > LABEL_MAX or s < 0 or e > MAX_US or s >= e or e - s > MAX_SPAN or
      (prev and (s ~= prev.e or label <= prev.label)) then
    fail('REDLIMIT_INVALID_ARGUMENT', 'calendar table window ' .. i .. ' is not usable for limiter ' .. key)
  end
  rows[i] = {label = label, s = s, e = e}
end

-- The stored window.
local stored = nil
local v = readPacked('Q', 'CalendarRateLimiter', key)
if v then
  local _, u, _, label, s, e, count = struct.unpack('<c1c1I4i4I7I7I4', v)
  if (u ~= 'D' and u ~= 'W' and u ~= 'M') or s >= e or e - s > MAX_SPAN then
    fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' holds a CalendarRateLimiter whose window is unusable ' ..
      '(another program wrote it); delete it (deleteLimiter)')
  end
  stored = {unit = u, label = label, s = s, e = e, count = count}
end

-- The window in force.
local w = stored
if not stored or nowUs >= stored.e then
  local pick = nil
  for _, r in ipairs(rows) do
    if r.s <= nowUs and nowUs < r.e then pick = r break end
  end
  if pick and stored and stored.unit == unit and pick.label <= stored.label then
    pick = nil                             -- never reopen a label: the first later one
    for _, r in ipairs(rows) do
      if r.label > stored.label then pick = r break end
    end
  end
  if not pick then return nowUs end        -- outside the caller's table: it asks again around nowUs
  local s = pick.s
  if stored and s < stored.e then s = stored.e end
  if s > nowUs then s = stored.e end       -- the later label begins where the stored window ended
  w = {unit = unit, label = pick.label, s = s, e = pick.e, count = 0}
end

local count, allowed, retry = w.count, 1, 0
if count + n <= l then
  count = count + n
else
  allowed, retry = 0, w.e - nowUs
end
if op == 'peek' then count = w.count end  -- remaining and resetAfter as the window is
local resetUs = 0
if count > 0 then resetUs = w.e - nowUs end
if op == 'take' and allowed == 1 then
  redis.call('SET', key, struct.pack('<c1c1I4i4I7I7I4', 'Q', w.unit, l, w.label, w.s, w.e, count), 'PX',
    ceilDiv(w.e - nowUs, 1000) + keepAlive)
end
return packDecision(allowed, l - count, retry, resetUs, l, nowUs, 0, l, math.floor((w.e - w.s) / 1000))
