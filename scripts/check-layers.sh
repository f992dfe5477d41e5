#!/usr/bin/env bash
# The folders of src/ are layers, bottom to top (docs/layout.md). A file may include headers of
# its own folder and of the folders below it, never of one above: this script lists every
# include that goes up and fails if there is one. Run by CI (ctest: unit.layers).
set -euo pipefail
cd "$(dirname "$0")/.."
layers=(base codec config transport topology limiters http prometheus)
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
bad=0
for f in $(git ls-files 'src/*.cpp' 'src/*.hpp'); do
  own=$(echo "$f" | cut -d/ -f2)
  ownRank=$(rank "$own")
  if [ "$ownRank" -lt 0 ]; then echo "$f: not in a layer folder (${layers[*]})"; bad=1; continue; fi
  while IFS= read -r inc; do
    dir=${inc%%/*}
    [ "$dir" = "$inc" ] && { echo "$f: includes \"$inc\" without its folder"; bad=1; continue; }
    r=$(rank "$dir")
    [ "$r" -lt 0 ] && continue  # redlimit/..., generated headers
    if [ "$r" -gt "$ownRank" ]; then echo "$f ($own) includes $inc ($dir, a layer above)"; bad=1; fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f" | grep -v '^redlimit' || true)
done
if [ "$bad" -ne 0 ]; then echo "check-layers: includes that go up the layers (see docs/layout.md)"; exit 1; fi
echo "check-layers: every include of src/ goes down or sideways (${layers[*]})"
