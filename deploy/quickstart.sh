#!/usr/bin/env bash
# The main job on the embedded default: installs what is missing, builds eldr (Release), starts an
# eldr-node with no configuration (one node, all roles, loopback ports 5700-5702, metrics on
# 9700, data under ./out/node), plays a short synthetic workload through it with eldr-loadgen
# (emulated prefill and decode workers over real sockets) under ELDR and JSQ, prints the summary
# table and the node's status, and runs the offline simulator on the same workload for
# comparison. Results land in ./out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ELDR_BUILD_DIR:-$root/build-release}
out=${ELDR_OUT_DIR:-$root/out}
jobs=${ELDR_JOBS:-$(nproc)}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DELDR_BUILD_TESTS=OFF -DELDR_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target eldr-node eldrctl eldr-loadgen eldr-fit eldr-sim
mkdir -p "$out/node"
rm -f "$out/node/ready.json"

echo
echo "== eldr-node on the embedded default =="
# The embedded default keeps its RocksDB stores under ./eldr-data: run it from out/node.
(cd "$out/node" && exec "$build/tools/eldr-node/eldr-node" --ready-file ready.json \
  >"$out/node/node.log" 2>&1) &
node_pid=$!
stop_node() { kill -TERM "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true; }
trap stop_node EXIT
for _ in $(seq 1 300); do
  [ -s "$out/node/ready.json" ] && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$out/node/node.log"; exit 1; }
  sleep 0.1
done
[ -s "$out/node/ready.json" ] || { echo "eldr-node did not start"; cat "$out/node/node.log"; exit 1; }
cat "$out/node/ready.json"; echo

echo
echo "== eldr-loadgen: synthetic qwen-task, 20 req/s for 30 s (model time, played 4x faster), 8 decode workers, ELDR vs JSQ =="
"$build/tools/eldr-loadgen/eldr-loadgen" --node tcp://127.0.0.1:5702 --synthetic qwen-task \
  --rate 20 --duration 30 --decode-workers 8 --time-scale 4 --policies eldr,jsq --seed 1 \
  --quiet | tee "$out/loadgen.txt"

echo
echo "== eldrctl status =="
"$build/tools/eldrctl/eldrctl" --node tcp://127.0.0.1:5702 status

stop_node
trap - EXIT

echo
echo "== eldr-sim: the same workload offline (simulator, same policies and cost model) =="
"$build/tools/eldr-sim/eldr-sim" --synthetic qwen-task --requests 600 --rate 20 \
  --policies eldr,jsq --decode-workers 8 --seed 1 --out "$out/sim-qwen-task" 2>/dev/null
cat "$out/sim-qwen-task/summary.md"
echo
echo "node log, loadgen table and simulator tables are in $out"
