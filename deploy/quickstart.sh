#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds eldr (Release), then runs
# the offline fit on a bundled synthetic workload (Qwen3-30B-A3B-like geometry, 16 decode workers)
# and, when the shared real traces are present, on the real DeepSeek-V2-Lite (ESFT) trace, and
# simulates the synthetic Task workload under ELDR and the load balancers. Results land in ./out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ELDR_BUILD_DIR:-$root/build-release}
out=${ELDR_OUT_DIR:-$root/out}
jobs=${ELDR_JOBS:-$(nproc)}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DELDR_BUILD_TESTS=OFF -DELDR_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target eldr-fit eldr-sim
mkdir -p "$out"

echo
echo "== eldr-fit on the synthetic qwen-task workload (2,000 requests, 16 decode workers) =="
"$build/tools/eldr-fit/eldr-fit" --synthetic qwen-task --requests 2000 --workers 16 --seed 1 \
  --out "$out/qwen-task.centroids" --report "$out/qwen-task.report.json"

shared_data=${ELDR_SHARED_DATA:-$root/../shared/data}
if [ -f "$shared_data/esft-deepseek-v2-lite.eldrtrace" ]; then
  echo
  echo "== eldr-fit on the real ESFT (DeepSeek-V2-Lite) trace, 8 decode workers =="
  "$build/tools/eldr-fit/eldr-fit" --trace "$shared_data/esft-deepseek-v2-lite.eldrtrace" \
    --workers 8 --seed 1 --out "$out/esft.centroids" --report "$out/esft.report.json"
fi
echo
echo "== eldr-sim: synthetic qwen-task, 1,500 requests at 40 req/s, 8 prefill + 16 decode workers =="
"$build/tools/eldr-sim/eldr-sim" --synthetic qwen-task --requests 1500 --rate 40 \
  --policies rr,random,jsq,p2c,domain,eldr --decode-workers 16 --prefill-workers 8 --seed 1 \
  --out "$out/sim-qwen-task" 2>/dev/null
cat "$out/sim-qwen-task/summary.md"
echo
echo "centroid files, JSON reports and simulator tables are in $out"
