#!/usr/bin/python3
"""The scale benchmark's 1-against-3-router comparison, at a small rate, for correctness only.

    /usr/bin/python3 tests/integration/cluster_scale_test.py --build-dir BUILD

Runs bench/cluster_bench.py's throughput case (the same command BENCHMARKS.md quotes, issue 14)
with 1 and 3 routers of a loopback cluster (deploy/local/eldr-cluster) at 300 req/s for 1 s,
load authorities, kept shard sums and batched stores on (the defaults), then checks what must hold
whatever the machine's speed: every request answered, no error, and every resend marked as a
failover (route_request.retry) sent to another router the moment the first answer arrived, which
that router asks its peers about, answered with the first decision. (Unmarked retries get the
first decision only with shared decisions, cluster.load_sharing = "decisions":
integration.ClusterTest.ARetryAtAnotherRouterGetsTheSameDecisionAndCountsOnce.) Then 3 routers
fed by prefill worker (--routers-by-prefill):
every request answered with every block covered and no shard request to another node. Then the
fan-in case (issue 14) with load authorities (cluster.load_sharing = "authority"): 3 routers,
router n1 at 100 req/s while the cluster takes 300 and 600, the decode workers at n2 (their
authority); every request answered, no error, n1 given exactly its share by --router-weights,
and n1 applying load vectors and no peer decisions (the mode in effect). Then the baselines
(--only separate,idle): three single-node clusters side by side answer every request, and an
idle node's CPU is measured. It asserts no timing. Registered in CTest by
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
    failures = (throughput_failures(build) + affine_failures(build) +
                authority_failures(build) + separate_and_idle_failures(build))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


def bench(build, tmp, name, *options):
    """bench/cluster_bench.py with these options: its JSON results, or None (and why, printed)."""
    out = os.path.join(tmp, name + ".json")
    r = subprocess.run(
        ["/usr/bin/python3", str(SRC / "bench" / "cluster_bench.py"), "--bin-dir", str(build),
         *options, "--out", out], capture_output=True, text=True, timeout=600)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        print("FAIL: the benchmark (%s) exited with %d" % (name, r.returncode))
        return None
    return json.load(open(out))


def throughput_failures(build):
    with tempfile.TemporaryDirectory(prefix="eldr-cluster-scale-") as tmp:
        res = bench(build, tmp, "throughput", "--only", "throughput", "--throughput-routers",
                    "1,3", "--throughput-rate", "300", "--throughput-duration", "1",
                    "--no-warmup", "--check-retries", str(RETRIES), "--load-sharing", "authority")
    if res is None:
        return ["the throughput case did not run"]
    rows = res["throughput"]
    failures = []
    if sorted(row["routers"] for row in rows) != [1, 3]:
        failures.append("expected one run with 1 router and one with 3, got %s" % rows)
    for row in rows:
        where = "%d router(s)" % row["routers"]
        failures += answered_failures(where, row)
        if row["load_sharing"] != "authority":
            failures.append("%s: ran with load_sharing %s" % (where, row["load_sharing"]))
        if row["routers"] > 1 and row["marked_retries_same"] != RETRIES:
            failures.append("%s: %s of %d marked resends at another router, sent at once, got "
                            "the first decision" % (where, row["marked_retries_same"], RETRIES))
    if not failures:
        print("ok: %s" % "; ".join("%d router(s): %d of %d answered, %s marked resends the same"
                                   % (row["routers"], row["replied"], row["sent"],
                                      row["marked_retries_same"])
                                   for row in rows))
    return failures


def affine_failures(build):
    """3 routers fed by prefill worker (eldr-loadgen --routers-by-prefill): every prefix hit is a
    block that router was sent before, so it is summed from the router's seen blocks and no shard
    of another node is asked (actors/router/seen_blocks.hpp); the loadgen's requests to one router
    travel on one socket, in order, so this holds whatever the machine's speed."""
    with tempfile.TemporaryDirectory(prefix="eldr-cluster-scale-") as tmp:
        res = bench(build, tmp, "affine", "--only", "throughput", "--throughput-routers", "3",
                    "--throughput-rate", "300", "--throughput-duration", "1", "--no-warmup",
                    "--throughput-loadgen-args", "--prefill-workers 6 --routers-by-prefill")
    if res is None:
        return ["the prefill-affine throughput case did not run"]
    failures = []
    for row in res["throughput"]:
        where = "3 prefill-affine routers"
        failures += answered_failures(where, row)
        if row["remote_asks_per_decision"] != 0:
            failures.append("%s: %.3f remote shard requests per decision, expected none"
                            % (where, row["remote_asks_per_decision"]))
        if row["coverage"] != 1.0:
            failures.append("%s: coverage %.4f, expected every block" % (where, row["coverage"]))
    if not failures:
        print("ok: 3 prefill-affine routers: %s" % "; ".join(
            "%d of %d answered, no remote shard request, coverage 1" % (row["replied"], row["sent"])
            for row in res["throughput"]))
    return failures


