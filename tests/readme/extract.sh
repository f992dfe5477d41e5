#!/bin/sh
# extract.sh FILE OUTDIR PREFIX: writes the N-th ```cpp block of the Markdown FILE to
# OUTDIR/PREFIX_block_N.cpp (N from 1), headed by a #line directive, so that a compiler message
# names FILE and its line. A file whose text did not change is left alone (no rebuild); files of
# PREFIX's blocks that FILE no longer has are removed. Prints how many blocks FILE has.
set -eu
file=$1 out=$2 prefix=$3
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk -v out="$tmp" -v prefix="$prefix" -v name="$file" '
  /^```cpp[[:space:]]*$/ {
    if (inblock) { printf "%s:%d: a ```cpp block inside another\n", name, NR > "/dev/stderr"; exit 1 }
    n++; path = out "/" prefix "_block_" n ".cpp"; inblock = 1
    printf "#line %d \"%s\"\n", NR + 1, name > path
    next
  }
  /^```/ && inblock { inblock = 0; close(path); next }
  inblock { print > path }
  END {
    if (inblock) { printf "%s: a ```cpp block is not closed\n", name > "/dev/stderr"; exit 1 }
    print n + 0 > (out "/count")
  }
' "$file"
for old in "$out/${prefix}"_block_*.cpp; do
  [ -e "$old" ] || continue
  [ -e "$tmp/$(basename "$old")" ] || rm -f "$old"
done
for new in "$tmp/${prefix}"_block_*.cpp; do
  [ -e "$new" ] || continue
  cmp -s "$new" "$out/$(basename "$new")" 2>/dev/null || cp "$new" "$out/$(basename "$new")"
done
cat "$tmp/count"
