#!/usr/bin/python3
"""The simulator's policy ordering, checked end to end through a running node (issue 15).

For each case below: one eldr-node (embedded default, loopback, ports picked by the OS) and
eldr-loadgen playing the workload through it under each policy in turn (emulated prefill and
decode workers over real sockets, TPOT in model time), then eldr-sim on the same workload (same
seed, same requests, same cost model). Prints per case and policy the median and p99 TPOT of
both, the ordering of the policies by each, and whether the orderings agree; writes everything
to OUT/policy_e2e.json and OUT/policy_e2e.md (each loadgen report as OUT/loadgen-CASE.json).

Cases (docs/evaluation.md, "Through a running node"):
  held-out   the Language preset, 64-token answers, seed 11, 16 decode workers, 160 req/s: the
             paper's band has the best median and the worst p99; eldr-adaptive keeps most of the
             median gain and the best p99.
  task       the Task preset, 16 decode workers, 40 req/s: locality pays for both rules.

usage: /usr/bin/python3 bench/policy_e2e.py --bin-dir build-release [--out out/policy_e2e]
       [--only held-out,task] [--policies eldr-adaptive,eldr,jsq] [--time-scale 0.5]
Builds nothing: --bin-dir is a build tree holding tools/eldr-node, eldr-loadgen and eldr-sim.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "support", "py"))
import eldr_testing  # noqa: E402

CASES = {
    "held-out": {"args": ["--synthetic", "qwen-language", "--output-tokens", "64", "--seed", "11"],
                 "rate": 160, "requests": 2000, "workers": 16},
    "task": {"args": ["--synthetic", "qwen-task", "--seed", "1"],
             "rate": 40, "requests": 1200, "workers": 16},
}

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--bin-dir", required=True)
ap.add_argument("--out", default="out/policy_e2e")
ap.add_argument("--only", default="held-out,task")
ap.add_argument("--policies", default="eldr-adaptive,eldr,jsq")
ap.add_argument("--prefill-workers", type=int, default=8, help="as eldr-sim's default")
ap.add_argument("--time-scale", type=float, default=0.5,
                help="model time = wall time x this: below 1 the emulated workers get wall-clock "
                     "slack, so a busy machine disturbs their timing less")
args = ap.parse_args()


def binary(name):
    for sub in ("tools/" + name + "/" + name, name):
        path = os.path.join(args.bin_dir, sub)
        if os.path.exists(path):
            return path
    sys.exit("policy_e2e: no %s under %s (build it first)" % (name, args.bin_dir))


node_bin, loadgen_bin, sim_bin = binary("eldr-node"), binary("eldr-loadgen"), binary("eldr-sim")
policies = args.policies.split(",")
os.makedirs(args.out, exist_ok=True)


def start_node(work):
    """An all-roles node on the embedded default with OS-picked ports; returns (process, ready)."""
    ready_file = os.path.join(work, "ready.json")
    log = open(os.path.join(work, "node.log"), "w")
    proc = subprocess.Popen(
        eldr_testing.loopback_node_argv(node_bin, os.path.join(work, "data"), metrics="")
        + ["--ready-file", ready_file], stdout=log, stderr=subprocess.STDOUT)
    ready = eldr_testing.wait_ready_file(ready_file, proc, 60)
    if ready is not None:
        return proc, ready
    if proc.poll() is not None:
        sys.exit("policy_e2e: eldr-node exited %d (log in %s)" % (proc.returncode, work))
    proc.kill()
    sys.exit("policy_e2e: eldr-node did not get ready in 60 s")


def order(rows, key):
    return sorted(rows, key=lambda p: rows[p][key])


results = {}
for case in args.only.split(","):
    c = CASES[case]
    work = tempfile.mkdtemp(prefix="policy_e2e-")
    proc, ready = start_node(work)
    try:
        lg = subprocess.run(
            [loadgen_bin, "--node", ready["admin"], *c["args"], "--rate", str(c["rate"]),
             "--duration", "%g" % (c["requests"] / c["rate"]), "--decode-workers",
             str(c["workers"]), "--prefill-workers", str(args.prefill_workers), "--policies",
             ",".join(policies), "--time-scale", "%g" % args.time_scale, "--json", "--quiet"],
            capture_output=True, text=True)
    finally:
        eldr_testing.stop_process(proc, timeout=30)
    if lg.returncode != 0:
        sys.exit("policy_e2e: eldr-loadgen exited %d: %s (node log in %s)"
                 % (lg.returncode, lg.stderr[-2000:], work))
    shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(args.out, "loadgen-%s.json" % case), "w") as f:
        f.write(lg.stdout)
    node = {p: {"p50": r["tpot_p50_ms"], "p99": r["tpot_p99_ms"]}
            for p, r in json.loads(lg.stdout)["policies"].items()}
    sim_out = os.path.join(args.out, "sim-" + case)
    sim = subprocess.run(
        [sim_bin, *c["args"], "--requests", str(c["requests"]), "--rate", str(c["rate"]),
         "--decode-workers", str(c["workers"]), "--prefill-workers", str(args.prefill_workers),
         "--policies", ",".join(policies), "--quiet", "--out", sim_out],
        capture_output=True, text=True)
    if sim.returncode != 0:
        sys.exit("policy_e2e: eldr-sim exited %d: %s" % (sim.returncode, sim.stderr[-2000:]))
    simulated = {}
    with open(os.path.join(sim_out, "summary.csv")) as f:
        head = f.readline().strip().split(",")
        for line in f:
            row = dict(zip(head, line.strip().split(",")))
            simulated[row["policy"]] = {"p50": float(row["tpot_p50_ms"]),
                                        "p99": float(row["tpot_p99_ms"])}
    results[case] = {"node": node, "sim": simulated,
                     "order_p50": {"node": order(node, "p50"), "sim": order(simulated, "p50")},
                     "order_p99": {"node": order(node, "p99"), "sim": order(simulated, "p99")}}

lines = ["| case | policy | TPOT p50 node / sim (ms) | TPOT p99 node / sim (ms) |",
         "|---|---|---|---|"]
for case, r in results.items():
    for i, p in enumerate(policies):
        lines.append("| %s | %s | %.2f / %.2f | %.2f / %.2f |" % (
            case if i == 0 else "", p, r["node"][p]["p50"], r["sim"][p]["p50"],
            r["node"][p]["p99"], r["sim"][p]["p99"]))
lines.append("")
for case, r in results.items():
    for key in ("p50", "p99"):
        o = r["order_" + key]
        lines.append("- %s, %s, lowest first: node %s; sim %s: %s" % (
            case, key, " < ".join(o["node"]), " < ".join(o["sim"]),
            "same order" if o["node"] == o["sim"] else "**orders differ**"))
text = "\n".join(lines) + "\n"
print(text)
with open(os.path.join(args.out, "policy_e2e.md"), "w") as f:
    f.write(text)
with open(os.path.join(args.out, "policy_e2e.json"), "w") as f:
    json.dump(results, f, indent=2)
