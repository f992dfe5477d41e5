-- available_permits.lua: permits that could be taken now.
-- ARGV[1] now in epoch ms ('' = server clock).
-- Reply: the value after returning expired permits, clamped to 0..rate (it is negative for a
-- while after the rate was lowered below the permits in use).
local cfg = readConfig()
local value = refill(cfg, currentTime(ARGV[1]))
applyTtl(cfg)
if value < 0 then return 0 end
return value
