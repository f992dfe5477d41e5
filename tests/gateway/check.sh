#!/usr/bin/env bash
# example.gateway: examples/gateway driven over loopback by real HTTP clients, against the
# throwaway redis-server of `with-redis` (REDLIMIT_URI):
#   with-redis tests/gateway/check.sh GATEWAY yes|no     (yes: built with /metrics)
# The limits are 20 per day per key and 100 per day in all (GCRA, burst = the count), so nothing
# comes back during the test (the next permit is 72 min or 14.4 min away): every bound is exact.
#  0. Bad options: exit status 2 and the usage, before anything is started.
#  1. curl: one key's 20 requests get 200 with its RateLimit-Policy and RateLimit fields (r
#     counting down), the 21st 429 with Retry-After; no X-Api-Key: keyed by the client address;
#     a key over 1024 bytes: 400; another path: 404; POST: 405.
#  2. wrk, a few seconds, 2 threads x 8 connections: half of the requests with one key, which
#     meets its own limit, the rest over 10 keys, which together meet the global one
#     (tests/gateway/load.lua counts the 200s per key and the statuses, from the answers).
#  3. curl with new keys until the global limit answers 503 (with the global limit's fields).
#  4. The bounds: the gateway granted exactly 100 in all (its /stats), no key more than 20, the
#     clients saw no more 200s than it granted (wrk drops the answers in flight when it stops),
#     every other answer of the load is a 429 or a 503 with Retry-After; with the exporter,
#     /metrics counts the same 100 grants.
#  5. SIGTERM: the gateway closes an idle connection and exits 0.
# Nothing here waits a fixed time: the gateway is polled until it says where it listens.
set -euo pipefail
gateway=$1
metrics=${2:-no}
here=$(cd "$(dirname "$0")" && pwd)
per_key=20
global=100
window=86400
for tool in curl wrk; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (scripts/install-deps.sh installs it)"; exit 1; }
done

work=$(mktemp -d)
pid=

cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- gateway's output:"
  cat "$work/log" || true
  exit 1
}

# --- 0. bad options: said, exit status 2, nothing started ----------------------------------------------
# The library's own checks too: a URI it cannot parse, a limiter name with ':'.
for bad in "--per-key 5" "--global 5/1w" "--port 70000" "--bind nowhere" "--limit 5/1h" "--redis nope://x" "--name a:b"; do
  rc=0
  # shellcheck disable=SC2086  # one option and its value
  "$gateway" $bad >"$work/out" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q '^usage: gateway' "$work/out" || fail "'$bad': exit $rc, $(cat "$work/out")"
done

"$gateway" --port 0 --per-key "$per_key/1d" --global "$global/1d" --name gateway-test >"$work/log" 2>&1 &
pid=$!
until grep -q 'listening on' "$work/log"; do
  kill -0 "$pid" 2>/dev/null || fail "the gateway exited before listening"
  sleep 0.05
