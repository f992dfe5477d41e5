-- include: base onekey reservation_core
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
-- fixed window's (fixed_window.lua).
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
local key = KEYS[1]
local MAX_SPAN = 2764800000000      -- 32 days in µs: a month of 31 days plus any DST shift
local MAX_US = 72057594037927935    -- 2^56 - 1: I7 in the key
local LABEL_MIN, LABEL_MAX = -2147483648, 2147483647

local LABEL = 'calendar quota'

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
if unit ~= 'D' and unit ~= 'W' and unit ~= 'M' then
  fail('REDLIMIT_INVALID_ARGUMENT', 'calendar unit must be D, W or M for limiter ' .. key)
end
local keepAlive = countArg(ARGV[7], 0, MAX_U32, 'keepAlive (ms)', key)
if takes and n > l then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits ' .. n .. ' exceed the limit ' .. l .. ' of limiter ' .. key)
end
local ttl, rkey = 0, nil
if op == 'reserve' then ttl = countArg(ARGV[9], 1, MAX_RECORD_TTL_MS, 'reservation TTL (ms)', key) end
if op == 'reserve' or op == 'settle' then rkey = recordKey() end

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
local v = readPacked('Q', LABEL, key)
if v then
  local _, u, _, label, s, e, count = struct.unpack('<c1c1I4i4I7I7I4', v)
  if (u ~= 'D' and u ~= 'W' and u ~= 'M') or s >= e or e - s > MAX_SPAN then
    fail('REDLIMIT_INVALID_STATE', 'key ' .. key .. ' holds a calendar quota whose window is unusable ' ..
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

-- The window in force with `count` permits counted, written back (a TTL to its end plus keepAlive).
local function store(count)
  redis.call('SET', key, struct.pack('<c1c1I4i4I7I7I4', 'Q', w.unit, l, w.label, w.s, w.e, count), 'PX',
    ceilDiv(w.e - nowUs, 1000) + keepAlive)
end
local windowMs = math.floor((w.e - w.s) / 1000)
local function resetAfter(count)
  if count > 0 then return w.e - nowUs end
  return 0
end

if op == 'refund' then
  local count = w.count - n
  if count < 0 then count = 0 end
  if count ~= w.count then store(count) end
  return {l - count}
end

if op == 'settle' then
  local r = recordRead(rkey, 'Q', LABEL)
  if not r then return RECORD_UNKNOWN end
  if r.state == 'S' then return recordAnswer(r) end
  local count, returned, charged, unpaid = w.count, 0, 0, 0
  if n < r.reserved then
    if r.start == w.s then returned = math.min(r.reserved - n, count) end  -- an ended window: its count is gone
    count = count - returned
  elseif n > r.reserved then
    local extra = n - r.reserved
    charged = math.max(0, math.min(extra, l - count))
    count, unpaid = count + charged, extra - charged
  end
  if count ~= w.count then store(count) end
  local remaining = math.max(0, l - count)
  recordClose(rkey, r, n, returned, charged, unpaid, remaining)
  return {1, r.reserved, n, returned, charged, unpaid, remaining}
end

if op == 'reserve' then
  local r = recordRead(rkey, 'Q', LABEL)
  if r then
    recordCheckRepeat(r, rkey, n)
    return {1, l - w.count, 0, resetAfter(w.count), l, nowUs, 0, l, windowMs, 1}
  end
end

local count, allowed, retry = w.count, 1, 0
if count + n <= l then
  count = count + n
else
  allowed, retry = 0, w.e - nowUs
end
if op == 'peek' then count = w.count end  -- remaining and resetAfter as the window is
if op ~= 'peek' and allowed == 1 then
  store(count)
  if op == 'reserve' then recordOpen(rkey, 'Q', n, w.s, ttl) end
end
if op == 'reserve' then
  return {allowed, l - count, retry, resetAfter(count), l, nowUs, 0, l, windowMs, 0}
end
return packDecision(allowed, l - count, retry, resetAfter(count), l, nowUs, 0, l, windowMs)
