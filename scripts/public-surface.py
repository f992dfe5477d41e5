#!/usr/bin/env python3
"""Counts redlimit's public surface: the classes, structs, unions, enums and type aliases declared
at namespace scope in include/redlimit/ outside redlimit::detail (read by universal-ctags), and
the public classes that derive from a detail:: type.

    scripts/public-surface.py            # the count, the types by header, the detail bases
    scripts/public-surface.py --count    # the count alone
    scripts/public-surface.py --max N    # exit 1 when the count passes N

Nested types (Client::Stats, MultiLimit::Entry) belong to their class and are not counted, as a
reader meets them through it. Needs `ctags` (Debian: universal-ctags).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

KINDS = {"class", "struct", "union", "enum", "typedef"}  # ctags calls `using X = ...` a typedef


def tags(headers):
    out = subprocess.run(
        ["ctags", "--output-format=json", "--language-force=C++", "--kinds-C++=csgtu", "--fields=+Ssi", "-f", "-"]
        + headers,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--max", type=int)
    args = parser.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    headers = sorted(glob.glob(os.path.join(root, "include", "redlimit", "*.hpp")))
    public, detailBases = [], []
    for t in tags(headers):
        if t.get("kind") not in KINDS or t.get("scopeKind") != "namespace":
            continue
        scope = t.get("scope", "")
        if "detail" in scope.split("::"):
            continue
        public.append((os.path.relpath(t["path"], root), scope, t["name"], t["kind"]))
        for base in (t.get("inherits") or "").split(","):
            if "detail::" in base:
                detailBases.append(f"{scope}::{t['name']} : {base.strip()}")
    if args.count:
        print(len(public))
    else:
        for path, scope, name, kind in sorted(public):
            print(f"{path:50} {kind:8} {scope}::{name}")
        print(f"\npublic types at namespace scope: {len(public)}")
        print(f"public classes deriving from detail:: types: {len(detailBases)}")
        for line in detailBases:
            print(f"  {line}")
    if args.max is not None and len(public) > args.max:
        print(f"public types: {len(public)} > {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
