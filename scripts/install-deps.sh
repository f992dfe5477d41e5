#!/usr/bin/env bash
# Installs the Debian 12 packages redlimit needs to build, test and benchmark, if any is missing,
# plus any packages named on the command line (make test-clang adds clang). curl and wrk: the HTTP
# clients of the gateway example's test (tests/gateway/check.sh).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libhiredis-dev libssl-dev libhowardhinnant-date-dev tzdata libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev libboost-dev libasio-dev redis-server redis-tools curl wrk openssl "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "Installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian package may start a system redis-server on 6379; tests never use it.
