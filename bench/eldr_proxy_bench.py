#!/usr/bin/python3
"""eldr-proxy's overhead and throughput, with real processes on this machine: this build's
eldr-node, one eldr-proxy, fake vLLM prefill and decode instances (tests/fakes/fake_vllm.py,
--time-scale 0: no simulated GPU time, so every millisecond measured is software) serving the
REAL ESFT trace, and an aiohttp load generator in this process.

overhead     open-loop Poisson arrivals at --rate for --duration s, streaming --tokens tokens,
             prompts of --prompt-tokens tokens, alternating between two paths:
               direct  the client itself runs vLLM's P/D flow (toy_proxy_server.py's): prefill
                       on a prefill instance with kv_transfer_params, then the decode request,
                       streamed, to a decode instance (round robin), no proxy, no eldr;
               proxy   the same request to eldr-proxy (prefill, conversion, route, decode relay).
             Latency = request sent to last byte of the stream; overhead = proxy - direct at
             p50 and p99 (the proxy's extra HTTP hop, JSON work, conversion, route call).
throughput   closed loop: --concurrency clients send non-streaming requests of
             --throughput-tokens tokens back to back for --duration s through the proxy
             with eldr deciding; requests/s, and the proxy's CPU seconds per request (from
             /proc), i.e. what one proxy process could serve with a core to itself.

usage: eldr_proxy_bench.py --build-dir BUILD [--mode overhead|throughput|both] [--rate 50]
       [--duration 20] [--tokens 64] [--prompt-tokens 256] [--concurrency 64] [--json]
Needs ../shared/data (or --shared-data / $ELDR_SHARED_DATA).
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

import aiohttp

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "py"))
sys.path.insert(0, os.path.join(ROOT, "tests", "adversarial"))
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
import eldr_client_aio as aio  # noqa: E402
import eldr_live as live  # noqa: E402
from proxy_harness import (BLOCK, FAKE, K, MODEL, PROXY, PYTHON, SEED,  # noqa: E402
                           ReadyProcess, centroid_file, node_toml, read_trace)

KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}


# Runs eldr_proxy.main under cProfile with the process's CPU clock (wall time on a loaded
# machine is mostly waiting for a core): argv = [stats file, eldr_proxy.py, proxy flags...].
PROFILE_PROXY = """
import cProfile, os, sys, time
out, script = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
sys.path.insert(0, os.path.dirname(script))
import eldr_proxy
prof = cProfile.Profile(time.process_time)
try:
    prof.runcall(eldr_proxy.main)
finally:
    prof.dump_stats(out)
"""


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def prompt(tids, i, n):
    return " ".join(["req:%s" % tids[i % len(tids)]] + ["w%d_%d" % (i, j) for j in range(n - 1)])


async def stage_means(session, url):
    """Mean time of each stage the proxy measures (eldr_proxy_stage_seconds), since start."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    sums, counts = {}, {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            head = "eldr_proxy_stage_seconds" + suffix + '{stage="'
            if line.startswith(head):
                stage = line[len(head):].split('"', 1)[0]
                into[stage] = float(line.rsplit(" ", 1)[1])
    return {s: round(1e3 * sums[s] / counts[s], 3) for s in sums if counts.get(s)}


async def node_route_histogram(session, node):
    """The node's eldr_route_latency_seconds (a route request's time inside eldr-node, edge to
    reply), summed over its series: (sum, count, {le: cumulative count})."""
    url = node.endpoint("metrics")  # the ready line's URL of the node's /metrics
    async with session.get(url if url.startswith("http") else "http://%s/metrics" % url) as r:
        text = await r.text()
    total, count, buckets = 0.0, 0, {}
    for line in text.splitlines():
        if not line.startswith("eldr_route_latency_seconds"):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("eldr_route_latency_seconds_sum"):
            total += float(value)
        elif name.startswith("eldr_route_latency_seconds_count"):
            count += int(float(value))
        elif 'le="' in name:
            le = name.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = buckets.get(le, 0) + int(float(value))
    return total, count, buckets


def histogram_window(before, after):
    """Mean and median (interpolated inside its bucket) in ms of the observations made between
    two node_route_histogram readings."""
    n = after[1] - before[1]
    if n <= 0:
        return None
    edges = sorted(((float(le), after[2][le] - before[2].get(le, 0)) for le in after[2]),
                   key=lambda e: e[0])
    lo, below, p50 = 0.0, 0, None
    for le, cum in edges:
        if cum >= n / 2 and p50 is None:
            inside = cum - below
            p50 = lo + (le - lo) * ((n / 2 - below) / inside if inside else 0.0)
        lo, below = le, cum
    return {"requests": n, "mean_ms": round(1e3 * (after[0] - before[0]) / n, 3),
            "p50_ms": round(1e3 * p50, 3) if p50 is not None and p50 != float("inf") else None}


