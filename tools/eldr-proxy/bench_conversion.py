#!/usr/bin/python3
"""Benchmark of eldr-proxy's per-request CPU work on a prefill's routed experts: a T-token prompt
of a model with L MoE layers, E experts, top-k (default: 4,096 tokens, 48 layers, 128 experts,
top-8, block size 16, one leading dense layer), random distinct top-k picks per token.

Stages, timed separately (median and p90 of --reps runs, after warm-up):
  decode      vLLM's base64 .npy string -> array (CountsBuilder.decode): with numpy
              (eldr_routed_experts.decode: binascii, the header by ast) or with the compiled
              library (base64 by OpenSSL, the header by routed_experts_npy.cpp), per conversion;
              the two arrays are checked to be equal
  select      MoE-layer selection and prompt cut (CountsBuilder.prompt_ids: eldr_routed_experts'
              MoeLayerMap, which also checks that the dense layers are zeros), per conversion
  counts      array -> eldr counts message (CountsBuilder.message): the routed-experts-to-counts
              conversion proper, with numpy (eldr_client.counts_message with a TopkIds) and
              with the compiled library (eldr_proxy_native: libeldr_counts_native.so), each
              timed on the same input in every rep and reported side by side (counts_numpy,
              counts_native); the two messages are checked to be the same bytes
  hashes      vLLM's sha256_cbor block hashes of the prompt (BlockHasher("vllm")): with cbor2
              and hashlib, or with the compiled library (canonical CBOR written by
              block_hashes_native.cpp, OpenSSL's SHA-256), per conversion; the two lists of
              digests are checked to be equal
  encode      the whole route_request packed (what goes on the wire), per conversion
  all         decode + select + counts + hashes (the proxy's conversion stage), per conversion
  answer      the prefill's JSON answer that carries the routed experts (and the prompt's token
              ids) parsed: answer_json with json.loads, answer_load with
              eldr_routed_experts.load_answer, which eldr-proxy calls (the two values are checked
              to be equal); not part of `all`

--conversion numpy or native times one of the two; both (the default) needs the library, found
as eldr-proxy finds it ($ELDR_COUNTS_NATIVE, else beside eldr_proxy_native.py) or at --native-lib
(in a build tree: build/tools/eldr-proxy/libeldr_counts_native.so).

usage: bench_conversion.py [--tokens 4096] [--layers 48] [--experts 128] [--top-k 8]
                           [--block-size 16] [--dense 1] [--reps 200] [--cpu] [--json]
                           [--conversion both|numpy|native] [--native-lib PATH]
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
import eldr_routed_experts  # noqa: E402
import eldr_proxy_native  # noqa: E402
import msgpack  # noqa: E402
from eldr_client import route_request  # noqa: E402


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
    ap.add_argument("--conversion", choices=("both", "numpy", "native"), default="both")
    ap.add_argument("--native-lib", help="libeldr_counts_native.so (default: as eldr-proxy "
                    "finds it)")
    a = ap.parse_args()
    kinds = ("numpy", "native") if a.conversion == "both" else (a.conversion,)
    native = None
    if "native" in kinds:
        path = a.native_lib or eldr_proxy_native.library_path()
        try:
            native = eldr_proxy_native.NativeCounts(path)
        except (OSError, TypeError) as e:
            sys.stderr.write("bench_conversion: the compiled conversion does not load (%s): "
                             "give --native-lib or --conversion numpy\n" % e)
            return 2
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
    spec = "%d-%d" % (a.dense, a.dense + L - 1)
    builders = {"numpy": rex.CountsBuilder(L, E, k, spec, bs),
                "native": rex.CountsBuilder(L, E, k, spec, bs, native=native)}
    hashers = {"numpy": block_hashes.BlockHasher("vllm", "0"),
               "native": block_hashes.BlockHasher("vllm", "0", native=native)}

    answer = json.dumps({"id": "cmpl-bench", "object": "text_completion", "model": "m",
                         "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                                      "prompt_token_ids": token_ids, "routed_experts": routed}],
                         "kv_transfer_params": {"do_remote_prefill": True,
                                                "remote_block_ids": list(range(T // bs)),
                                                "remote_engine_id": "e", "remote_host": "h",
                                                "remote_port": 1}}).encode()
    if eldr_routed_experts.load_answer(answer) != json.loads(answer):
        sys.stderr.write("bench_conversion: load_answer and json.loads differ\n")
        return 1

    clock = time.thread_time if a.cpu else time.perf_counter
    stages = ["answer_json", "answer_load"]
    for kind in kinds:
        stages += ["decode_" + kind, "select_" + kind, "hashes_" + kind, "counts_" + kind,
                   "encode_" + kind, "all_" + kind]
    times = {s: [] for s in stages}
    for rep in range(a.reps + 10):
        for stage, parse in (("answer_json", json.loads),
                             ("answer_load", eldr_routed_experts.load_answer)):
            t0 = clock()
            parse(answer)
            if rep >= 10:
                times[stage].append(clock() - t0)
        wires, arrays, digests = {}, {}, {}
        for kind in kinds:
            b = builders[kind]
            t0 = clock()
            arr = b.decode(routed)
            t1 = clock()
            sel = b.prompt_ids(arr, T)
            t2 = clock()
            hashes = hashers[kind].hashes(token_ids, bs)
            t3 = clock()
            keys = rex.block_keys(hashes)  # as eldr-proxy: once, for the counts and the route
            msg = b.message(sel, keys)
            t4 = clock()
            wires[kind] = route_request("bench-%d" % rep, "m", keys, msg)
            t5 = clock()
            arrays[kind] = arr
            digests[kind] = hashes
            if rep >= 10:
                times["decode_" + kind].append(t1 - t0)
                times["select_" + kind].append(t2 - t1)
                times["hashes_" + kind].append(t3 - t2)
                times["counts_" + kind].append(t4 - t3)
                times["encode_" + kind].append(t5 - t4)
                times["all_" + kind].append(t4 - t0)
        if len(digests) == 2 and digests["numpy"] != digests["native"]:
            sys.stderr.write("bench_conversion: the numpy and native block hashes differ\n")
            return 1
        if len(set(wires.values())) != 1:
            sys.stderr.write("bench_conversion: the numpy and native route_requests differ\n")
            return 1
        if len(arrays) == 2 and not (arrays["numpy"].dtype == arrays["native"].dtype
                                     and np.array_equal(arrays["numpy"], arrays["native"])):
            sys.stderr.write("bench_conversion: the numpy and native decodes differ\n")
            return 1
    wire = wires[kinds[0]]
    n_blocks = len(msgpack.unpackb(wire, raw=False)["counts"]["blocks"])
    res = {"clock": "thread CPU" if a.cpu else "wall", "tokens": T, "layers": L, "experts": E,
           "top_k": k, "block_size": bs, "conversion": a.conversion,
           "blocks": n_blocks, "route_request_bytes": len(wire), "reps": a.reps}
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
        print("  %-13s p50 %8.3f ms   p90 %8.3f ms" % (s, res[s + "_p50_ms"], res[s + "_p90_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
