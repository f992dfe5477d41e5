#!/usr/bin/env bash
# check.sh BUILD_DIR CONSUMER_DIR WITH_REDIS CXX [CXXFLAGS [INSTALL_BUILD_DIR]]
# Runs the README's Install section as a user would, then builds and runs consumers of the install
# the ways the README's Linking section shows, with the commands read from README.md so that they
# cannot drift:
#  1. the Install block (```sh under "## Install"): the apt-get line is checked, not run (each
#     package it names must be installed); the cmake lines run from the source root with three
#     substitutions: build/release -> INSTALL_BUILD_DIR (kept between runs, so a second run only
#     re-installs), /opt/redlimit -> a temporary prefix, and no sudo. REDLIMIT_CONSUMER_JOBS, if
#     set, replaces the block's job count (-j N) on a machine that must build with fewer.
#  2. a consumer built with find_package(redlimit CONFIG) (tests/consumer/project, whose two lines
#     must be the README's CMake block's), with the README's pkg-config line and with its plain
#     compiler line, each run against a throwaway redis-server;
#  3. when the build made the exporter (prometheus-cpp found): a consumer of it built with
#     pkg-config redlimit-prometheus and with the README's link line for it;
#  4. a consumer of redlimit::local alone (find_package COMPONENTS local, pkg-config
#     redlimit-local) with the hiredis and OpenSSL headers out of reach: it must build and run
#     without them and link nothing of redlimit, hiredis or OpenSSL.
# The consumers of 2 and 3 are built as the README says (g++, no flags) against the Release
# install; those of 4 with CXX and CXXFLAGS, the preset's (header-only: a sanitizer build checks them too).
set -euo pipefail
build=$1 src=$2 with_redis=$3 cxx=$4 cxxflags=${5:-} install_build=${6:-$1/readme-install}
root=$(cd "$src/../.." && pwd)
readme="$root/README.md"
tmp=$(mktemp -d /tmp/redlimit-consumer-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

fail() {
  echo "check.sh: $*" >&2
  exit 1
}
# The code spans (`...`) of README.md that start with $1, one per line.
spans() { grep -o '`[^`]*`' "$readme" | tr -d '`' | awk -v p="$1" 'index($0, p) == 1'; }
# One span that starts with $1, or fail.
span() {
  local found
  found=$(spans "$1")
  [ -n "$found" ] || fail "README.md has no \`$1...\` any more: update check.sh"
  printf '%s\n' "$found" | head -n 1
}
# README paths -> this check's.
local_paths() {
  local c=$1
  c=${c//\/opt\/redlimit/$prefix}
  printf '%s' "$c"
}

echo "== the README's Install section"
# One suite at a time builds in the shared Release directory.
mkdir -p "$(dirname "$install_build")"
exec 9>"$install_build.lock"
flock 9
# The first ```sh block under "## Install", continuation lines joined.
install_block=$(awk '
  /^## / { section = ($0 == "## Install") }
  section && /^```sh[[:space:]]*$/ && !done { inblock = 1; next }
  inblock && /^```/ { inblock = 0; done = 1; next }
  inblock { print }
' "$readme" | sed -e ':a' -e '/\\$/N; s/[[:space:]]*\\\n[[:space:]]*/ /; ta')
[ -n "$install_block" ] || fail "README.md has no \`\`\`sh block under \"## Install\""
# First every line is checked and its command made, then the commands run: a README that changed
# its paths fails here before anything is built or installed.
lines=() cmds=()
while IFS= read -r line; do
  [ -n "$line" ] || continue
  if [[ $line == "sudo apt-get install "* ]]; then
    missing=""
    for pkg in ${line#sudo apt-get install }; do
      [[ $pkg == -* ]] && continue
      status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
      [ "$status" = installed ] || missing="$missing $pkg"
    done
    [ -z "$missing" ] || fail "packages the Install section names are not installed:$missing"
    echo "   $line   (checked: all installed)"
    continue
  fi
  cmd=${line//sudo /}
  cmd=${cmd//build\/release/$install_build}
  cmd=$(local_paths "$cmd")
  if [ -n "${REDLIMIT_CONSUMER_JOBS:-}" ]; then cmd=$(printf '%s' "$cmd" | sed -E "s/-j ?[0-9]+/-j $REDLIMIT_CONSUMER_JOBS/g"); fi
  # Only cmake, and nothing outside the build directory and the temporary prefix: a README that
  # installs elsewhere must change this check, not the machine.
  while IFS= read -r part; do
    [[ $part =~ ^[[:space:]]*cmake[[:space:]] ]] || fail "an Install command that is not cmake: $part"
  done < <(printf '%s\n' "$cmd" | sed 's/&&/\n/g')
  if [[ $cmd == *"/opt/"* || $cmd == *sudo* ]] || { [[ $cmd == *--install* ]] && [[ $cmd != *"--prefix $prefix"* ]]; }; then
    fail "the Install section changed its paths; update check.sh's substitutions: $line"
  fi
  lines+=("$line")
  cmds+=("$cmd")
done <<<"$install_block"
ran=0
for i in "${!cmds[@]}"; do
  echo "   ${lines[$i]}"
  log="$tmp/install-$i.log"
  if ! (cd "$root" && eval "${cmds[$i]}") >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    fail "this Install command failed: ${cmds[$i]}"
  fi
  ran=$((ran + 1))
done
[ "$ran" -ge 2 ] || fail "the Install section ran $ran cmake commands, expected a configure and a build and install"
[ -e "$prefix/lib/libredlimit.a" ] || fail "the Install section installed no $prefix/lib/libredlimit.a"

echo "== find_package(redlimit CONFIG), the README's CMake lines"
cmake_block=$(awk '/^```cmake[[:space:]]*$/ { inblock = 1; next } inblock && /^```/ { exit } inblock { print }' "$readme" |
  sed -e 's/[[:space:]]*#.*$//' -e 's/my_service/consumer/g')
[ -n "$cmake_block" ] || fail "README.md has no \`\`\`cmake block"
while IFS= read -r line; do
  [ -n "$line" ] || continue
  grep -qxF "$line" "$src/project/CMakeLists.txt" || fail "tests/consumer/project/CMakeLists.txt lacks the README's line: $line"
done <<<"$cmake_block"
cmake -S "$src/project" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
"$with_redis" "$tmp/cmake-build/consumer"

echo "== the README's pkg-config line"
pc_path=$(local_paths "$(span 'PKG_CONFIG_PATH=')")
pc_line=$(span 'g++ -std=c++17 main.cpp $(pkg-config')
echo "   $pc_line"
export "${pc_path?}"
(cd "$src/project" && eval "$pc_line -o $tmp/pc-consumer")
"$with_redis" "$tmp/pc-consumer"

echo "== the README's plain compiler line"
plain_line=$(span 'g++ -std=c++17 -I/opt/redlimit/include main.cpp')
echo "   $plain_line"
(cd "$src/project" && eval "$(local_paths "$plain_line") -o $tmp/plain-consumer")
"$with_redis" "$tmp/plain-consumer"

if [ -e "$prefix/lib/pkgconfig/redlimit-prometheus.pc" ]; then
  echo "== the exporter: pkg-config redlimit-prometheus"
  pkg-config --exists redlimit-prometheus || fail "pkg-config does not find redlimit-prometheus"
  g++ -std=c++17 "$src/prometheus_project/main.cpp" -o "$tmp/pc-prometheus" $(pkg-config --cflags --libs redlimit-prometheus)
  "$tmp/pc-prometheus"
  echo "== the exporter: the README's link line, then redlimit's own flags"
  prom_libs=$(span '-lredlimit_prometheus')
  echo "   $prom_libs"
  prom_line=$(local_paths "$plain_line")
  prom_line=${prom_line/main.cpp/$src/prometheus_project/main.cpp $prom_libs}
  eval "$prom_line -o $tmp/plain-prometheus"
  "$tmp/plain-prometheus"
else
  echo "== (no exporter in the install: prometheus-cpp was not found, as the Install section says)"
fi

empty="$tmp/empty"
mkdir -p "$empty"
# Runs "$@" with /usr/include/hiredis and /usr/include/openssl hidden behind empty directories
# (a private mount namespace), where the kernel allows one; elsewhere it runs "$@" as it is and the
# header and library checks below still hold.
hidden() {
  if unshare -m true 2>/dev/null; then
    unshare -m bash -c 'e=$1; shift; for d in /usr/include/hiredis /usr/include/openssl; do
      if [ -d "$d" ]; then mount --bind "$e" "$d"; fi; done; exec "$@"' _ "$empty" "$@"
  else
    echo "(no mount namespace here: the headers stay visible; the include and link checks still apply)"
    "$@"
  fi
}
no_redis_side() {  # $1: a binary; fails if it links hiredis, OpenSSL or libredlimit
  if ldd "$1" | grep -E 'hiredis|libssl|libcrypto|libredlimit'; then
    echo "check.sh: $1 links the Redis side" >&2
    exit 1
  fi
}

echo "== find_package(redlimit CONFIG COMPONENTS local), without hiredis"
hidden cmake -S "$src/local_project" -B "$tmp/local-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_DISABLE_FIND_PACKAGE_RedlimitHiredis=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  >/dev/null
hidden cmake --build "$tmp/local-build" >/dev/null
no_redis_side "$tmp/local-build/local_consumer"
"$tmp/local-build/local_consumer"

echo "== pkg-config --cflags --libs redlimit-local, without hiredis"
flags=$(pkg-config --cflags --libs redlimit-local)
if "$cxx" -std=c++17 $cxxflags -M $flags "$src/local_project/main.cpp" | grep -E 'hiredis|openssl|fmt/'; then
  echo "check.sh: the local headers include the Redis side" >&2
  exit 1
fi
hidden "$cxx" -std=c++17 $cxxflags "$src/local_project/main.cpp" -o "$tmp/pc-local-consumer" $flags
no_redis_side "$tmp/pc-local-consumer"
"$tmp/pc-local-consumer"