async def direct_request(session, prefills, decodes, i, body, path):
    """vLLM's toy P/D flow run by the client: prefill (max_tokens 1, kv params), then decode."""
    rid = "direct-%d-%d" % (os.getpid(), i)
    pre = dict(body, kv_transfer_params=KV_PARAMS, stream=False, max_tokens=1)
    pre.pop("stream_options", None)
    async with session.post(prefills[i % len(prefills)] + path, json=pre,
                            headers={"X-Request-Id": rid}) as r:
        got = await r.json()
        if r.status != 200:
            raise RuntimeError("prefill HTTP %d: %s" % (r.status, got))
    dec = dict(body, kv_transfer_params=got["kv_transfer_params"])
    async with session.post(decodes[i % len(decodes)] + path, json=dec,
                            headers={"X-Request-Id": rid}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError("decode HTTP %d" % r.status)


async def proxy_request(session, url, i, body, path, stages=None):
    """stages: a dict stage -> [ms], filled from the answer's Server-Timing header."""
    async with session.post(url + path, json=body) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError("proxy HTTP %d" % r.status)
        if stages is not None:
            for entry in r.headers.get("Server-Timing", "").split(","):
                name, _, dur = entry.strip().partition(";dur=")
                if dur:
                    stages.setdefault(name, []).append(float(dur))


async def open_loop(rate, duration, make):
    """Poisson arrivals; returns the latencies (s) of the requests that succeeded, errors."""
    rng = random.Random(1)
    loop = asyncio.get_running_loop()
    lat, errors, tasks = [], [], []

    async def one(i):
        t0 = loop.time()
        try:
            await make(i)
            lat.append(loop.time() - t0)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(str(e)[:200])
    start = loop.time()
    t = start
    i = 0
    while t - start < duration:
        t += rng.expovariate(rate)
        delay = t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival schedule, not a synchronisation
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    return lat, errors


async def closed_loop(concurrency, duration, make):
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    done, errors = [0], []

    async def worker(w):
        i = w
        while loop.time() < end:
            try:
                await make(i)
                done[0] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(str(e)[:200])
            i += concurrency
    t0 = loop.time()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return done[0], loop.time() - t0, errors


async def run(args, tmp):
    trace_path = os.path.join(args.shared_data, "esft-deepseek-v2-lite.eldrtrace")
    geometry, trace = read_trace(trace_path)
    labels = sorted({lab for lab, _, _ in trace.values()})
    tids = list(trace.keys())
    cpath = os.path.join(tmp, "esft.centroids")
    with open(cpath, "wb") as f:
        f.write(centroid_file(geometry, trace, labels))
    with open(os.path.join(tmp, "node.toml"), "w") as f:
        f.write(node_toml(os.path.join(tmp, "data"), cpath))
    node = live.Node(live.find_binary(args.build_dir, "eldr-node"),
                     os.path.join(tmp, "node.toml"), os.path.join(tmp, "node.log")).start()
    procs = []

    def fake(name, role):
        p = ReadyProcess([PYTHON, FAKE, "--model", MODEL, "--trace", trace_path, "--role", role,
                          "--enable-return-routed-experts", "--dense-layers", "1",
                          "--python-hash-seed", SEED, "--block-size", str(BLOCK),
                          "--time-scale", "0", "--max-num-seqs", "1024", "--max-waiting",
                          "100000", "--num-gpu-blocks", "200000"],
                         "fake-vllm", os.path.join(tmp, name + ".log"))
        procs.append(p)
        return p.start()
    results = {}
    try:
        prefills = [fake("prefill%d" % i, "prefill").ready["url"] for i in range(args.prefills)]
        decodes = [fake("decode%d" % i, "decode").ready["url"] for i in range(K)]
        proxy_script = args.proxy or PROXY
        launch = [PYTHON, proxy_script]
        if args.profile:  # cProfile (CPU time) of the proxy process, written when it stops
            launch = [PYTHON, "-c", PROFILE_PROXY, args.profile,
                      os.path.join(os.path.dirname(proxy_script), "eldr_proxy.py")]
        proxy = ReadyProcess(
            launch + ["--listen", "127.0.0.1:0", "--eldr", node.endpoint("route"),
             "--eldr-worker", node.endpoint("worker"), "--model", MODEL,
             "--layers", str(geometry[0]), "--experts", str(geometry[1]),
             "--top-k", str(geometry[2]), "--first-moe-layer", "1", "--hash-seed", SEED,
             "--log-level", "warning"] + args.proxy_arg +
            sum((["--prefill", u] for u in prefills), []) +
            sum((["--decode", u] for u in decodes), []),
            "eldr-proxy", os.path.join(tmp, "proxy.log"))
        procs.append(proxy)
        proxy.start()
        url = proxy.ready["listen"]
        results["proxy"] = {"script": proxy_script, "counts": proxy.ready.get("counts")}
        admin = aio.AsyncAdminClient(node.endpoint("admin"), timeout_ms=10000)
        deadline = time.monotonic() + 30
        while len(await admin.call("workers", model=MODEL)) < K:
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not register the decode instances")
            await asyncio.sleep(0.05)  # polling a condition
        await admin.close()
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn,
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            path = "/v1/completions"

            def body(i, tokens, stream):
                return {"model": MODEL, "prompt": prompt(tids, i, args.prompt_tokens),
                        "max_tokens": tokens, "stream": stream}
            # Warm both paths (connections, caches) before measuring.
            for i in range(20):
                await direct_request(session, prefills, decodes, i, body(i, 2, True), path)
                await proxy_request(session, url, i, body(i, 2, True), path)
            if args.mode in ("overhead", "both"):
                # Interleaved: arrivals alternate between the two paths, so both see the same
                # machine (other processes, the fakes' own queues) at the same moments.
                lat = {"direct": [], "proxy": []}
                stages = {}
                node_before = await node_route_histogram(session, node)

                async def either(i):
                    loop = asyncio.get_running_loop()
                    t0 = loop.time()
                    if i % 2 == 0:
                        await direct_request(session, prefills, decodes, i,
                                             body(10**6 + i, args.tokens, True), path)
                        lat["direct"].append(loop.time() - t0)
                    else:
                        await proxy_request(session, url, i, body(10**6 + i, args.tokens, True),
                                            path, stages)
                        lat["proxy"].append(loop.time() - t0)
                _, errors = await open_loop(args.rate, args.duration, either)
                lat_d, lat_p = lat["direct"], lat["proxy"]
                results["overhead"] = {
                    "rate": args.rate, "duration_s": args.duration, "tokens": args.tokens,
                    "prompt_tokens": args.prompt_tokens,
                    "direct_p50_ms": round(statistics.median(lat_d) * 1e3, 2),
                    "direct_p99_ms": round(pct(lat_d, 0.99) * 1e3, 2),
                    "proxy_p50_ms": round(statistics.median(lat_p) * 1e3, 2),
                    "proxy_p99_ms": round(pct(lat_p, 0.99) * 1e3, 2),
                    "requests": [len(lat_d), len(lat_p)], "errors": len(errors),
                    "error_samples": errors[:3]}
                o = results["overhead"]
                o["overhead_p50_ms"] = round(o["proxy_p50_ms"] - o["direct_p50_ms"], 2)
                o["overhead_p99_ms"] = round(o["proxy_p99_ms"] - o["direct_p99_ms"], 2)
                results["overhead"]["proxy_stage_mean_ms"] = await stage_means(session, url)
                # The route stage's share spent inside eldr-node (the rest: the proxy's event
                # loop, ZeroMQ, the kernel, waiting for a core).
                results["overhead"]["node_route"] = histogram_window(
                    node_before, await node_route_histogram(session, node))
                # Per request, from Server-Timing: medians are not moved by the warm-up's or a
                # stall's outliers as the histogram's means are.
                results["overhead"]["proxy_stage_p50_ms"] = {
                    s: round(statistics.median(v), 3) for s, v in stages.items()}
                results["overhead"]["proxy_stage_p99_ms"] = {
                    s: round(pct(v, 0.99), 3) for s, v in stages.items()}
            if args.mode in ("throughput", "both"):
                pid = proxy.ready["pid"]
                c0 = cpu_seconds(pid)
                n, secs, errs = await closed_loop(
                    args.concurrency, args.duration, lambda i: proxy_request(
                        session, url, i, body(3 * 10**6 + i, args.throughput_tokens, False),
                        path))
                cpu = cpu_seconds(pid) - c0
                results["throughput"] = {
                    "concurrency": args.concurrency, "duration_s": round(secs, 2),
                    "tokens": args.throughput_tokens, "prompt_tokens": args.prompt_tokens,
                    "requests": n, "requests_per_s": round(n / secs, 1), "errors": len(errs),
                    "error_samples": errs[:3], "proxy_cpu_s": round(cpu, 2),
                    "proxy_cpu_ms_per_request": round(1e3 * cpu / max(n, 1), 3),
                    "requests_per_proxy_cpu_s": round(n / cpu, 1) if cpu else None,
                    "proxy_stage_mean_ms": await stage_means(session, url)}
    finally:
        for p in procs:
            p.stop()
        node.stop()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--shared-data", default=os.environ.get("ELDR_SHARED_DATA") or
                    os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--mode", choices=["overhead", "throughput", "both"], default="both")
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--throughput-tokens", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--prefills", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--proxy-arg", action="append", default=[],
                    help="one more flag for the proxy, e.g. --proxy-arg=--event-loop=uvloop "
                         "(repeatable)")
    ap.add_argument("--profile", help="run the proxy under cProfile, stats written to this file")
    ap.add_argument("--proxy", help="the eldr-proxy script to run (default: this tree's); e.g. "
                                    "another checkout's, to compare two versions in one run")
    ap.add_argument("--workdir", help="keep the processes' logs here (default: a temporary "
                                      "directory, removed)")
    args = ap.parse_args()
    # The compiled conversion, as an install has it beside the module: without it the proxy
    # converts with numpy and the figures are not a deployment's.
    lib = os.path.join(args.build_dir, "tools", "eldr-proxy", "libeldr_counts_native.so")
    if "ELDR_COUNTS_NATIVE" not in os.environ and os.path.exists(lib):
        os.environ["ELDR_COUNTS_NATIVE"] = os.path.abspath(lib)
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        res = asyncio.run(run(args, args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="eldr-proxy-bench-") as tmp:
            res = asyncio.run(run(args, tmp))
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(k, json.dumps(v, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
