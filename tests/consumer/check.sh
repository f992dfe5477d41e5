#!/usr/bin/env bash
# check.sh BUILD_DIR CONSUMER_DIR WITH_REDIS CXX [CXXFLAGS]
# Installs the built library into a temporary prefix, then builds and runs a consumer three ways:
# CMake find_package(redlimit CONFIG), pkg-config, and a plain compiler line. CXXFLAGS are the
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
