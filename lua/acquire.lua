-- acquire.lua: take permits, or say how long to wait.
-- KEYS[6] the record of a partial grant made under this call's id ({N}:grant:<hex id>); read and
-- written only when the call may be partial (most > least), so other calls may pass any key of the
-- limiter's slot there (the client passes the hash key).
-- ARGV[1] permits wanted (max), ARGV[2] least permits to accept (min; = max for an ordinary
-- acquire, < max for a segment that may be partial), ARGV[3] the random id bytes of the member,
-- ARGV[4] now in epoch µs ('' = server clock), ARGV[5] '1' if this is a resend of an earlier
-- attempt with the same id (after a lost connection), ARGV[6] how long a partial grant's record
-- is kept, ms (at least as long as the client may resend).
-- Reply: granted, waitMs, value, rate, nowUs, interval, packed as one string of six little-endian
-- signed 64-bit integers (48 bytes; struct.pack's i8 is exact for every integer a script makes
-- here, all below 2^53). granted > 0: the member holds `granted` permits stamped nowUs; they expire
-- `interval` ms later. granted = 0: denied, retry after waitMs (when enough permits will have
-- expired). One bulk string costs Redis less to reply than a table of six integers, which it
-- converts and writes element by element (about 0.3 us a call; src/limiters/rate_limiter.cpp
-- reads it).
--
-- The fast path (above the `-- include:` line, so it runs before the libraries' closures are made;
-- it uses none of them, and no table or closure of its own): a whole acquire (least = most, not a
-- resend, server clock) on a limiter whose configuration, value and log are usable is decided here
-- with locals only, by exactly the rules of the full code below (readConfig, loadState,
-- writeState, applyTtl, denialWait), and with the same bounded work (one batch of expired members
-- at most; a log expired whole is dropped). Anything else (a missing value key, a key of another
-- type, a field or argument out of bounds, a member that is not a permit entry, a value the full
-- code would rebuild before granting, a frozen value) falls through to the full code, which checks
-- everything in order and fails with the precise error. Nothing is written before the decision,
-- so falling through is always safe.
-- Calls: HMGET, GET, TIME, ZRANGEBYSCORE of the expired members (at most a batch); a grant adds
-- ZCARD (the invariant check value + live members <= rate), DECRBY (SET when members were
-- reclaimed) and ZADD; a deny reads the oldest live members it needs; reclaimed members add ZCARD
-- and one ZREMRANGEBYRANK; a full batch expired adds ZCOUNT (and UNLINK when the whole log has
-- expired).
-- Numbers: fields, arguments and the value are read with tonumber and checked as integers in
-- range ("1e1" is 10), as lib/base.lua's parseInteger does. The value's first write is either
-- DECRBY by the permits (which refuses a value not in plain decimal form; then nothing has been
-- written and the full code decides) or SET, so no command after the first write can fail. Every
-- number sent to Redis on the hot path is formatted here with %d (Redis would format a Lua number
-- with %.17g, which costs more than the command): scores as epoch ms with three decimals, as the
-- full code's scoreOf.
local REPLY = '<i8i8i8i8i8i8'
local most = ARGV[1]
if most == ARGV[2] and ARGV[4] == '' and ARGV[5] ~= '1' then
  local c = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')
  local rate, interval, rtype, keep = tonumber(c[1]), tonumber(c[2]), c[3], 0
  if c[4] then keep = tonumber(c[4]) end
  local want, recordTtl, idLen = tonumber(most), tonumber(ARGV[6]), #ARGV[3]
  if rate and rate >= 1 and rate <= 4294967295 and rate % 1 == 0 and interval and interval >= 1 and
      interval <= 1000000000000 and interval % 1 == 0 and (rtype == '0' or rtype == '1') and keep and
      keep >= 0 and keep <= 1000000000000 and keep % 1 == 0 and want and want >= 1 and want <= rate and
      want % 1 == 0 and idLen >= 1 and idLen <= 255 and recordTtl and recordTtl >= 1 and recordTtl < 1e14 and
      recordTtl % 1 == 0 then
    local vkey, zkey = KEYS[2], KEYS[4]
    if rtype == '1' then vkey, zkey = KEYS[3], KEYS[5] end
    local raw = tonumber(redis.pcall('GET', vkey))  -- nil: missing, another type, not a number
    if raw and raw >= -1000000000000 and raw <= rate and raw % 1 == 0 then
      local t = redis.call('TIME')
      local now = t[1] * 1000000 + t[2]
      local edgeUs = now - interval * 1000
      local edgeMs = math.floor(edgeUs / 1000)
      local edge = string.format('%d.%03d', edgeMs, edgeUs - edgeMs * 1000)  -- scores <= edge have expired
      local e = redis.pcall('ZRANGEBYSCORE', zkey, '-inf', edge, 'LIMIT', '0', '1000')
      if not e.err then
        -- card: members in the log (nil: not counted, and not 0); reclaim: expired members removed
        -- now (the lowest ranks); left: members after that; live: the unexpired (fewer than left
        -- only when more than a batch has expired); drop: the whole log of more than a batch has
        -- expired (one UNLINK); bad: a member is not a permit entry (the full code names it);
        -- oldest: with nothing expired and too little value, the oldest members (the wait's).
        local value, reclaim, drop, bad = raw, #e, false, false
        local card, expired, oldest = nil, reclaim, nil
        if reclaim > 0 then
          card = redis.call('ZCARD', zkey)
          if reclaim == 1000 then expired = redis.call('ZCOUNT', zkey, '-inf', edge) end
          if expired == card and card > 1000 then
            drop, reclaim = true, 0
          elseif reclaim < card then
            for i = 1, reclaim do
              local m = e[i]
              local n = #m
              if n < 5 or m:byte(1) ~= n - 5 then
                bad = true
                break
              end
              local p1, p2, p3, p4 = m:byte(n - 3, n)
              value = value + p1 + p2 * 256 + p3 * 65536 + p4 * 16777216
            end
          end
        elseif value < want then
          local fetch = want - value
          if fetch > 64 then fetch = 64 end
          local last = '0'
          if fetch > 1 then last = string.format('%d', fetch - 1) end
          oldest = redis.call('ZRANGE', zkey, '0', last, 'WITHSCORES')
          if #oldest == 0 then card = 0 end  -- an empty log: the limiter starts full
        end
        if card == nil and value >= want then card = redis.call('ZCARD', zkey) end
        local left, live = 1, 1  -- not counted: the log is not empty
        if card then
          left, live = card - reclaim, card - expired
          if drop then left = 0 end
          if left == 0 then value = rate end
        end
        -- loadState's `changed`: the rate moved since the caller saw it, and the value is 0.
        local expected = ARGV[7]
        local changed = raw == 0 and expected ~= nil and expected ~= '' and expected ~= c[1] and
            tonumber(expected) ~= rate
        if bad then
          -- the full code below
        elseif value >= want then
          -- Grant, if the value can be trusted (loadState's checks; else the full code rebuilds it).
          if left == 0 or (value <= rate and value + live <= rate and not changed) then
            -- The first write is the value's: DECRBY in the steady state (a value it refuses, such as
            -- "3e0", falls through with nothing written), SET when members were reclaimed or the
            -- value restarts at the rate. No later command can fail.
            local after = value - want
            if reclaim == 0 and left > 0 then
              after = redis.pcall('DECRBY', vkey, most)
              if type(after) ~= 'number' then after = nil end
            else
              redis.call('SET', vkey, string.format('%d', after), 'KEEPTTL')
            end
            if after then
              if drop then
                redis.call('UNLINK', zkey)
              elseif reclaim > 0 then
                redis.call('ZREMRANGEBYRANK', zkey, '0', string.format('%d', reclaim - 1))
              end
              local nowMs = math.floor(now / 1000)
              redis.call('ZADD', zkey, string.format('%d.%03d', nowMs, now - nowMs * 1000),
                struct.pack('<Bc0I4', idLen, ARGV[3], want))
              if keep > 0 then
                local k = string.format('%d', keep)
                redis.call('PEXPIRE', KEYS[1], k)
                redis.call('PEXPIRE', vkey, k)
                redis.call('PEXPIRE', zkey, k)
              elseif left == 0 then                    -- the ZADD made the log: the hash's TTL
                local ttl = redis.call('PTTL', KEYS[1])
                if ttl > 0 then
                  redis.call('PEXPIRE', vkey, ttl)
                  redis.call('PEXPIRE', zkey, ttl)
                end
              end
              return struct.pack(REPLY, want, 0, after, rate, now, interval)
            end
          end
        elseif not changed and (reclaim == 0 or value + live <= rate) then
          -- Deny (the log is not empty: an empty one grants). A value that fails loadState's count
          -- check (value + members > rate) is rebuilt lower, so with nothing reclaimed it is a
          -- deny all the same and nothing is written (the next call that would grant goes to the
          -- full code, which repairs it); with members reclaimed, and for a `changed` value (which
          -- may be rebuilt higher), the full code decides. The wait (denialWait's): with more than
          -- a batch expired, 1 ms (the next call takes the next batch); else until the oldest live
          -- members free `missing` permits, the first live one at rank `reclaim`. Each member
          -- holds at least one permit: at most 64 are read.
          local wait, stamp = nil, nil
          if expired >= 1000 then
            wait = 1
          else
            local missing = want - value
            local o = oldest
            if not o then
              local fetch = missing
              if fetch > 64 then fetch = 64 end
              o = redis.call('ZRANGE', zkey, string.format('%d', reclaim), string.format('%d', reclaim + fetch - 1),
                'WITHSCORES')
            end
            local freed = 0
            for i = 1, #o, 2 do
              local m = o[i]
              local n = #m
              if n < 5 or m:byte(1) ~= n - 5 then
                stamp = false
                break
              end
              local p1, p2, p3, p4 = m:byte(n - 3, n)
              freed = freed + p1 + p2 * 256 + p3 * 65536 + p4 * 16777216
              stamp = o[i + 1]
              if freed >= missing then break end
            end
            if stamp then
              wait = math.ceil((math.floor(tonumber(stamp) * 1000 + 0.5) + interval * 1000 - now) / 1000)
              if wait < 1 then wait = 1 end
              if wait > interval then wait = interval end
            end
          end
          if wait then
            if reclaim > 0 then
              redis.call('ZREMRANGEBYRANK', zkey, '0', string.format('%d', reclaim - 1))
              redis.call('SET', vkey, string.format('%d', value), 'KEEPTTL')
            end
            if keep > 0 then
              local k = string.format('%d', keep)
              redis.call('PEXPIRE', KEYS[1], k)
              redis.call('PEXPIRE', vkey, k)
              redis.call('PEXPIRE', zkey, k)
            end
            return struct.pack(REPLY, 0, wait, value, rate, now, interval)
          end
        end
      end
    end
  end
end
-- include: base redisson
local cfg = readConfig()
local want, least = parseCount(ARGV[1]), parseCount(ARGV[2])
if not want or want < 1 or want > MAX_RATE or not least or least < 1 or least > want then
  fail('REDLIMIT_INVALID_ARGUMENT', 'permits must be integers with 1 <= least <= most <= ' .. MAX_RATE)
end
if least > cfg.rate then
  fail('REDLIMIT_INVALID_ARGUMENT', 'Requested permits amount (' .. least .. ') cannot exceed defined rate (' ..
    cfg.rate .. ') of limiter ' .. KEYS[1])
end
if want > cfg.rate then want = cfg.rate end
local id = ARGV[3]
if #id < 1 or #id > 255 then fail('REDLIMIT_INVALID_ARGUMENT', 'the member id must be 1..255 bytes') end
local recordTtl = parseCount(ARGV[6])
if not recordTtl or recordTtl < 1 then fail('REDLIMIT_INVALID_ARGUMENT', 'the record TTL must be >= 1 ms') end
local nowUs = currentMicros(ARGV[4])
local zkey = cfg.permitsKey

-- A resend after a lost reply: if the first attempt was granted, its member is there; grant it
-- again without taking anything. A whole grant is found by its member; a partial one (fewer
-- than `want`) left a record of its size. Two O(1) look-ups, whatever the range.
if ARGV[5] == '1' then
  local n = nil
  local score = readKey('REDLIMIT_INVALID_STATE', zkey, 'a sorted set', 'ZSCORE', packMember(id, want))
  if score then
    n = want
  elseif want > least then
    local record = readKey('REDLIMIT_INVALID_STATE', KEYS[6], 'a string', 'GET')
    if record then
      n = parseCount(record)
      if not n or n < least or n > want then
        fail('REDLIMIT_INVALID_STATE', 'key ' .. KEYS[6] .. ' holds "' .. string.sub(record, 1, 40) .. '", not a grant size')
      end
      score = redis.call('ZSCORE', zkey, packMember(id, n))
    end
  end
  if n then
    local stamp = nowUs
    if score then stamp = scoreMicros(score) end
    local value = readKey('REDLIMIT_INVALID_STATE', cfg.valueKey, 'a string', 'GET')
    return struct.pack(REPLY, n, 0, parseInteger(value) or 0, cfg.rate, stamp, cfg.interval)
  end
end

local value = loadState(cfg, nowUs, 0, false, ARGV[7])
if value >= least then
  local granted = want
  if granted > value then granted = value end
  writeState(cfg, value - granted)
  if cfg.left == 0 then cfg.newLog = true end  -- the ZADD creates the log: it needs the hash's TTL
  redis.call('ZADD', zkey, scoreOf(nowUs), packMember(id, granted))
  if granted < want then
    redis.call('SET', KEYS[6], granted, 'PX', recordTtl)
  end
  applyTtl(cfg)
  return struct.pack(REPLY, granted, 0, value - granted, cfg.rate, nowUs, cfg.interval)
end

-- Denied: wait until enough permits will have been returned. Read (and check) before writing.
local wait = denialWait(cfg, value, least, nowUs)
writeState(cfg, value)
applyTtl(cfg)
return struct.pack(REPLY, 0, wait, value, cfg.rate, nowUs, cfg.interval)
