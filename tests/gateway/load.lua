-- wrk script of example.gateway (tests/gateway/check.sh): sends every other request with the API
-- key load-hot (X-Api-Key), so that it meets its own limit, and the others over KEYS keys in turn
-- (load-0 .. load-<KEYS-1>), so that together they meet the global limit. Counts, over all threads, the 200s per key
-- (from the body, "granted to <key>") and the answers per status, and the denials without a
-- Retry-After field. Prints, once wrk is done, one line per count:
--   granted <key> <n> | status <code> <n> | no-retry-after <n>
-- wrk runs each thread in a Lua state of its own: setup() keeps the threads, done() reads their
-- tables with thread:get (wrk's SCRIPTING, "setup", "done").
--   wrk ... -s load.lua URL -- KEYS
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  keys = tonumber(args[1]) or 10
  sent = 0
  granted = {}
  statuses = {}
  missing = 0
end

function request()
  sent = sent + 1
  local key = "load-hot"
  if sent % 2 == 1 then key = "load-" .. (math.floor(sent / 2) % keys) end
  return wrk.format("GET", nil, { ["X-Api-Key"] = key })
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    local key = string.match(body, "^granted to (.*)\n$") or "?"
    granted[key] = (granted[key] or 0) + 1
  elseif headers["Retry-After"] == nil and headers["retry-after"] == nil then
    missing = missing + 1
  end
end

function done(summary, latency, requests)
  local total = { granted = {}, statuses = {}, missing = 0 }
  for _, thread in ipairs(threads) do
    for key, n in pairs(thread:get("granted")) do total.granted[key] = (total.granted[key] or 0) + n end
    for code, n in pairs(thread:get("statuses")) do total.statuses[code] = (total.statuses[code] or 0) + n end
    total.missing = total.missing + thread:get("missing")
  end
  for key, n in pairs(total.granted) do io.write(string.format("granted %s %d\n", key, n)) end
  for code, n in pairs(total.statuses) do io.write(string.format("status %d %d\n", code, n)) end
  io.write(string.format("no-retry-after %d\n", total.missing))
end
