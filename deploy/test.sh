#!/usr/bin/env bash
# Runs every eldr test: installs what is missing, builds, and runs all CTest labels
# (unit, integration, fuzz, bench-smoke). Extra arguments go to ctest, e.g. `-L unit`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ELDR_BUILD_DIR:-$root/build}
jobs=${ELDR_JOBS:-$(nproc)}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" "$@"
