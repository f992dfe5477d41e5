#!/usr/bin/env bash
# check.sh BUILD_DIR CONSUMER_DIR WITH_REDIS CXX [CXXFLAGS [INSTALL_BUILD_DIR]]
# Runs the README's Install section as a user would, then builds and runs consumers of the install
# the ways the README's Linking section shows, with the commands read from README.md so that they
# cannot drift:
#  1. the Install block (```sh under "## Install"): the apt-get line is checked, not run (each
#     package it names must be installed); the cmake lines run from the source root with three
#     substitutions: build/release -> INSTALL_BUILD_DIR (kept between runs, so a second run only
#     re-installs), /opt/redlimit -> a temporary prefix, and no sudo. The block builds the shared
#     library (-DBUILD_SHARED_LIBS=ON); it runs a second time with the README's static choice
#     (-DBUILD_SHARED_LIBS=OFF) into INSTALL_BUILD_DIR-static and a second prefix.
#     REDLIMIT_CONSUMER_JOBS, if set, replaces the block's job count (-j N).
#  2. against each install, a consumer built with find_package(redlimit CONFIG) (tests/consumer/project,
#     whose two lines must be the README's CMake block's), with the README's pkg-config line and
#     with its plain compiler line for that kind of library, each run against a throwaway
#     redis-server. The shared ones run with LD_LIBRARY_PATH unset (the prefix's rpath finds the
#     library) and link libredlimit alone (find_package with hiredis, OpenSSL and date disabled);
#     the static ones link no libredlimit.so;
#  3. when the build made the exporter (prometheus-cpp found): a consumer of it built with
#     pkg-config redlimit-prometheus and with the README's link line for it, against the shared install;
#  4. a consumer of redlimit::local alone (find_package COMPONENTS local, pkg-config
#     redlimit-local) with the hiredis and OpenSSL headers out of reach: it must build and run
#     without them and link nothing of redlimit, hiredis or OpenSSL;
#  5. only where CI=true (CI's throwaway machine: a developer's `make test` never installs a
#     package system-wide): `make package`, dpkg -i of its .deb, the consumers of 2 built against
#     /usr with the README's shared lines less their /opt/redlimit parts and run with neither rpath
#     nor LD_LIBRARY_PATH (ldconfig finds the library), then dpkg --purge.
# The consumers of 2 and 3 are built as the README says (g++, no flags) against the Release
# install; those of 4 with CXX and CXXFLAGS, the preset's (header-only: a sanitizer build checks them too).
set -euo pipefail
build=$1 src=$2 with_redis=$3 cxx=$4 cxxflags=${5:-} install_build=${6:-$1/readme-install}
root=$(cd "$src/../.." && pwd)
readme="$root/README.md"
tmp=$(mktemp -d /tmp/redlimit-consumer-XXXXXX)
deb_installed=""
cleanup() {
  if [ -n "$deb_installed" ]; then dpkg --purge libredlimit-dev >/dev/null || echo "check.sh: dpkg --purge libredlimit-dev failed" >&2; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
prefix="$tmp/prefix"
static_prefix="$tmp/static-prefix"
unset LD_LIBRARY_PATH

fail() {
  echo "check.sh: $*" >&2
  exit 1
}
# The code spans (`...`) of README.md that start with $1, one per line.
spans() { grep -o '`[^`]*`' "$readme" | tr -d '`' | awk -v p="$1" 'index($0, p) == 1'; }
# One span that starts with $1 (and contains $2, if given), or fail.
span() {
  local found
  found=$(spans "$1" | grep -F -e "${2:-}" || true)
  [ -n "$found" ] || fail "README.md has no \`$1...${2:-}...\` any more: update check.sh"
  printf '%s\n' "$found" | head -n 1
}
# README paths -> this check's: /opt/redlimit -> $2 (the shared install's prefix if not given).
local_paths() {
  local c=$1
  c=${c//\/opt\/redlimit/${2:-$prefix}}
  printf '%s' "$c"
}
# $1 less its words that name /opt/redlimit: the line for a library installed into /usr.
system_paths() { printf '%s' "$1" | tr ' ' '\n' | grep -v '/opt/redlimit' | tr '\n' ' '; }

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
shared_flag=-DBUILD_SHARED_LIBS=ON
static_flag=$(span '-DBUILD_SHARED_LIBS=OFF')
[[ $install_block == *"$shared_flag"* ]] || fail "the Install block does not build the shared library ($shared_flag)"
# install_block_run LABEL BUILD_DIR PREFIX [FROM TO]: the block with FROM replaced by TO. First every
# line is checked and its command made, then the commands run: a README that changed its paths
# fails here before anything is built or installed.
install_block_run() {
  local label=$1 dir=$2 pfx=$3 from=${4:-} to=${5:-} line cmd part i log ran=0
  local lines=() cmds=()
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    if [[ $line == "sudo apt-get install "* ]]; then
      local missing="" pkg status
      for pkg in ${line#sudo apt-get install }; do
        [[ $pkg == -* ]] && continue
        status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
        [ "$status" = installed ] || missing="$missing $pkg"
      done
      [ -z "$missing" ] || fail "packages the Install section names are not installed:$missing"
      [ "$label" != shared ] || echo "   $line   (checked: all installed)"
      continue
    fi
    [ -z "$from" ] || line=${line//$from/$to}
    cmd=${line//sudo /}
    cmd=${cmd//build\/release/$dir}
    cmd=$(local_paths "$cmd" "$pfx")
    if [ -n "${REDLIMIT_CONSUMER_JOBS:-}" ]; then cmd=$(printf '%s' "$cmd" | sed -E "s/-j ?[0-9]+/-j $REDLIMIT_CONSUMER_JOBS/g"); fi
    # Only cmake, and nothing outside the build directory and the temporary prefix: a README that
    # installs elsewhere must change this check, not the machine.
    while IFS= read -r part; do
      [[ $part =~ ^[[:space:]]*cmake[[:space:]] ]] || fail "an Install command that is not cmake: $part"
    done < <(printf '%s\n' "$cmd" | sed 's/&&/\n/g')
    if [[ $cmd == *"/opt/"* || $cmd == *sudo* ]] || { [[ $cmd == *--install* ]] && [[ $cmd != *"--prefix $pfx"* ]]; }; then
      fail "the Install section changed its paths; update check.sh's substitutions: $line"
    fi
    lines+=("$line")
    cmds+=("$cmd")
  done <<<"$install_block"
  for i in "${!cmds[@]}"; do
    echo "   ($label) ${lines[$i]}"
    log="$tmp/install-$label-$i.log"
    if ! (cd "$root" && eval "${cmds[$i]}") >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      fail "this Install command failed: ${cmds[$i]}"
    fi
    ran=$((ran + 1))
  done
  [ "$ran" -ge 2 ] || fail "the Install section ran $ran cmake commands, expected a configure and a build and install"
}
install_block_run shared "$install_build" "$prefix"
[ -e "$prefix/lib/libredlimit.so.0" ] && [ ! -e "$prefix/lib/libredlimit.a" ] ||
  fail "the Install section installed no $prefix/lib/libredlimit.so.0, or a libredlimit.a beside it"
install_block_run static "$install_build-static" "$static_prefix" "$shared_flag" "$static_flag"
[ -e "$static_prefix/lib/libredlimit.a" ] && [ ! -e "$static_prefix/lib/libredlimit.so" ] ||
  fail "the static choice installed no $static_prefix/lib/libredlimit.a, or a libredlimit.so beside it"

# links_shared BINARY DIR: BINARY needs libredlimit.so.0, which the dynamic linker finds in DIR, and
# none of the library's own dependencies (a shared consumer links -lredlimit alone).
links_shared() {
  local found
  found=$(ldd "$1" | awk '$1 == "libredlimit.so.0" { print $3 }')
  [ -n "$found" ] && [ "$(realpath "$found")" = "$(realpath "$2/libredlimit.so.0")" ] ||
    fail "$1 finds libredlimit.so.0 at '${found}', not in $2"
  if objdump -p "$1" | awk '$1 == "NEEDED"' | grep -E 'hiredis|libssl|libcrypto|date-tz'; then
    fail "$1 links the library's dependencies itself: a shared consumer needs -lredlimit alone"
  fi
}
links_static() {
  if ldd "$1" | grep libredlimit; then fail "$1 links a shared libredlimit, not the static one"; fi
}
# consumers LABEL KIND PREFIX LIBDIR PKG_LINE PLAIN_LINE: the three consumers of 2, built into
# $tmp/LABEL and run, then checked by links_KIND. PREFIX empty: the system's (/usr), nothing added.
consumers() {
  local label=$1 kind=$2 pfx=$3 libdir=$4 pc_line=$5 plain_line=$6 out="$tmp/$1"
  mkdir -p "$out"
  echo "== ($label) redlimit.pc: -lredlimit alone, its dependencies with --static"
  local libs static_libs l
  libs=$(pkg-config --libs redlimit)
  static_libs=$(pkg-config --static --libs redlimit)
  echo "   pkg-config --libs: $libs; --static: $static_libs"
  if grep -E 'hiredis|ssl|crypto|date-tz' <<<"$libs"; then fail "pkg-config --libs redlimit names more than -lredlimit"; fi
  for l in -lredlimit -lhiredis -lssl -lcrypto -ldate-tz -pthread; do
    [[ " $static_libs " == *" $l "* ]] || fail "pkg-config --static --libs redlimit lacks $l"
  done
  echo "== ($label) find_package(redlimit CONFIG), the README's CMake lines"
  # A shared libredlimit carries its dependencies: its package config must not look for them.
  local no_deps=()
  [ "$kind" != shared ] || no_deps=(--no-warn-unused-cli -DCMAKE_DISABLE_FIND_PACKAGE_RedlimitHiredis=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON -DCMAKE_DISABLE_FIND_PACKAGE_date=ON)
  cmake -S "$src/project" -B "$out/cmake-build" ${pfx:+-DCMAKE_PREFIX_PATH="$pfx"} "${no_deps[@]}" >/dev/null
  cmake --build "$out/cmake-build" >/dev/null
  "$with_redis" "$out/cmake-build/consumer"
  "links_$kind" "$out/cmake-build/consumer" "$libdir"
  echo "== ($label) the README's pkg-config line: $pc_line"
  (cd "$src/project" && eval "$pc_line -o $out/pc-consumer")
  "$with_redis" "$out/pc-consumer"
  "links_$kind" "$out/pc-consumer" "$libdir"
  echo "== ($label) the README's plain compiler line: $plain_line"
  (cd "$src/project" && eval "$plain_line -o $out/plain-consumer")
  "$with_redis" "$out/plain-consumer"
  "links_$kind" "$out/plain-consumer" "$libdir"
}

cmake_block=$(awk '/^```cmake[[:space:]]*$/ { inblock = 1; next } inblock && /^```/ { exit } inblock { print }' "$readme" |
  sed -e 's/[[:space:]]*#.*$//' -e 's/my_service/consumer/g')
[ -n "$cmake_block" ] || fail "README.md has no \`\`\`cmake block"
while IFS= read -r line; do
  [ -n "$line" ] || continue
  grep -qxF "$line" "$src/project/CMakeLists.txt" || fail "tests/consumer/project/CMakeLists.txt lacks the README's line: $line"
done <<<"$cmake_block"
pc_path=$(span 'PKG_CONFIG_PATH=')
pc_shared=$(span 'g++ -std=c++17 main.cpp $(pkg-config --cflags --libs redlimit)' '-Wl,-rpath,/opt/redlimit/lib')
pc_static=$(span 'g++ -std=c++17 main.cpp $(pkg-config --static --cflags --libs redlimit)')
plain_shared=$(span 'g++ -std=c++17 -I/opt/redlimit/include main.cpp' '-Wl,-rpath,/opt/redlimit/lib')
plain_static=$(span 'g++ -std=c++17 -I/opt/redlimit/include main.cpp' '-ldate-tz')
[[ $plain_static != *rpath* ]] || fail "the static plain line names an rpath: $plain_static"
(
  export "$(local_paths "$pc_path")"
  consumers shared shared "$prefix" "$prefix/lib" "$(local_paths "$pc_shared")" "$(local_paths "$plain_shared")"
)
(
  export "$(local_paths "$pc_path" "$static_prefix")"
  consumers static static "$static_prefix" "" "$pc_static" "$(local_paths "$plain_static" "$static_prefix")"
)

export "$(local_paths "$pc_path")"
if [ -e "$prefix/lib/pkgconfig/redlimit-prometheus.pc" ]; then
  echo "== the exporter: pkg-config redlimit-prometheus"
  pkg-config --exists redlimit-prometheus || fail "pkg-config does not find redlimit-prometheus"
  g++ -std=c++17 "$src/prometheus_project/main.cpp" -o "$tmp/pc-prometheus" $(pkg-config --cflags --libs redlimit-prometheus) \
    -Wl,-rpath,"$prefix/lib"
  "$tmp/pc-prometheus"
  echo "== the exporter: the README's link line, then redlimit's own flags"
  prom_libs=$(span '-lredlimit_prometheus')
  echo "   $prom_libs"
  prom_line=$(local_paths "$plain_shared")
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

if [ "${CI:-}" != true ]; then
  echo "== (the .deb: dpkg -i runs only where CI=true, on CI's throwaway machine)"
  exit 0
fi
echo "== make package, then dpkg -i of its .deb"
[ "$(dpkg-query -W -f='${db:Status-Status}' libredlimit-dev 2>/dev/null || true)" != installed ] ||
  fail "libredlimit-dev is already installed here: this check installs and removes its own"
if ! make -C "$root" package JOBS="${REDLIMIT_CONSUMER_JOBS:-2}" >"$tmp/package.log" 2>&1; then
  tail -n 40 "$tmp/package.log" >&2
  fail "make package failed"
fi
debs=("$root"/build/package/libredlimit-dev_*.deb)
[ ${#debs[@]} -eq 1 ] && [ -e "${debs[0]}" ] || fail "make package made no one build/package/libredlimit-dev_*.deb: ${debs[*]}"
deb_installed=yes
dpkg -i "${debs[0]}" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg -i ${debs[0]} failed"; }
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
[ -e "/usr/lib/$multiarch/libredlimit.so.0" ] || fail "the package installed no /usr/lib/$multiarch/libredlimit.so.0"
(
  unset PKG_CONFIG_PATH
  consumers deb shared "" "/usr/lib/$multiarch" "$(system_paths "$pc_shared")" "$(system_paths "$plain_shared")"
)
for b in "$tmp"/deb/cmake-build/consumer "$tmp"/deb/pc-consumer "$tmp"/deb/plain-consumer; do
  if objdump -p "$b" | grep -E 'RPATH|RUNPATH'; then fail "$b carries an rpath: the system's library needs none"; fi
done
