#!/usr/bin/python3
"""The node benchmark with idle publishers followed still runs as BENCHMARKS.md quotes it ("The
frontend's poll loop"): bench/node_bench.py --idle-publishers 16 for one second at 200 req/s,
every publisher subscribed (the benchmark exits otherwise), the rate's row printed with no error
and a node CPU per reply measured. Correctness only: no figure is asserted.

usage: node_bench_publishers_smoke_test.py --build-dir BUILD    exit 0 = pass, 77 = skipped (no
eldr-node or eldr-loadgen built).
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
BENCH = os.path.join(ROOT, "bench", "node_bench.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    for tool in ("eldr-node", "eldr-loadgen"):
        if not os.path.exists(os.path.join(args.build_dir, "tools", tool, tool)):
            print("skipped: no %s in %s" % (tool, args.build_dir))
            return 77
    r = subprocess.run([sys.executable, BENCH, "--build", args.build_dir, "--rates", "200",
                        "--duration", "1", "--no-swap", "--idle-publishers", "16"],
                       capture_output=True, text=True, timeout=400)
    print(r.stdout)
    if r.returncode != 0:
        print("FAIL: exit %d\n%s" % (r.returncode, r.stderr[-3000:]))
        return 1
    rows = [line for line in r.stdout.splitlines() if line.startswith("| 200 ")]
    if "16 idle publishers followed" not in r.stdout or len(rows) != 1:
        print("FAIL: no table for 16 idle publishers with a row for 200 req/s")
        return 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    errors, cpu_per_reply = int(cells[2]), float(cells[-1])
    if errors != 0 or not cpu_per_reply > 0:
        print("FAIL: %d errors, node CPU per reply %s" % (errors, cells[-1]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
