#!/usr/bin/env python3
"""What a fresh generator run does to a cluster in its first seconds (BENCHMARKS.md, "The tail at
the start of each run").

    /usr/bin/python3 bench/run_start.py --bin-dir BUILD_OR_BIN_DIR [--nodes 3] [--rate 3000] [--warmup-rate 1000]
        [--loadgen-args '--counts all']

Starts a loopback cluster (deploy/local/eldr-cluster), runs the throughput case's generator
command once as a warm-up (2 s at --warmup-rate), then once for --duration s at --rate, and
prints the route round trips of each second of that run (from the generator's `route_seconds`)
and, every --sample-ms from 2 s before its timed phase, the cores used by each node and by the
generator (/proc). The cluster is stopped at the end.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--bin-dir", required=True)
ap.add_argument("--nodes", type=int, default=3)
ap.add_argument("--rate", type=int, default=3000)
ap.add_argument("--warmup-rate", type=int, default=1000)
ap.add_argument("--duration", type=float, default=6)
ap.add_argument("--sample-ms", type=int, default=250)
ap.add_argument("--prepare-budget-mib", type=int, default=4096,
                help="eldr-loadgen's: enough to encode every request before the clock")
ap.add_argument("--loadgen-args", default="--counts all",
                help="more eldr-loadgen options, e.g. '--counts all --no-import'")
args = ap.parse_args()

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
script = os.path.join(root, "deploy/local/eldr-cluster")
# A build tree, or a directory holding the binaries (as eldr-cluster's --bin takes either).
loadgen = os.path.join(os.path.abspath(args.bin_dir), "tools/eldr-loadgen/eldr-loadgen")
if not os.access(loadgen, os.X_OK):
    loadgen = os.path.join(os.path.abspath(args.bin_dir), "eldr-loadgen")
if not os.access(loadgen, os.X_OK):
    sys.exit("eldr-loadgen not found under %s" % args.bin_dir)


def cpu_s(pid):
    """CPU seconds (user + system) of a process, from /proc."""
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


directory = tempfile.mkdtemp(prefix="eldr-run-start-")
out = subprocess.run([script, "start", str(args.nodes), "--bin", args.bin_dir, "--timeout", "60",
                      "--dir", directory], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit("eldr-cluster start: " + out.stderr[-2000:])
try:
    nodes = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    pids = [n["pid"] for n in nodes]
    # The throughput case's generator command (bench/cluster_bench.py, throughput_loadgen).
    base = [loadgen, "--node", nodes[0]["admin"], "--routers", ",".join(n["admin"] for n in nodes),
            "--synthetic", "qwen-task", "--decode-workers", "8", "--route-only", "--policies",
            "eldr", "--json", "--output-tokens", "16", "--prompt-max", "512",
            "--keep-centroids", "--prepare-budget-mib", str(args.prepare_budget_mib)] + \
        args.loadgen_args.split()
    subprocess.run(base + ["--rate", str(args.warmup_rate), "--duration", "2", "--quiet"],
                   capture_output=True, check=True)
    p = subprocess.Popen(base + ["--rate", str(args.rate), "--duration", str(args.duration)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    began = []

    def read_stderr():
        for line in p.stderr:
            if not began and "timed phase begins" in line:
                began.append(time.monotonic())

    threading.Thread(target=read_stderr, daemon=True).start()
    samples = []
    while p.poll() is None:
        try:
            samples.append((time.monotonic(), [cpu_s(x) for x in pids], cpu_s(p.pid)))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(args.sample_ms / 1000.0)
    report = json.loads(p.stdout.read().strip().splitlines()[-1])
    if p.returncode != 0 or not began:
        sys.exit("eldr-loadgen failed (%d)" % p.returncode)
    q = report["policies"]["eldr"] if "policies" in report else report
    print("## route round trips per second of the run (%d nodes, %d req/s)" % (args.nodes, args.rate))
    print("| second | replies | p50 ms | p99 ms | max ms |")
    print("| --- | --- | --- | --- | --- |")
    for i, s in enumerate(q.get("route_seconds", [])):
        print("| %d | %d | %.1f | %.1f | %.1f |" % (i + 1, s["replies"], s["p50_us"] / 1e3,
                                                  s["p99_us"] / 1e3, s["max_us"] / 1e3))
    print()
    print("## cores used, from 2 s before the timed phase (t = 0)")
    print("| t s | " + " | ".join("n%d" % (i + 1) for i in range(len(pids))) +
          " | nodes | generator |")
    print("|" + " --- |" * (len(pids) + 3))
    for (t0, c0, g0), (t1, c1, g1) in zip(samples, samples[1:]):
        if t1 - began[0] < -2.0:
            continue
        dt = t1 - t0
        per = [(b - a) / dt for a, b in zip(c0, c1)]
        print("| %.2f | %s | %.2f | %.2f |" % (t1 - began[0], " | ".join("%.2f" % x for x in per),
                                              sum(per), (g1 - g0) / dt))
finally:
    subprocess.run([script, "stop", "--dir", directory], capture_output=True)
