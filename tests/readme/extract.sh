#!/bin/sh
# extract.sh README.md OUTDIR: writes every ```cpp block of the README to OUTDIR/block_N.cpp.
set -eu
mkdir -p "$2"
rm -f "$2"/block_*.cpp
awk -v out="$2" '
  /^```cpp[[:space:]]*$/ { n++; file = out "/block_" n ".cpp"; inblock = 1; next }
  /^```/ && inblock { inblock = 0; close(file); next }
  inblock { print > file }
' "$1"
