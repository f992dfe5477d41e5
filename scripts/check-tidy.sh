#!/usr/bin/env bash
# scripts/check-tidy.sh [--fix] [--all]: runs clang-tidy-14 with the root's .clang-tidy on every
# .cpp of the library, examples, benchmarks and test support (--all: the test files too), the
# project's own headers checked through them (HeaderFilterRegex), and fails on any warning. CI
# runs it; `make tidy` too. The compile commands come from a configure-only build directory
# (build/tidy: clang++, C++20, the house warnings plus -Wthread-safety, -Werror, no precompiled
# header): nothing is compiled but the generated Lua header. clang-tidy parses each file as clang
# would compile it, so the compiler's own warnings fail here too, -Wthread-safety's among them.
# The two consumer projects (tests/consumer) build against an installed package, so they are
# checked with the source tree's include directory instead. --fix applies the checks' fixes.
set -euo pipefail
cd "$(dirname "$0")/.."
tidy=$(command -v clang-tidy-14 || command -v clang-tidy)
jobs=${JOBS:-$(nproc)}
fix=()
[[ " $* " == *" --fix "* ]] && fix=(--fix)
start=$(date +%s)
cmake -S . -B build/tidy -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_STANDARD=20 -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-Wall -Wextra -Wpedantic -Wconversion -Wshadow -Wthread-safety -Werror" \
  -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON -DREDLIMIT_UNITY_TESTS=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build build/tidy --target redlimit_generated_headers >/dev/null
# The test files themselves (tests/unit, tests/integration) only with --all: they are compiled
# with -Werror by g++ in three builds and by clang++ in CI's clang suite, and linting them took
# half of this step's time in CI (276 s for all 129 files).
if [[ " $* " == *" --all "* ]]; then
  mapfile -t files < <(git ls-files '*.cpp' | grep -v '^tests/consumer/')
else
  mapfile -t files < <(git ls-files '*.cpp' | grep -v -e '^tests/consumer/' -e '^tests/unit/' -e '^tests/integration/')
fi
mapfile -t consumers < <(git ls-files 'tests/consumer/*.cpp')
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# One file per clang-tidy process, $jobs at a time; --fix edits headers too, so it runs one at a time.
[[ ${#fix[@]} -gt 0 ]] && jobs=1
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 1 "$tidy" -p build/tidy --quiet "${fix[@]}" >>"$log" 2>&1 || status=1
for f in "${consumers[@]}"; do
  "$tidy" --quiet "${fix[@]}" "$f" -- -std=c++17 -Iinclude >>"$log" 2>&1 || status=1
done
if [[ $status -ne 0 ]] || grep -qE '(warning|error):' "$log"; then
  grep -E '(warning|error):' "$log" | sort -u >&2 || cat "$log" >&2
  echo "check-tidy: clang-tidy found problems (above) in $(( ${#files[@]} + ${#consumers[@]} )) files" >&2
  exit 1
fi
echo "check-tidy: $(( ${#files[@]} + ${#consumers[@]} )) files clean ($(( $(date +%s) - start )) s)"
