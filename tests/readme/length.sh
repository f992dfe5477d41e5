#!/bin/sh
# length.sh PAGE MAX: fails when PAGE has more than MAX lines (the README is a front page: detail
# belongs in docs/).
lines=$(wc -l < "$1")
if [ "$lines" -gt "$2" ]; then
  echo "$1 has $lines lines; keep it to $2 (move detail to docs/)" >&2
  exit 1
fi
echo "$1: $lines lines (at most $2)"
