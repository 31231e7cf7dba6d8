#!/usr/bin/python3
"""The scale benchmark's 1-against-3-router comparison, at a small rate, for correctness only.

    /usr/bin/python3 tests/integration/cluster_scale_test.py --build-dir BUILD

Runs bench/cluster_bench.py's throughput case (the same command BENCHMARKS.md quotes, issue 14)
with 1 and 3 routers of a loopback cluster (deploy/local/eldr-cluster) at 300 req/s for 1 s,
kept shard sums and batched stores on (the defaults), then checks what must hold whatever the
machine's speed: every request answered, no error, and every retry of a decided id at another
router answered with the first decision. It asserts no timing. Registered in CTest by
tests/CMakeLists.txt as integration.cluster_scale; exit 77 (CTest's skip) when BUILD lacks
eldr-node, eldrctl or eldr-loadgen. Needs Debian's python3-zmq and python3-msgpack.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
SRC = Path(__file__).resolve().parent.parent.parent
RETRIES = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    build = Path(args.build_dir)
    for tool in ("eldr-node", "eldr-loadgen", "eldrctl"):
        if not any(os.access(p, os.X_OK) for p in (build / tool, build / "tools" / tool / tool)):
            print("skipped: %s is not built in %s" % (tool, build))
            return 77
    with tempfile.TemporaryDirectory(prefix="eldr-cluster-scale-") as tmp:
        out = os.path.join(tmp, "scale.json")
        r = subprocess.run(
            ["/usr/bin/python3", str(SRC / "bench" / "cluster_bench.py"), "--bin-dir", str(build),
             "--only", "throughput", "--throughput-routers", "1,3", "--throughput-rate", "300",
             "--throughput-duration", "1", "--no-warmup", "--check-retries", str(RETRIES), "--out", out],
            capture_output=True, text=True, timeout=600)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-4000:])
            print("FAIL: the benchmark exited with %d" % r.returncode)
            return 1
        rows = json.load(open(out))["throughput"]
    failures = []
    if sorted(row["routers"] for row in rows) != [1, 3]:
        failures.append("expected one run with 1 router and one with 3, got %s" % rows)
    for row in rows:
        where = "%d router(s)" % row["routers"]
        if row["sent"] == 0:
            failures.append("%s: nothing was sent" % where)
        if row["replied"] != row["sent"]:
            failures.append("%s: %d of %d requests answered" % (where, row["replied"], row["sent"]))
        if row["errors"] != 0:
            failures.append("%s: %d errors" % (where, row["errors"]))
        if row["routers"] > 1 and row["retries_same"] != RETRIES:
            failures.append("%s: %s of %d retries at another router got the first decision"
                            % (where, row["retries_same"], RETRIES))
    for f in failures:
        print("FAIL: " + f)
    if not failures:
        print("ok: %s" % "; ".join("%d router(s): %d of %d answered, %s retries the same"
                                   % (row["routers"], row["replied"], row["sent"],
                                      row["retries_same"]) for row in rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