def answered_failures(where, row):
    """Every request sent and answered, without an error reply or a timeout."""
    failures = []
    if row["sent"] == 0:
        failures.append("%s: nothing was sent" % where)
    if row["replied"] != row["sent"]:
        failures.append("%s: %d of %d requests answered" % (where, row["replied"], row["sent"]))
    if row["errors"] != 0:
        failures.append("%s: %d errors" % (where, row["errors"]))
    return failures


def authority_failures(build):
    with tempfile.TemporaryDirectory(prefix="eldr-cluster-scale-") as tmp:
        res = bench(build, tmp, "fanin", "--only", "fanin", "--load-sharing", "authority",
                    "--fanin-own-rate", "100", "--fanin-totals", "300,600",
                    "--fanin-duration", "3", "--fanin-skip", "1",
                    # Correctness only: a reply that a loaded CI machine delays past the
                    # generator's default 2 s still counts as answered (35 of 1,800 did so once,
                    # with the other tests running beside it).
                    "--fanin-loadgen-args",
                    "--counts all --prompt-pool 256 --route-timeout-ms 30000")
    if res is None:
        return ["the fan-in case did not run"]
    rows = res["fanin"]["runs"]
    failures = []
    if sorted(row["total_rps"] for row in rows) != [300, 600]:
        failures.append("expected runs at 300 and 600 req/s, got %s" % rows)
    for row in rows:
        where = "authority, %d req/s" % row["total_rps"]
        failures += answered_failures(where, row)
        # The weighted rotation is exact over each window of sum(weights) requests.
        w = row["weights"]
        share = row["sent"] * w[0] / sum(w)
        if abs(row["n1_routed"] - share) > w[0]:
            failures.append("%s: router n1 decided %d requests, its share is %.0f"
                            % (where, row["n1_routed"], share))
        if row["n1_peer_decisions"] != 0 or row["n1_load_vectors_applied"] == 0:
            failures.append("%s: n1 applied %d peer decisions and %d load vectors; load "
                            "authorities send vectors, not decisions"
                            % (where, row["n1_peer_decisions"], row["n1_load_vectors_applied"]))
    if not failures:
        print("ok: %s" % "; ".join("authority at %d req/s: %d of %d answered, n1 decided %d"
                                   % (row["total_rps"], row["replied"], row["sent"],
                                      row["n1_routed"]) for row in rows))
    return failures

def separate_and_idle_failures(build):
    """The baselines the 3-router figures are read against: three single-node clusters side by
    side (--only separate) answer every request; an idle node's CPU (--only idle) is measured."""
    with tempfile.TemporaryDirectory(prefix="eldr-cluster-scale-") as tmp:
        res = bench(build, tmp, "separate", "--only", "separate,idle", "--throughput-routers", "3",
                    "--throughput-rate", "300", "--throughput-duration", "1", "--no-warmup",
                    "--idle-nodes", "1", "--idle-seconds", "1")
    if res is None:
        return ["the separate and idle cases did not run"]
    failures = []
    if [row["routers"] for row in res["separate"]] != [3]:
        failures.append("expected one run of 3 separate nodes, got %s" % res["separate"])
    for row in res["separate"]:
        failures += answered_failures("3 separate nodes", row)
    idle = res["idle"]
    if [row["nodes"] for row in idle] != [1] or not all(
            0 <= row["cpu_ms_per_s"] < 1000 for row in idle):
        failures.append("expected one idle node's CPU in [0, 1000) ms/s, got %s" % idle)
    if not failures:
        print("ok: 3 separate nodes: %s; an idle node: %.0f ms/s" % (
            "; ".join("%d of %d answered" % (r["replied"], r["sent"]) for r in res["separate"]),
            idle[0]["cpu_ms_per_s"]))
    return failures


if __name__ == "__main__":
    sys.exit(main())
