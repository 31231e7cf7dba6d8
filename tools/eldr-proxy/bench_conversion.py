#!/usr/bin/python3
"""Benchmark of eldr-proxy's per-request CPU work on a prefill's routed experts: a T-token prompt
of a model with L MoE layers, E experts, top-k (default: 4,096 tokens, 48 layers, 128 experts,
top-8, block size 16, one leading dense layer), random distinct top-k picks per token.

Stages, timed separately (median and p90 of --reps runs, after warm-up):
  decode      vLLM's base64 .npy string -> array (eldr_routed_experts.decode)
  select      MoE-layer selection and prompt cut (CountsBuilder.prompt_ids: eldr_routed_experts'
              MoeLayerMap, which also checks that the dense layers are zeros)
  counts      array -> eldr counts message (CountsBuilder.message: eldr_client.counts_message
              with a TopkIds): the routed-experts-to-counts conversion proper
  hashes      vLLM's sha256_cbor block hashes of the prompt (BlockHasher("vllm"))
  encode      the whole route_request packed with msgpack (what goes on the wire)
  all         decode + select + counts + hashes (the proxy's conversion stage)

usage: bench_conversion.py [--tokens 4096] [--layers 48] [--experts 128] [--top-k 8]
                           [--block-size 16] [--dense 1] [--reps 200] [--cpu] [--json]
"""
import argparse
import base64
import io
import json
import os
import statistics
import sys
import time

import numpy as np

sys.dont_write_bytecode = True
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "cluster", "python"))
sys.path.insert(0, _HERE)

import eldr_proxy_hashes as block_hashes  # noqa: E402
import eldr_proxy_counts as rex  # noqa: E402
from eldr_client import normalize_hash, route_request  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dense", type=int, default=1, help="leading dense layers in vLLM's array")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu", action="store_true",
                    help="time with the thread's CPU clock (a loaded machine inflates wall time "
                         "by the time spent waiting for a core)")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc's malloc thresholds alone (eldr-proxy sets them)")
    a = ap.parse_args()
    if not a.no_malloc_tuning:
        rex.keep_large_allocations()
    T, L, E, k, bs = a.tokens, a.layers, a.experts, a.top_k, a.block_size
    rng = np.random.default_rng(1)
    ids = np.argsort(rng.random((T, L, E), dtype=np.float32), axis=2)[:, :, :k]
    full = np.zeros((T, a.dense + L, k), dtype=np.uint8 if E <= 256 else np.uint16)
    full[:, a.dense:, :] = ids
    buf = io.BytesIO()
    np.save(buf, full, allow_pickle=False)
    routed = base64.b64encode(buf.getvalue()).decode()
    token_ids = rng.integers(0, 150000, size=T).tolist()
    builder = rex.CountsBuilder(L, E, k, "%d-%d" % (a.dense, a.dense + L - 1), bs)
    hasher = block_hashes.BlockHasher("vllm", "0")

    clock = time.thread_time if a.cpu else time.perf_counter
    times = {s: [] for s in ("decode", "select", "counts", "hashes", "encode", "all")}
    for rep in range(a.reps + 10):
        t0 = clock()
        arr = builder.decode(routed)
        t1 = clock()
        sel = builder.prompt_ids(arr, T)
        t2 = clock()
        hashes = hasher.hashes(token_ids, bs)
        t3 = clock()
        msg = builder.message(sel, hashes)
        t4 = clock()
        wire = route_request("bench-%d" % rep, "m", [normalize_hash(h) for h in hashes], msg)
        t5 = clock()
        if rep < 10:
            continue  # warm-up
        times["decode"].append(t1 - t0)
        times["select"].append(t2 - t1)
        times["hashes"].append(t3 - t2)
        times["counts"].append(t4 - t3)
        times["encode"].append(t5 - t4)
        times["all"].append(t4 - t0)
    res = {"clock": "thread CPU" if a.cpu else "wall", "tokens": T, "layers": L, "experts": E,
           "top_k": k, "block_size": bs,
           "blocks": len(msg["blocks"]), "route_request_bytes": len(wire), "reps": a.reps}
    for s, v in times.items():
        v.sort()
        res[s + "_p50_ms"] = round(statistics.median(v) * 1e3, 3)
        res[s + "_p90_ms"] = round(v[int(0.9 * (len(v) - 1))] * 1e3, 3)
    if a.json:
        print(json.dumps(res))
        return 0
    print("%d tokens, L=%d E=%d k=%d, block %d: %d blocks, route_request %d bytes (%s time)"
          % (T, L, E, k, bs, res["blocks"], res["route_request_bytes"], res["clock"]))
    for s in times:
        print("  %-7s p50 %8.3f ms   p90 %8.3f ms" % (s, res[s + "_p50_ms"], res[s + "_p90_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
