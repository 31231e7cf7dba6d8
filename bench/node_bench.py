#!/usr/bin/python3
"""Node benchmarks for BENCHMARKS.md: starts a release eldr-node on free loopback ports, drives it
with eldr-loadgen (generator on the same machine), and prints one markdown table per measure:

  1. route throughput: offered rate -> achieved replies/s, errors, client round trip p50/p99,
     node-side latency and decision time (from the node's Prometheus histograms);
  2. route latency at 5,000 req/s (the issue's latency point);
  3. a hot swap under load (eldr-loadgen --swap-at).

With --idle-publishers N the node first follows N idle ZeroMQ PUB sockets bound here, registered
with `publisher_register` as an idle vLLM's would be (BENCHMARKS.md, "The frontend's poll loop").

usage: bench/node_bench.py [--build build-release] [--rates 5000,10000,15000,20000]
                           [--duration 10] [--workers 16] [--idle-publishers N]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgpack
import zmq

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(root, "tests", "support", "py"))
import eldr_testing  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(root, "build-release"))
ap.add_argument("--rates", default="5000,10000,15000,20000")
ap.add_argument("--duration", type=float, default=10)
ap.add_argument("--workers", type=int, default=16)
ap.add_argument("--preset", default="qwen-task")
ap.add_argument("--no-swap", action="store_true")
ap.add_argument("--node-bin", help="this eldr-node instead of BUILD's (bench/node_ab.py)")
ap.add_argument("--loadgen-bin", help="this eldr-loadgen instead of BUILD's")
ap.add_argument("--warmup", type=float, default=2,
                help="seconds at the start of each run left out of rtt p50/p99 (eldr-loadgen "
                     "--warmup); the whole run's p99 is printed beside")
ap.add_argument("--idle-publishers", type=int, default=0,
                help="idle KV-event publishers the node follows during the runs")
args = ap.parse_args()

node_bin = args.node_bin or os.path.join(args.build, "tools/eldr-node/eldr-node")
loadgen_bin = args.loadgen_bin or os.path.join(args.build, "tools/eldr-loadgen/eldr-loadgen")


def start_node(data):
    ready = os.path.join(data, "ready.json")
    p = subprocess.Popen(eldr_testing.loopback_node_argv(node_bin, os.path.join(data, "db"))
                         + ["--ready-file", ready],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(data, "node.log"), "w"))
    ep = eldr_testing.wait_ready_file(ready, p, 30)  # 600 polls 50 ms apart, as before
    if ep is not None:
        return p, ep
    if p.poll() is not None:
        sys.exit("eldr-node exited; see " + os.path.join(data, "node.log"))
    sys.exit("eldr-node did not become ready")


def follow_idle_publishers(worker_endpoint, n, ctx):
    """Binds n idle PUB sockets and has the node subscribe to each (docs/protocol.md section 4,
    `publisher_register`); returns the sockets, which must stay open while the node follows."""
    pubs, waiting = [], set()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(worker_endpoint)
    try:
        for i in range(n):
            p = ctx.socket(zmq.PUB)
            p.setsockopt(zmq.LINGER, 0)
            p.bind("tcp://127.0.0.1:*")
            pubs.append(p)
            waiting.add("p%d" % i)
            dealer.send(msgpack.packb({"version": 1, "type": "publisher_register", "id": "p%d" % i,
                                       "model": "default",
                                       "endpoint": p.getsockopt_string(zmq.LAST_ENDPOINT)},
                                      use_bin_type=True))
        deadline = time.monotonic() + 60
        while waiting:
            if time.monotonic() > deadline or not dealer.poll(1000):
                sys.exit("%d publisher registrations unanswered" % len(waiting))
            r = msgpack.unpackb(dealer.recv(), raw=False)
            if r.get("type") != "worker_ack" or r.get("state") != "subscribed":
                sys.exit("publisher_register refused: %s" % r)
            waiting.discard(r.get("id"))
    finally:
        dealer.close(0)
    return pubs


def cpu_s(pid):
    """CPU seconds (user + system) of a process, from /proc."""
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def histogram(text, name, model="default"):
    """Cumulative buckets [(le, count)] of one labelled histogram."""
    out = []
    pat = re.compile(r'^%s_bucket\{model="%s",le="([^"]+)"\} (\d+)' % (name, model))
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            out.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)),
                        int(m.group(2))))
    return out


def quantile(buckets, before, q):
    """q-quantile (seconds) of the observations added between two scrapes, linear inside a
    bucket (as Prometheus' histogram_quantile does)."""
    prev = dict(before)
    counts = [(le, c - prev.get(le, 0)) for le, c in buckets]
    total = counts[-1][1] if counts else 0
    if total == 0:
        return float("nan")
    rank, lo, below = q * total, 0.0, 0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(c - below, 1)
        lo, below = le, c
    return lo


def scrape(url):
    return urllib.request.urlopen(url, timeout=5).read().decode()


def loadgen(endpoints, rate, extra, duration=None):
    cmd = [loadgen_bin, "--node", endpoints["admin"], "--synthetic", args.preset,
           "--rate", str(rate), "--duration", str(duration or args.duration),
           "--decode-workers", str(args.workers), "--route-only", "--json", "--quiet"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("eldr-loadgen failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return json.loads(r.stdout)


with tempfile.TemporaryDirectory(prefix="eldr-node-bench-") as data:
    node, ep = start_node(data)
    ctx = zmq.Context()
    pubs = follow_idle_publishers(ep["worker"], args.idle_publishers, ctx)
    try:
        print("## Route throughput and latency (%s, %d decode workers, route-only, %.0f s per rate, "
              "%d idle publishers followed)"
              % (args.preset, args.workers, args.duration, args.idle_publishers))
        print()
        print("| offered req/s | replies/s | errors | rtt p50 µs | rtt p99 µs | rtt p99 µs, whole run "
              "| worst second's rtt p99 µs (after warm-up) | node p50 µs | node p99 µs | decision p99 µs "
              "| cache commit p50 / p99 µs | loadgen CPU s | node CPU µs per reply |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        # Warm-up, not reported: the first run into a fresh store pays RocksDB's first memtable
        # flushes and the caches' cold start.
        loadgen(ep, 1000, ["--policies", "eldr"], duration=3)
        for rate in [int(x) for x in args.rates.split(",")]:
            before = scrape(ep["metrics"])
            cpu0 = cpu_s(node.pid)  # over the generator's whole run, its set-up included
            r = loadgen(ep, rate, ["--policies", "eldr", "--warmup", str(args.warmup)])
            cpu1 = cpu_s(node.pid)
            after = scrape(ep["metrics"])
            pol = r["policies"]["eldr"]
            seconds = pol.get("route_seconds", [])
            full = [x for i, x in enumerate(seconds[:-1]) if i >= args.warmup and x["replies"] > 0]
            worst = max((x["p99_us"] for x in full), default=float("nan"))
            lat = histogram(after, "eldr_route_latency_seconds")
            dec = histogram(after, "eldr_route_decision_seconds")
            lat0 = histogram(before, "eldr_route_latency_seconds")
            dec0 = histogram(before, "eldr_route_decision_seconds")
            com = histogram(after, "eldr_sigcache_commit_seconds")
            com0 = histogram(before, "eldr_sigcache_commit_seconds")
            print("| %d | %.0f | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.0f / %.0f | %.2f | %.0f |" % (
                rate, r["route_rps"], r["errors"], r["route_p50_us"], r["route_p99_us"],
                pol["route_p99_all_us"], worst,
                quantile(lat, lat0, 0.5) * 1e6, quantile(lat, lat0, 0.99) * 1e6,
                quantile(dec, dec0, 0.99) * 1e6, quantile(com, com0, 0.5) * 1e6,
                quantile(com, com0, 0.99) * 1e6, r.get("loadgen_cpu_s", float("nan")),
                (cpu1 - cpu0) / r["replied"] * 1e6 if r["replied"] else float("nan")))
        if not args.no_swap:
            print()
            print("## Hot swap under load (5,000 req/s, swap at 3 s)")
            print()
            r = loadgen(ep, 5000, ["--policies", "eldr", "--swap-at", "3"])
            swap = r["policies"]["eldr"].get("swap", {})
            print("```")
            print(json.dumps(swap, indent=1, sort_keys=True))
            print("```")
            print("errors during the run: %d of %d" % (r["errors"], r["sent"]))
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=60)
        for s in pubs:
            s.close(0)
