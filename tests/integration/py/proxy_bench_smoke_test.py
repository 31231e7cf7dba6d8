#!/usr/bin/python3
"""The proxy's throughput benchmark still runs as BENCHMARKS.md quotes it: bench/eldr_proxy_bench.py
--mode throughput for two seconds with eldr-proxy and with each variant of bench/proxy_floor.py
(the same hops with none of the proxy's work; without aiohttp's server; without the route call),
every request answered without an error and the proxy's CPU measured. Correctness only: no
figure is asserted.

usage: proxy_bench_smoke_test.py --build-dir BUILD    exit 0 = pass, 77 = skipped (no eldr-node
built, or no shared trace data).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
BENCH = os.path.join(ROOT, "bench", "eldr_proxy_bench.py")
FLOOR = os.path.join(ROOT, "bench", "proxy_floor.py")

VARIANTS = [
    ("eldr-proxy", []),
    ("floor", ["--proxy", FLOOR]),
    ("floor, httptools server", ["--proxy", FLOOR, "--proxy-arg=--floor-server=httptools"]),
    ("floor, no route call", ["--proxy", FLOOR, "--proxy-arg=--floor-no-eldr"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    node = os.path.join(args.build_dir, "tools", "eldr-node", "eldr-node")
    data = os.environ.get("ELDR_SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")
    if not os.path.exists(node):
        print("skipped: no eldr-node in %s" % args.build_dir)
        return 77
    if not os.path.exists(os.path.join(data, "esft-deepseek-v2-lite.eldrtrace")):
        print("skipped: no shared trace data in %s" % data)
        return 77
    failures = []
    for name, extra in VARIANTS:
        r = subprocess.run([sys.executable, BENCH, "--build-dir", args.build_dir,
                            "--shared-data", data, "--mode", "throughput", "--duration", "2",
                            "--concurrency", "4", "--json"] + extra,
                           capture_output=True, text=True, timeout=240)
        lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
        if r.returncode != 0 or not lines:
            failures.append("%s: exit %d, %s" % (name, r.returncode, r.stderr[-1500:]))
            continue
        t = json.loads(lines[-1])["throughput"]
        print("%s: %d requests, %d errors, %.3f ms of proxy CPU per request"
              % (name, t["requests"], t["errors"], t["proxy_cpu_ms_per_request"]))
        if t["requests"] <= 0 or t["errors"] != 0 or not t["proxy_cpu_s"] > 0:
            failures.append("%s: %s" % (name, json.dumps(t)))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
