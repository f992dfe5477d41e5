#!/usr/bin/env bash
# CI step (.ci/run, after the main stages; `make test-hiredis12`): redlimit against hiredis 1.2.0.
# Debian 12 ships only hiredis 0.14.1, which every other stage uses. hiredis 1.2.0's C sources come
# from the npm registry, as the vendored deps/hiredis folder of redis-fast-driver 2.2.6; nothing of
# them is committed. The step:
#   1. `npm pack` the package into a temporary directory, checks the tarball's SHA-256 and the
#      version hiredis.h declares;
#   2. builds hiredis with its own Makefile (no TLS) into the prefix build/hiredis-1.2.0;
#   3. configures the hiredis12 preset against that prefix (-DCMAKE_PREFIX_PATH; the preset
#      requires exactly 1.2.0). The preset is also CI's clang suite and its ThreadSanitizer suite:
#      clang++ as C++20 with -Wthread-safety -Werror, -O1 -fsanitize=thread (one build where there
#      were two: the tsan preset's g++ build and a clang build at -O0). It builds everything but
#      the benchmarks (the library, the tests, the examples and the README's blocks) and checks
#      with ldd that both test binaries load the 1.2 library;
#   4. runs the whole suite but the package tests under ThreadSanitizer, as the tsan preset does
#      (Hiredis.HeaderAndLibraryAreTheOnesConfigureFound among the unit tests).
#
# No npm, or the registry unreachable: the step says so and fails CI. README claims hiredis 1.2.0
# "tested in CI"; a step that passed without testing would let that claim rot unseen. Where the
# registry cannot be reached on purpose, REDLIMIT_SKIP_HIREDIS12=1 skips the step, saying so.
# Any failure to build or test against 1.2 fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
package="redis-fast-driver@2.2.6"
tarball_sha256="861baef471f15919da7f0cff7e74fc98c5aa9164791763956c85c195756dff56"
want="1.2.0"
prefix="$PWD/build/hiredis-$want"

loud() { printf '\n==== hiredis %s step: %s ====\n\n' "$want" "$*" >&2; }

if [ "${REDLIMIT_SKIP_HIREDIS12:-}" = 1 ]; then
  loud "SKIPPED (REDLIMIT_SKIP_HIREDIS12=1): redlimit was NOT tested against hiredis $want"
  exit 0
fi
if ! command -v npm >/dev/null; then
  loud "FAILED: npm is not installed (Debian: apt-get install npm), so hiredis $want could not be fetched"
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'loud "FAILED (see above): redlimit against hiredis $want"' ERR

# 1. Fetch. A private npm cache, so that nothing outside $work is read or written; no scripts run.
echo "== fetching $package from the npm registry (npm $(npm --version))"
if ! (cd "$work" && timeout 180 npm pack "$package" --ignore-scripts --cache "$work/npm-cache" \
  --fetch-retries 1 --loglevel error >"$work/npm-pack.out" 2>&1); then
  cat "$work/npm-pack.out" >&2
  loud "FAILED: npm could not fetch $package (registry unreachable?)"
  exit 1
fi
echo "$tarball_sha256  $work/redis-fast-driver-2.2.6.tgz" | sha256sum --check --quiet
tar -xzf "$work/redis-fast-driver-2.2.6.tgz" -C "$work" package/deps/hiredis
src="$work/package/deps/hiredis"
version=$(awk '/^#define HIREDIS_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END {print v}' "$src/hiredis.h")
if [ "$version" != "$want" ]; then
  loud "FAILED: $package holds hiredis $version, not $want"
  exit 1
fi

# 2. Build and install. The variables are given on the command line because the Makefile takes
# them with ?= from the environment, where LIBRARY_PATH (gcc's search path) may well be set.
echo "== building hiredis $version into $prefix"
rm -rf "$prefix"
make -C "$src" -j2 PREFIX="$prefix" INCLUDE_PATH=include/hiredis LIBRARY_PATH=lib PKGCONF_PATH=pkgconfig \
  USE_SSL=0 install >"$work/hiredis-make.log" 2>&1 || {
  cat "$work/hiredis-make.log" >&2
  loud "FAILED: hiredis $version did not build"
  exit 1
}

# 3. Configure and build.
echo "== building redlimit (clang++, C++20, -Wthread-safety, ThreadSanitizer) and its tests against it"
cmake --preset hiredis12 -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build --preset hiredis12 -j2
for t in unit_tests integration_tests; do
  linked=$(ldd "build/hiredis12/tests/$t" | grep hiredis || true)
  echo "$t: $linked"
  case "$linked" in
    *"$prefix/lib/libhiredis.so."*) ;;
    *) loud "FAILED: $t does not load the libhiredis of $prefix/lib"; exit 1 ;;
  esac
done

# 4. Test.
ctest --preset hiredis12
loud "PASSED: hiredis $version with clang++ C++20 under ThreadSanitizer: the whole suite but the package tests, in $(($(date +%s) - start)) s"
