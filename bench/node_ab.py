#!/usr/bin/python3
"""Two eldr-node builds side by side under bench/node_bench.py, alternating (old, new, old, new,
...) so that the machine's load changes fall on both, both driven by the same eldr-loadgen.
Prints every run's row of node_bench's table and, per build, the median and range of each column
over the rounds (BENCHMARKS.md, "Issue 17's moves, side by side").

usage: bench/node_ab.py --old OLD/eldr-node --new NEW/eldr-node --loadgen NEW/eldr-loadgen
                        [--rounds 7] [--rate 5000] [--duration 10] [--idle-publishers N]
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))

ap = argparse.ArgumentParser()
ap.add_argument("--old", required=True, help="the old eldr-node binary")
ap.add_argument("--new", required=True, help="the new eldr-node binary")
ap.add_argument("--loadgen", required=True, help="the eldr-loadgen both are driven by")
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--rate", type=int, default=5000)
ap.add_argument("--duration", type=float, default=10)
ap.add_argument("--idle-publishers", type=int, default=0,
                help="idle KV-event publishers each node follows (node_bench.py)")
args = ap.parse_args()
if args.rounds < 1:
    ap.error("--rounds must be >= 1")

header = None
rows = {"old": [], "new": []}
for i in range(args.rounds):
    for name in ("old", "new"):
        out = subprocess.run([sys.executable, os.path.join(here, "node_bench.py"), "--node-bin",
                              getattr(args, name), "--loadgen-bin", args.loadgen, "--rates",
                              str(args.rate), "--duration", str(args.duration), "--no-swap",
                              "--idle-publishers", str(args.idle_publishers)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("node_bench.py failed for %s: %s" % (name, out.stderr[-2000:]))
        lines = out.stdout.splitlines()
        header = header or next(l for l in lines if l.startswith("| offered"))
        row = next(l for l in lines if l.startswith("| %d " % args.rate))
        print("%s %d %s" % (name, i + 1, row), flush=True)
        rows[name].append([c.strip() for c in row.strip("|").split("|")])

names = [c.strip() for c in header.strip("|").split("|")]
print()
print("| column | old median (range) | new median (range) | new / old |")
print("| --- | --- | --- | --- |")
for j, col in enumerate(names):
    try:
        old = [float(r[j]) for r in rows["old"]]
        new = [float(r[j]) for r in rows["new"]]
    except ValueError:  # "p50 / p99" cells
        continue
    mo, mn = statistics.median(old), statistics.median(new)
    print("| %s | %.1f (%.0f-%.0f) | %.1f (%.0f-%.0f) | %s |" % (
        col, mo, min(old), max(old), mn, min(new), max(new),
        "%.2f" % (mn / mo) if mo else "-"))