done
url=$(sed -n 's/^gateway: listening on //p' "$work/log")
port=${url##*:}
echo "gateway at $url"

# get PATH [KEY] [CURL ARGS...]: one request; sets status, body and the header file.
get() {
  local path=$1 key=${2:-}
  shift $(($# < 2 ? $# : 2))
  local args=(-s -o "$work/body" -D "$work/headers" -w '%{http_code}')
  [ -n "$key" ] && args+=(-H "X-Api-Key: $key")
  status=$(curl "${args[@]}" "$@" "$url$path")
  body=$(cat "$work/body")
}
# field NAME: the value of the last response's field NAME (case-insensitive), CR removed.
field() {
  awk -v name="$1" '{ sub(/\r$/, "") }
    tolower(substr($0, 1, length(name) + 1)) == tolower(name) ":" { sub(/^[^:]*:[ \t]*/, ""); print; exit }' "$work/headers"
}
is_count() { [[ $1 =~ ^[0-9]+$ ]]; }

# --- 1. curl: statuses and fields of one key --------------------------------------------------------
seen=0  # 200s seen by the clients
for ((i = 1; i <= per_key; i++)); do
  get /api/orders curl-a
  [ "$status" = 200 ] || fail "request $i of key curl-a: $status, expected 200"
  [ "$body" = "granted to curl-a" ] || fail "request $i: body '$body'"
  [ "$(field RateLimit-Policy)" = "\"per-key\";q=$per_key;w=$window" ] ||
    fail "request $i: RateLimit-Policy '$(field RateLimit-Policy)'"
  rl=$(field RateLimit)
  [[ $rl =~ ^\"per-key\"\;r=([0-9]+)\;t=([0-9]+)$ ]] || fail "request $i: RateLimit '$rl'"
  [ "${BASH_REMATCH[1]}" -eq $((per_key - i)) ] || fail "request $i: r=${BASH_REMATCH[1]}, expected $((per_key - i))"
  ((BASH_REMATCH[2] >= 1 && BASH_REMATCH[2] <= window)) || fail "request $i: t=${BASH_REMATCH[2]}"
  [ -z "$(field Retry-After)" ] || fail "request $i: a 200 with Retry-After"
  seen=$((seen + 1))
done
get /api/orders curl-a
[ "$status" = 429 ] || fail "request $((per_key + 1)) of key curl-a: $status, expected 429"
retry=$(field Retry-After)
# The next permit of a GCRA of 20 a day comes within 86400 / 20 s.
is_count "$retry" && ((retry >= 1 && retry <= window / per_key)) || fail "429: Retry-After '$retry'"
[ "$(field RateLimit-Policy)" = "\"per-key\";q=$per_key;w=$window" ] || fail "429: RateLimit-Policy '$(field RateLimit-Policy)'"
rl=$(field RateLimit)
[[ $rl =~ ^\"per-key\"\;r=0\;t=([0-9]+)$ ]] || fail "429: RateLimit '$rl'"
((BASH_REMATCH[1] >= retry)) || fail "429: t=${BASH_REMATCH[1]} is less than Retry-After $retry"
echo "curl: $per_key x 200 for one key, then 429 with Retry-After: $retry and RateLimit: $rl"

get /api/orders  # no X-Api-Key: the client's address is the key
[ "$status" = 200 ] && [ "$body" = "granted to 127.0.0.1" ] || fail "no X-Api-Key: $status '$body'"
seen=$((seen + 1))
long_key=$(printf 'k%.0s' $(seq 1025))
get /api/orders "$long_key"
[ "$status" = 400 ] || fail "a key of 1025 bytes: $status, expected 400"
[[ $body != *kkkk* ]] || fail "the 400 quotes the key"
get /elsewhere x
[ "$status" = 404 ] || fail "/elsewhere: $status, expected 404"
get /api/orders x -X POST
[ "$status" = 405 ] && [ "$(field Allow)" = GET ] || fail "POST: $status, Allow '$(field Allow)'"

# --- 2. wrk: concurrent load ------------------------------------------------------------------------
wrk -t2 -c8 -d3s -s "$here/load.lua" "$url/api/load" -- 10 >"$work/wrk" 2>&1 || fail "wrk: $(cat "$work/wrk")"
sed -n '/requests in/p' "$work/wrk"
count() { awk -v kind="$1" -v what="$2" '$1 == kind && $2 == what { print $3; found = 1 } END { if (!found) print 0 }' "$3"; }
others=$(awk '$1 == "status" && $2 != 200 && $2 != 429 && $2 != 503' "$work/wrk")
[ -z "$others" ] || fail "load: answers other than 200, 429 and 503: $others"
missing=$(awk '$1 == "no-retry-after" { print $2 }' "$work/wrk")
[ "$missing" = 0 ] || fail "load: $missing denials without Retry-After"
load_ok=$(count status 200 "$work/wrk")
[ "$(count status 429 "$work/wrk")" -gt 0 ] || fail "load: no 429: the hot key never met its limit ($(cat "$work/wrk"))"
seen=$((seen + load_ok))
echo "wrk: $(awk '$1 == "status" { printf "%s x %s  ", $3, $2 }' "$work/wrk")"

# --- 3. new keys until the global limit denies --------------------------------------------------------
for ((i = 1; i <= global; i++)); do
  get /api/orders "fill-$i"
  [ "$status" = 200 ] || break
  seen=$((seen + 1))
done
[ "$status" = 503 ] || fail "key fill-$i: $status, expected 503 once the global limit is spent"
retry=$(field Retry-After)
is_count "$retry" && ((retry >= 1 && retry <= window / global)) || fail "503: Retry-After '$retry'"
[ "$(field RateLimit-Policy)" = "\"global\";q=$global;w=$window" ] || fail "503: RateLimit-Policy '$(field RateLimit-Policy)'"
[[ $(field RateLimit) =~ ^\"global\"\;r=0\;t=[0-9]+$ ]] || fail "503: RateLimit '$(field RateLimit)'"
echo "curl: $((i - 1)) new keys granted, then 503 with Retry-After: $retry and RateLimit: $(field RateLimit)"

# --- 4. the bounds ------------------------------------------------------------------------------------
get /stats
[ "$status" = 200 ] || fail "/stats: $status"
printf '%s\n' "$body" >"$work/stats"
read -r _ granted limited busy failed < <(grep '^total ' "$work/stats")
echo "gateway: granted $granted, 429 $limited, 503 $busy, no decision $failed"
[ "$failed" = 0 ] || fail "$failed requests were answered without a decision"
[ "$granted" -eq "$global" ] || fail "the gateway granted $granted, the global limit is $global"
[ "$seen" -le "$granted" ] || fail "the clients saw $seen 200s, the gateway granted $granted"
over=$(awk -v bound="$per_key" '$1 == "key" && $2 > bound' "$work/stats")
[ -z "$over" ] || fail "keys over their bound of $per_key: $over"
while read -r _ key n; do
  stats=$(awk -v key="$key" '$1 == "key" && $5 == key { print $2 }' "$work/stats")
  [ -n "$stats" ] && [ "$n" -le "$stats" ] || fail "key $key: wrk saw $n 200s, the gateway granted '$stats'"
done < <(grep '^granted ' "$work/wrk")
[ "$(awk '$1 == "key" && $5 == "load-hot" { print $2 }' "$work/stats")" = "$per_key" ] ||
  fail "the hot key was granted $(awk '$1 == "key" && $5 == "load-hot" { print $2 }' "$work/stats"), not $per_key"
echo "bounds held: $granted granted of $global, at most $per_key per key; the clients saw $seen"

get /metrics
if [ "$metrics" = yes ]; then
  [ "$status" = 200 ] || fail "/metrics: $status"
  line=$(grep '^redlimit_decisions_total{limiter="gateway-test",outcome="granted"}' "$work/body" || true)
  [ "${line##* }" = "$global" ] || fail "/metrics: '$line', expected $global grants"
  echo "metrics: $line"
else
  [ "$status" = 404 ] || fail "/metrics without the exporter: $status, expected 404"
fi

# --- 5. graceful shutdown ---------------------------------------------------------------------------
exec 3<>"/dev/tcp/127.0.0.1/$port"  # an idle keep-alive connection
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "the gateway exited with $rc after SIGTERM"
[ -z "$(cat <&3)" ] || fail "the idle connection got an answer"
exec 3<&-
grep -q '^gateway: stopped' "$work/log" || fail "no 'stopped' line"
echo "SIGTERM: idle connection closed, exit 0"
