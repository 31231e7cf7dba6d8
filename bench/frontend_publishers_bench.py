#!/usr/bin/env python3
"""What following many KV-event publishers costs the route path: node CPU per routed request,
and route latency, with 0..N idle publishers followed, for one or more builds side by side.

A node follows one SUB socket per publisher (every vLLM instance of the model publishes its KV
events). The frontend thread polls those sockets beside the route, worker and admin ROUTERs, so
whatever a poll round costs per socket, every route request pays it. Each case starts a
single-node cluster (deploy/local/eldr-cluster) with the build's eldr-node, binds N idle ZeroMQ
PUB sockets here and registers them over the worker protocol (`publisher_register`, docs/
protocol.md section 4: the node connects a SUB to each, as to an idle vLLM), then runs
eldr-loadgen route-only at --rate for --duration seconds and reads the node's CPU from /proc
before and after. Builds alternate within each round, so that they share the machine's state.

  /usr/bin/python3 bench/frontend_publishers_bench.py --build old=/tmp/oldbin --build new=build \
      --publishers 0,64,256 --rate 2000 --duration 5 --repeat 2

Prints a Markdown table (BENCHMARKS.md, "The frontend's poll loop"); --json writes the rows.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
script = os.path.join(root, "deploy", "local", "eldr-cluster")

ap = argparse.ArgumentParser()
ap.add_argument("--build", action="append", required=True, metavar="LABEL=DIR",
                help="a directory holding eldr-node (DIR or DIR/tools/eldr-node/), repeatable")
ap.add_argument("--loadgen", default="",
                help="eldr-loadgen (default: the first build's)")
ap.add_argument("--publishers", default="0,64,256")
ap.add_argument("--rate", type=int, default=2000)
ap.add_argument("--duration", type=float, default=5)
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--loadgen-args", default="", help="more eldr-loadgen options")
ap.add_argument("--json", default="", help="write the rows to this file")
args = ap.parse_args()

builds = []
for b in args.build:
    label, _, d = b.partition("=")
    if not d:
        ap.error("--build takes LABEL=DIR")
    builds.append((label, d))


def find(d, name):
    for p in (os.path.join(d, name), os.path.join(d, "tools", name, name)):
        if os.access(p, os.X_OK):
            return p
    sys.exit("%s: no %s there" % (d, name))


loadgen = args.loadgen or find(builds[0][1], "eldr-loadgen")
ctx = zmq.Context()


def log(m):
    print("[frontend_publishers_bench %s] %s" % (time.strftime("%H:%M:%S"), m), file=sys.stderr,
          flush=True)


def cpu_of(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def follow(worker_endpoint, model, n):
    """Binds n idle PUB sockets and has the node subscribe to each; returns the sockets."""
    pubs, ids = [], set()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(worker_endpoint)
    try:
        for i in range(n):
            p = ctx.socket(zmq.PUB)
            p.setsockopt(zmq.LINGER, 0)
            p.bind("tcp://127.0.0.1:*")
            pubs.append(p)
            rid = "p%d" % i
            ids.add(rid)
            dealer.send(msgpack.packb({"version": 1, "type": "publisher_register", "id": rid,
                                       "model": model,
                                       "endpoint": p.getsockopt_string(zmq.LAST_ENDPOINT)},
                                      use_bin_type=True))
        deadline = time.monotonic() + 60
        while ids:
            if time.monotonic() > deadline or not dealer.poll(1000):
                raise RuntimeError("%d publisher registrations unanswered" % len(ids))
            r = msgpack.unpackb(dealer.recv(), raw=False)
            if r.get("type") != "worker_ack" or r.get("state") != "subscribed":
                raise RuntimeError("publisher_register refused: %s" % r)
            ids.discard(r.get("id"))
    finally:
        dealer.close(0)
    return pubs


def case(label, bin_dir, n):
    d = tempfile.mkdtemp(prefix="eldr-frontend-bench-")
    pubs = []
    try:
        r = subprocess.run([script, "start", "1", "--bin", bin_dir, "--timeout", "60", "--dir", d],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("eldr-cluster start: %s" % r.stderr[-2000:])
        node = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")][0]
        pubs = follow(node["worker"], "default", n)
        cmd = [loadgen, "--node", node["admin"], "--synthetic", "qwen-task", "--decode-workers",
               "8", "--route-only", "--policies", "eldr", "--json", "--quiet", "--output-tokens",
               "16", "--prompt-max", "512", "--keep-centroids", "--rate", str(args.rate),
               "--duration", str(args.duration)] + args.loadgen_args.split()
        cpu0 = cpu_of(node["pid"])
        g = subprocess.run(cmd, capture_output=True, text=True)
        cpu1 = cpu_of(node["pid"])
        if g.returncode != 0:
            raise RuntimeError("eldr-loadgen failed: %s" % g.stderr[-2000:])
        out = json.loads(g.stdout)
        replied = out["replied"]
        return {"build": label, "publishers": n, "rate": args.rate, "replied": replied,
                "errors": out["errors"], "node_cpu_s": cpu1 - cpu0,
                "node_cpu_us_per_reply": (cpu1 - cpu0) / replied * 1e6 if replied else None,
                "route_p50_us": out["route_p50_us"], "route_p99_us": out["route_p99_us"]}
    finally:
        subprocess.run([script, "stop", "--dir", d], capture_output=True)
        for p in pubs:
            p.close(0)
        shutil.rmtree(d, ignore_errors=True)


rows = []
for rep in range(args.repeat):
    for n in [int(x) for x in args.publishers.split(",")]:
        for label, d in builds:
            log("run %d: %s with %d publishers followed, %d req/s" % (rep + 1, label, n, args.rate))
            row = case(label, d, n)
            row["run"] = rep + 1
            rows.append(row)
            log(json.dumps(row))

if args.json:
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
print("| run | publishers followed | build | replies | errors | node CPU µs per reply | "
      "route p50 µs | route p99 µs |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    print("| %d | %d | %s | %d | %d | %.0f | %.0f | %.0f |" % (
        r["run"], r["publishers"], r["build"], r["replied"], r["errors"],
        r["node_cpu_us_per_reply"], r["route_p50_us"], r["route_p99_us"]))
