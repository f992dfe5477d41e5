-- ttl.lua: expire / expireAt / clearExpire on all five keys at once.
-- ARGV[1] 'PEXPIRE', 'PEXPIREAT' or 'PERSIST'; ARGV[2] ms (relative or epoch) for the first two.
-- Reply: 1 if any key changed.
local changed = 0
for i = 1, 5 do
  local r
  if ARGV[1] == 'PERSIST' then
    r = redis.call('PERSIST', KEYS[i])
  else
    r = redis.call(ARGV[1], KEYS[i], ARGV[2])
  end
  if r == 1 then changed = 1 end
end
return changed
