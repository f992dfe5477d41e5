#!/usr/bin/env bash
# scripts/run-bench.sh BUILD_DIR: runs every BUILD_DIR/bench/bench_* program (built already, by
# `make bench`) with Google Benchmark's JSON written to bench/results/<name>.json and its console
# output to bench/results/<name>.console.txt, then prints the summaries the programs wrote
# (bench/results/<name>.summary.txt) and joins them into bench/results/summary.txt.
#
# Then it writes docs/benchmarks.md: the hand-written prose of docs/benchmarks.head.md, the
# machine and commit of this run, and each program's summary, fenced. That page is generated:
# edit docs/benchmarks.head.md, not it. `scripts/run-bench.sh --docs-only` writes the page again
# from the summaries of the last run (after an edit of the prose) without running anything.
#
# Each program starts its own throwaway redis-server(s) and stops them when it ends, also when it
# dies of a signal. As a second guard, each program runs in a process group of its own; whatever
# is left in that group when it ends (or when this script is interrupted) is killed.
set -euo pipefail

# The whole script is one function, read before it runs: editing this file during a run (which
# takes minutes) cannot change what the run does.
main() {
  root=$(cd "$(dirname "$0")/.." && pwd)
  results="$root/bench/results"
  if [[ ${1:-} == --docs-only ]]; then
    write_docs
    return 0
  fi
  local build=${1:?usage: scripts/run-bench.sh BUILD_DIR | --docs-only}
  mkdir -p "$results"
  export REDLIMIT_BENCH_RESULTS="$results"

  shopt -s nullglob
  local benches=() exe
  for exe in "$build"/bench/bench_*; do
    [[ -f "$exe" && -x "$exe" ]] && benches+=("$exe")
  done
  if [[ ${#benches[@]} -eq 0 ]]; then
    echo "run-bench: no bench_* programs in $build/bench (build first: make bench)" >&2
    return 1
  fi

  current=""  # process group of the program running now
  trap 'stop_group "$current"; echo "run-bench: interrupted" >&2; exit 130' INT TERM HUP

  local status=0 names=() start_all=$SECONDS start rc name
  rm -f "$results"/*.summary.txt "$results/run.txt"
  record_run "$build" >"$results/run.txt"
  for exe in "${benches[@]}"; do
    name=$(basename "$exe")
    names+=("$name")
    printf 'run-bench: %-22s ' "$name"
    start=$SECONDS
    # setsid: a process group of its own, so leftovers can be found and killed by its id.
    setsid "$exe" --benchmark_out="$results/$name.json" --benchmark_out_format=json \
      >"$results/$name.console.txt" 2>&1 &
    current=$!
    rc=0
    wait "$current" || rc=$?
    if kill -0 -- "-$current" 2>/dev/null; then
      echo "run-bench: $name left processes behind; killing its process group" >&2
      stop_group "$current"
    fi
    current=""
    if [[ $rc -ne 0 ]]; then
      echo "FAILED (exit $rc) after $((SECONDS - start)) s; last lines of bench/results/$name.console.txt:"
      tail -n 20 "$results/$name.console.txt" | sed 's/^/    /'
      echo "$name failed (exit $rc) after $((SECONDS - start)) s" >>"$results/run.txt"
      status=1
    else
      echo "done in $((SECONDS - start)) s"
      echo "$name ran in $((SECONDS - start)) s" >>"$results/run.txt"
    fi
  done
  echo "total $((SECONDS - start_all)) s" >>"$results/run.txt"

  {
    for name in "${names[@]}"; do
      if [[ -f "$results/$name.summary.txt" ]]; then
        cat "$results/$name.summary.txt"
        echo
      fi
    done
    echo "Benchmarks ran in $((SECONDS - start_all)) s. Google Benchmark JSON: bench/results/<name>.json; console: bench/results/<name>.console.txt"
  } >"$results/summary.txt"
  echo
  cat "$results/summary.txt"
  write_docs
  return $status
}

stop_group() {
  local group=$1
  [[ -n "$group" ]] || return 0
  if kill -0 -- "-$group" 2>/dev/null; then
    kill -TERM -- "-$group" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 -- "-$group" 2>/dev/null || return 0
      sleep 0.1
    done
    kill -KILL -- "-$group" 2>/dev/null || true
  fi
}

# The facts about this run that docs/benchmarks.md states, one "key: value" a line, then one line
# per program (appended as each ends). Kept in bench/results/run.txt so --docs-only can reuse it.
record_run() {
  local build=$1 commit dirty="" version
  commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  # Changes not committed in the code that is measured (documentation does not count).
  # (bench/results is what the run writes: not code.)
  if ! git -C "$root" diff --quiet HEAD -- include src lua bench ':!bench/results' CMakeLists.txt cmake 2>/dev/null; then
    dirty=" (with uncommitted changes in include/, src/, lua/, bench/ or the build files)"
  fi
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $commit$dirty"
  echo "machine: $(uname -m), $(nproc) CPUs ($(uname -sr))"
  version=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
  [[ -n "$version" ]] && echo "cpu: $version"
  version=$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([^ ]*\).*/\1/p')
  [[ -n "$version" ]] && echo "redis-server: $version"
  version=$(sed -n 's/^CMAKE_CXX_COMPILER:[^=]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  [[ -n "$version" ]] && echo "compiler: $("$version" --version 2>/dev/null | head -n 1)"
  version=$(sed -n 's/^CMAKE_BUILD_TYPE:[^=]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  [[ -n "$version" ]] && echo "build type: $version ($(basename "$build"))"
  return 0
}

write_docs() {
  local head="$root/docs/benchmarks.head.md" out="$root/docs/benchmarks.md" tmp line name summary
  if [[ ! -f "$head" ]]; then
    echo "run-bench: $head is missing; docs/benchmarks.md not written" >&2
    return 1
  fi
  if [[ ! -f "$results/run.txt" ]]; then
    echo "run-bench: no bench/results/run.txt (run make bench first); docs/benchmarks.md not written" >&2
    return 1
  fi
  tmp="$out.tmp.$$"
  {
    echo "<!-- Generated by scripts/run-bench.sh (make bench) from docs/benchmarks.head.md and"
    echo "     bench/results/*.summary.txt. Do not edit: edit docs/benchmarks.head.md. -->"
    cat "$head"
    echo
    echo "## The run these figures come from"
    echo
    while IFS= read -r line; do
      case $line in
        *": "*) echo "- ${line%%: *}: ${line#*: }" ;;
      esac
    done <"$results/run.txt"
    echo
    echo "Times per program (seconds, wall clock):"
    echo
    while IFS= read -r line; do
      case $line in
        bench_*|total*) echo "- $line" ;;
      esac
    done <"$results/run.txt"
    echo
    echo "## What the programs printed"
    for summary in "$results"/bench_*.summary.txt; do
      [[ -f "$summary" ]] || continue
      name=$(basename "$summary" .summary.txt)
      echo
      echo "### Summary of \`$name\`"
      echo
      echo "From \`bench/results/$name.summary.txt\`:"
      echo
      echo '```text'
      # Trailing blank lines would end up inside the fence.
      sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$summary"
      echo '```'
    done
    while IFS= read -r line; do
      case $line in
        *" failed "*)
          name=${line%% *}
          [[ -f "$results/$name.summary.txt" ]] && continue
          echo
          echo "### Summary of \`$name\`"
          echo
          echo "No summary: $line (see \`bench/results/$name.console.txt\` on the machine that ran it)."
          ;;
      esac
    done <"$results/run.txt"
  } >"$tmp"
  mv "$tmp" "$out"
  echo "run-bench: wrote docs/benchmarks.md"
}

main "$@"
exit $?
