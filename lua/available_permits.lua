-- include: base redisson
-- available_permits.lua: permits that could be taken now.
-- ARGV[1] now in epoch µs ('' = server clock), ARGV[2] the rate the client saw last ('' if unknown).
-- Reply: the value after reclaiming expired permits (and repairing the invariant, see
-- loadState), clamped to 0..rate (it is negative for a while after the rate was lowered below
-- the permits in use, and while the limiter is frozen).
local cfg = readConfig()
local value = loadState(cfg, currentMicros(ARGV[1]), 0, true, ARGV[2])
writeState(cfg, value)
applyTtl(cfg)
if value < 0 then return 0 end
return value
