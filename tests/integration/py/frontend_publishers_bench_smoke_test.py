#!/usr/bin/python3
"""The frontend poll-loop benchmark still runs as BENCHMARKS.md quotes it ("The frontend's poll
loop"): bench/frontend_publishers_bench.py with none and with 16 idle publishers followed, one
second at 200 req/s each, every request answered without an error, every publisher subscribed,
and the node's CPU measured. Correctness only: no figure is asserted.

usage: frontend_publishers_bench_smoke_test.py --build-dir BUILD    exit 0 = pass, 77 = skipped
(no eldr-node or eldr-loadgen built).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
BENCH = os.path.join(ROOT, "bench", "frontend_publishers_bench.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    for tool in ("eldr-node", "eldr-loadgen"):
        if not os.path.exists(os.path.join(args.build_dir, "tools", tool, tool)):
            print("skipped: no %s in %s" % (tool, args.build_dir))
            return 77
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        r = subprocess.run([sys.executable, BENCH, "--build", "smoke=" + args.build_dir,
                            "--publishers", "0,16", "--rate", "200", "--duration", "1",
                            "--json", out], capture_output=True, text=True, timeout=400)
        if r.returncode != 0:
            print("FAIL: exit %d\n%s" % (r.returncode, r.stderr[-3000:]))
            return 1
        rows = json.load(open(out))
    print(r.stdout)
    failures = []
    if sorted(x["publishers"] for x in rows) != [0, 16]:
        failures.append("rows for %s publishers, not 0 and 16" % [x["publishers"] for x in rows])
    for x in rows:
        if x["replied"] != 200 or x["errors"] != 0 or not x["node_cpu_s"] > 0:
            failures.append(json.dumps(x))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
