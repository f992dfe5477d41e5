#!/usr/bin/env bash
# scripts/run-bench.sh BUILD_DIR: runs every BUILD_DIR/bench/bench_* program (built already, by
# `make bench`) with Google Benchmark's JSON written to bench/results/<name>.json and its console
# output to bench/results/<name>.console.txt, then prints the summaries the programs wrote
# (bench/results/<name>.summary.txt) and joins them into bench/results/summary.txt.
#
# Each program starts its own throwaway redis-server(s) and stops them when it ends, also when it
# dies of a signal. As a second guard, each program runs in a process group of its own; whatever
# is left in that group when it ends (or when this script is interrupted) is killed.
set -euo pipefail

build=${1:?usage: scripts/run-bench.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
results="$root/bench/results"
mkdir -p "$results"
export REDLIMIT_BENCH_RESULTS="$results"

shopt -s nullglob
benches=()
for exe in "$build"/bench/bench_*; do
  [[ -f "$exe" && -x "$exe" ]] && benches+=("$exe")
done
if [[ ${#benches[@]} -eq 0 ]]; then
  echo "run-bench: no bench_* programs in $build/bench (build first: make bench)" >&2
  exit 1
fi

current=""  # process group of the program running now
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
trap 'stop_group "$current"; echo "run-bench: interrupted" >&2; exit 130' INT TERM HUP

status=0
names=()
start_all=$SECONDS
for exe in "${benches[@]}"; do
  name=$(basename "$exe")
  names+=("$name")
  rm -f "$results/$name.summary.txt"
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
    status=1
  else
    echo "done in $((SECONDS - start)) s"
  fi
done

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
exit $status
