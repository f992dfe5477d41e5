#!/usr/bin/env bash
# check.sh BUILD_DIR CONSUMER_DIR WITH_REDIS CXX [CXXFLAGS]
# Installs the built library into a temporary prefix, then builds and runs a consumer three ways:
# CMake find_package(redlimit CONFIG), pkg-config, and a plain compiler line; then a consumer of
# redlimit::local alone (find_package COMPONENTS local, pkg-config redlimit-local) with the
# hiredis and OpenSSL headers out of reach: it must build and run without them and link nothing
# of redlimit, hiredis or OpenSSL. CXXFLAGS are the
# flags the library was built with (a sanitizer build needs its runtime in the consumer too).
set -euo pipefail
build=$1 src=$2 with_redis=$3 cxx=$4 cxxflags=${5:-}
tmp=$(mktemp -d /tmp/redlimit-consumer-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null

echo "== find_package(redlimit CONFIG)"
cmake -S "$src/project" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxxflags" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
"$with_redis" "$tmp/cmake-build/consumer"

echo "== pkg-config --cflags --libs redlimit"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$(ls -d "$tmp"/prefix/lib/*/pkgconfig 2>/dev/null | tr '\n' ':')"
flags=$(pkg-config --cflags --libs redlimit)
"$cxx" -std=c++17 $cxxflags "$src/project/main.cpp" -o "$tmp/pc-consumer" $flags
"$with_redis" "$tmp/pc-consumer"

echo "== plain g++ line"
libdir=$(dirname "$(find "$tmp/prefix" -name 'libredlimit.a' | head -n 1)")
"$cxx" -std=c++17 $cxxflags -I"$tmp/prefix/include" "$src/project/main.cpp" -o "$tmp/plain-consumer" \
  -L"$libdir" -lredlimit -lhiredis -lssl -lcrypto -pthread
"$with_redis" "$tmp/plain-consumer"

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
