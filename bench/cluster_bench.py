#!/usr/bin/python3
"""Cluster benchmarks for BENCHMARKS.md ("Cluster (issue 6)"). Builds nothing: --bin-dir is a
build tree (or a directory) holding eldr-node, eldrctl and eldr-loadgen. Every cluster is started
with deploy/local/eldr-cluster in a temporary directory and always stopped (and removed) again.

  herding     the same total rate with 1, 2 and 4 router nodes (every node all roles), the
              loadgen spreading route requests round robin over every router (--routers) while
              its decode workers register/report/finish at node 1; per policy (jsq, eldr) and
              cluster.load_sync_ms: route p50/p99, TPOT p50/p99, the decode side's in-flight
              imbalance (time-averaged max/mean) and the CV of decisions per worker, each also
              as a ratio to the 1-router figure; per --load-sharing mode (with load authorities
              node 1, where the workers register, is every worker's authority).
  failure     SIGKILL of node 3 of 3 -> time until both survivors list it alive=false (polled
              over the admin endpoint every ~1 ms; also the node's own since_ms_ago); as root,
              the same for a link cut (--netns cluster, `partition 3`), which needs CAF's
              connection timeout. Node 3 is restarted / healed and rejoins between rounds.
  epoch       centroids.import at node 1 -> time until every node's status reports the new epoch.
  throughput  --route-only at a saturating rate with 1, 2, 3 router nodes: replies/s and replies/s
              per core used (nodes' CPU from /proc plus the generator's own).
  shard       route latency when signature shards are on other nodes (--shard-rate, route-only):
              1 node; 2 nodes, node 1 router + load monitor + refit and node 2 the only
              signature-cache node (every shard remote); 3 nodes, all roles (R = 2). Each after a
              warm-up run; rtt p50/p99 after the first 2 s and over the whole run, and per
              decision the shard requests (local ones apart) and replica store messages.
  fanin       per router, the CPU of the cluster's shared state against the cluster's total rate:
              3 nodes (all roles), router n1 at a fixed own rate while n2 and n3 carry the rest,
              so that the total is 1x, 2x, 4x a base (--fanin-own-rate, --fanin-totals), per
              --load-sharing mode; one route-only loadgen spreads the requests with
              --router-weights, its decode workers registered, reporting and finishing at n2 (so
              n1 gets worker traffic only as a peer: forwarded in "decisions" mode, load vectors
              from n2, their authority, in "authority" mode). n1's CPU per second over the steady
              part of each run (sampled from /proc), per own reply, and the ratio to 1x.
  handoff     a node that joins takes its share of a large signature cache: 2 nodes (all roles,
              R = 2); n1's cache is filled with new prompts (--handoff-fill-s), then n2 is killed,
              its data directory emptied and n2 started again, so n1 hands it every block; the
              time from n2's start until n2 has received every block n1 sent, n1's own hand-off
              time (its log line), and route round trips at n1 meanwhile (a probe every 5 ms with
              16 random blocks, which n1's shard looks up) before, during and after.
  separate    N routers that share nothing but the machine: N single-node clusters (for each N of
              --throughput-routers), each with its own generator at 1/N of --throughput-rate,
              all at once; node CPU per reply summed over the N nodes. Against the throughput
              case at the same total rate: what is the cluster's and what is N processes.
  idle        what a cluster costs with no traffic at all (heartbeats, timers, the load
              exchange's heartbeat vectors): 1 and 3 nodes (--idle-nodes, all roles, as
              eldr-cluster starts them), formed and settled for 2 s, then every node's CPU from
              /proc over --idle-seconds; per --load-sharing mode. The floor under every
              per-reply figure: at a rate of X req/s it adds (ms per s) / X to each reply.
  recall      the retry window: 3 nodes (all roles) kept busy by a route-only loadgen at each
              --recall-rates rate; probes send a request to router 1 and, --recall-offsets-ms
              later, its resend marked as a failover (route_request.retry) to router 2 or 3; per
              --load-sharing mode and offset, how many resends got the first decision, and the
              resend's round trip (its router asks the peers first, timeouts.recall_ms).

usage: /usr/bin/python3 bench/cluster_bench.py --bin-dir build-hE [--only herding,fanin,...]
       [--repeat 2] [--out cluster_bench.json]
"""
import argparse
import functools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import zmq

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
script = os.path.join(root, "deploy/local/eldr-cluster")
ap = argparse.ArgumentParser()
ap.add_argument("--bin-dir", required=True)
ap.add_argument("--only", default="herding,failure,epoch,throughput")
ap.add_argument("--repeat", type=int, default=1, help="runs of each herding/throughput case")
ap.add_argument("--rates", default="1000,2000")
ap.add_argument("--routers", default="1,2,4")
ap.add_argument("--policies", default="jsq,eldr")
ap.add_argument("--sync-ms", default="5,50", help="cluster.load_sync_ms values (herding)")
ap.add_argument("--slow-sync-routers", default="2,4",
                help="router counts also run with the non-default load_sync_ms values")
ap.add_argument("--slow-sync-rates", default="2000")
ap.add_argument("--duration", type=float, default=10)
ap.add_argument("--decode-workers", type=int, default=8)
ap.add_argument("--preset", default="qwen-task")
ap.add_argument("--output-tokens", type=int, default=16)
ap.add_argument("--max-batch", type=int, default=256)
ap.add_argument("--prompt-max", type=int, default=512)
ap.add_argument("--kills", type=int, default=10)
ap.add_argument("--partitions", type=int, default=5)
ap.add_argument("--imports", type=int, default=10)
ap.add_argument("--throughput-routers", default="1,2,3")
ap.add_argument("--throughput-rate", type=int, default=30000)
ap.add_argument("--throughput-duration", type=float, default=5)
ap.add_argument("--throughput-loadgen-args", default="",
                help="more eldr-loadgen options for the throughput case, e.g. '--prompt-pool 0' "
                     "(no prefix hits, so no signature shard lookups)")
ap.add_argument("--prepare-budget-mib", type=int, default=4096,
                help="the throughput and separate cases' eldr-loadgen --prepare-budget-mib: enough "
                     "to encode every request before the clock (8,000 req/s x 6 s with every "
                     "block's counts is about 2.5 GiB), so that the generator's preparation does "
                     "not share the cores with the nodes it measures; a run that still prepares "
                     "during its timed phase is said in the log")
ap.add_argument("--cluster-key", action="append", default=[], metavar="KEY=VALUE",
                help="a [cluster] key written into every node's config of every cluster this run "
                     "starts, as TOML (repeatable), e.g. load_sync_ms=20 or "
                     "'load_sharing=\"authority\"'")
ap.add_argument("--keep-logs", default="", metavar="DIR",
                help="copy every cluster's node logs to DIR/clusterN/ before it is removed")
ap.add_argument("--replication", type=int,
                help="cluster.replication of every cluster this run starts (default: the node's, 2); "
                     "e.g. 1 to see what the second copy of each stored block costs")
ap.add_argument("--load-sharing", default="authority",
                help="cluster.load_sharing modes the throughput, herding and fanin cases run, "
                     "side by side (authority,decisions; the node's default is authority)")
ap.add_argument("--fanin-own-rate", type=int, default=250,
                help="fanin: route requests/s at router n1, the same at every total rate")
ap.add_argument("--fanin-totals", default="750,1500,3000",
                help="fanin: the cluster's total route requests/s (1x, 2x, 4x)")
ap.add_argument("--fanin-duration", type=float, default=12)
ap.add_argument("--fanin-skip", type=float, default=4,
                help="fanin: seconds of each run left out of the CPU window (cold prefix caches)")
ap.add_argument("--fanin-loadgen-args", default="--counts all --prompt-pool 256",
                help="more eldr-loadgen options for the fanin runs. The default sends every "
                     "block's counts (eldr-proxy's requests), so that no signature-shard request "
                     "adds a cost of its own that grows with the total rate, and draws from 256 "
                     "prompts, so that new prompts (stored blocks, KV events: a cost per distinct "
                     "prompt, not per request) are over before the window at every rate")
ap.add_argument("--herding-loadgen-args", default="",
                help="more eldr-loadgen options for the herding runs, e.g. '--prefill-workers 4 "
                     "--routers-by-prefill' (each prefill worker's requests at one router)")
ap.add_argument("--shard-sums", default="64/10",
                help="the throughput case's cluster.shard_sum_cache_mib/store_batch_ms[/"
                     "seen_blocks_mib] settings, run side by side (e.g. 0/0/0,64/10/64: all off "
                     "against all on; seen_blocks_mib defaults to 64)")
ap.add_argument("--no-warmup", action="store_true",
                help="throughput: skip the warm-up run (correctness checks, not measurements)")
ap.add_argument("--check-retries", type=int, default=0,
                help="throughput: after the run, route this many new ids at the first router and "
                     "again at each other router in turn, and count the same answers (correctness "
                     "of retries across routers; 0 = skip)")
ap.add_argument("--recall-ids", type=int, default=240,
                help="recall: ids probed per run (spread over the offsets)")
ap.add_argument("--recall-offsets-ms", default="0,0.1,0.2,0.5,1,2,5",
                help="recall: how long after the first request its marked resend is sent")
ap.add_argument("--recall-rates", default="100,2000",
                help="recall: route-only load (req/s, eldr-loadgen over every router) during "
                     "the probes")
ap.add_argument("--shard-rate", type=int, default=500)
ap.add_argument("--shard-threads", type=int, default=1,
                help="runtime.threads of every node in the shard runs (3 processes on 2 cores)")
ap.add_argument("--handoff-grace-ms", type=int, default=0,
                help="cluster.handoff_grace_ms of every node: 0 (the benchmarks measure the "
                     "steady state; with the default 10000 nodes that start together read the "
                     "ring without themselves for 10 s, docs/cluster.md)")
ap.add_argument("--handoff-fill-s", default="4,16",
                help="handoff: seconds of new 1,024-token prompts (64 blocks each) routed at n1 "
                     "before n2 rejoins empty, one run per value")
ap.add_argument("--handoff-wait-s", type=float, default=120,
                help="handoff: how long to wait for n2 to have every block n1 sent")
ap.add_argument("--handoff-fill-rate", type=int, default=400,
                help="handoff: route requests/s while filling n1's signature cache")
ap.add_argument("--idle-nodes", default="1,3", help="idle: cluster sizes, side by side")
ap.add_argument("--idle-seconds", type=float, default=10,
                help="idle: seconds of each CPU window")
ap.add_argument("--out", default="cluster_bench.json")
ap.add_argument("--tables-from", default="",
                help="print the herding and fanin tables of --only from a saved --out file; "
                     "runs nothing")
args = ap.parse_args()


def find_bin(name):
    for c in (os.path.join(args.bin_dir, name), os.path.join(args.bin_dir, "tools", name, name)):
        if os.access(c, os.X_OK):
            return os.path.abspath(c)
    sys.exit("%s not found under %s" % (name, args.bin_dir))


loadgen_bin = find_bin("eldr-loadgen")
find_bin("eldr-node")
find_bin("eldrctl")
ctx = zmq.Context()
results = {"machine": {"cores": os.cpu_count(), "uname": " ".join(os.uname())},
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def log(m):
    print("[cluster_bench %s] %s" % (time.strftime("%H:%M:%S"), m), file=sys.stderr, flush=True)


class Admin:
    """A minimal admin client (docs/protocol.md section 5): one DEALER, msgpack maps."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.n = 0

    def call(self, command, cargs=None, timeout_ms=2000):
        self.n += 1
        rid = "b%d" % self.n
        self.sock.send(msgpack.packb({"version": 1, "type": "admin_request", "id": rid,
                                      "command": command, "args": cargs or {}},
                                     use_bin_type=True))
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise TimeoutError("%s: %s timed out" % (self.endpoint, command))
            r = msgpack.unpackb(self.sock.recv(), raw=False)
            if r.get("id") != rid:
                continue
            if not r.get("ok", False):
                raise RuntimeError("%s: %s: %s" % (self.endpoint, command, r.get("error")))
            return r.get("result")

    def close(self):
        self.sock.close(0)


def members(status):
    c = status.get("cluster") or {}
    return {m["name"]: m for m in c.get("members", [])}


def model_epoch(status):
    ms = status.get("models") or []
    return ms[0].get("epoch") if ms else None


def cpu_of(pid):
    """CPU seconds (user + system) of a process, from /proc."""
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def Cluster(n, netns=False, sync_ms=None, attempts=3, extra=(), load_sharing=None,
            shard_sum_cache_mib=None, store_batch_ms=None, seen_blocks_mib=None):
    """A started cluster; a start that fails (e.g. a port of the temporary directory's range is
    taken by another process on this shared machine) is retried in a fresh directory. `extra`:
    more `eldr-cluster start` options (--roles-of, --threads)."""
    for k in range(attempts):
        try:
            return ClusterOnce(n, netns=netns, sync_ms=sync_ms, extra=extra,
                               load_sharing=load_sharing, shard_sum_cache_mib=shard_sum_cache_mib,
                               store_batch_ms=store_batch_ms, seen_blocks_mib=seen_blocks_mib)
        except RuntimeError as e:
            if k + 1 == attempts:
                raise
            log("cluster start failed, retrying in a new directory: %s" % str(e)[-300:])


class ClusterOnce:
    kept = 0  # clusters whose logs --keep-logs copied so far

    def __init__(self, n, netns=False, sync_ms=None, extra=(), load_sharing=None,
                 shard_sum_cache_mib=None, store_batch_ms=None, seen_blocks_mib=None):
        self.n = n
        self.netns = netns
        self.dir = tempfile.mkdtemp(prefix="eldr-cluster-bench-")
        self.nodes = []
        self.admins = []
        try:
            out = self.script("start", str(n), "--bin", args.bin_dir, "--timeout", "60",
                              "--handoff-grace-ms", str(args.handoff_grace_ms),
                              *(["--netns"] if netns else []), *extra)
            self.nodes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            keys = ""
            if sync_ms is not None and sync_ms != 5:
                keys += "load_sync_ms = %d\n" % sync_ms
            if load_sharing is not None and load_sharing != "authority":
                keys += "load_sharing = \"%s\"\n" % load_sharing
            # Only what differs from the defaults (a key written means a restart of every node).
            if shard_sum_cache_mib is not None and shard_sum_cache_mib != 64:
                keys += "shard_sum_cache_mib = %d\n" % shard_sum_cache_mib
            if store_batch_ms is not None and store_batch_ms != 10:
                keys += "store_batch_ms = %d\n" % store_batch_ms
            if seen_blocks_mib is not None and seen_blocks_mib != 64:
                keys += "seen_blocks_mib = %d\n" % seen_blocks_mib
            if args.replication is not None:
                keys += "replication = %d\n" % args.replication
            for kv in args.cluster_key:
                k, v = kv.split("=", 1)
                keys += "%s = %s\n" % (k.strip(), v.strip())
            if keys:
                for i in range(1, n + 1):
                    p = os.path.join(self.dir, "n%d" % i, "eldr.toml")
                    t = open(p).read().replace("[cluster]\n", "[cluster]\n" + keys, 1)
                    open(p, "w").write(t)
                for i in range(1, n + 1):
                    self.restart(i)
            self.admins = [Admin(nd["admin"]) for nd in self.nodes]
            self.wait_formed()
            # Every figure is labelled with its mode: say so if the nodes run another one.
            for i, a in enumerate(self.admins):
                got = a.call("status").get("cluster", {}).get("router", {}).get("load_sharing")
                if load_sharing is not None and got is not None and got != load_sharing:
                    raise ValueError("n%d runs load_sharing %s, not %s" % (i + 1, got, load_sharing))
        except BaseException:
            self.stop()
            raise

    def script(self, *a):
        r = subprocess.run([script, a[0]] + list(a[1:]) + ["--dir", self.dir],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("eldr-cluster %s: %s" % (" ".join(a), r.stderr[-2000:]))
        return r.stdout

    def restart(self, i):
        line = [x for x in self.script("restart", str(i)).splitlines() if x.startswith("{")][0]
        self.nodes[i - 1] = json.loads(line)

    def pid(self, i):
        return self.nodes[i - 1]["pid"]

    def wait_formed(self, timeout=60):
        """Until every node lists every node alive."""
        deadline = time.monotonic() + timeout
        names = {"n%d" % i for i in range(1, self.n + 1)}
        while time.monotonic() < deadline:
            ok = True
            for a in self.admins:
                try:
                    m = members(a.call("status", timeout_ms=1000))
                except (TimeoutError, RuntimeError):
                    ok = False
                    break
                if set(m) != names or not all(x.get("alive") for x in m.values()):
                    ok = False
                    break
            if ok:
                return
            time.sleep(0.05)
        raise RuntimeError("cluster in %s did not form within %d s" % (self.dir, timeout))

    def stop(self):
        for a in self.admins:
            a.close()
        try:
            self.script("stop")
        except Exception as e:  # noqa: BLE001 -- always try to clean up
            log("stop: %s" % e)
        if args.keep_logs:
            # Each cluster's node logs under its own numbered directory, for reading afterwards.
            ClusterOnce.kept += 1
            dest = os.path.join(args.keep_logs, "cluster%d" % ClusterOnce.kept)
            os.makedirs(dest, exist_ok=True)
            for i in range(1, len(self.nodes) + 1):
                src = os.path.join(self.dir, "n%d" % i, "log")
                if os.path.exists(src):
                    shutil.copy(src, os.path.join(dest, "n%d.log" % i))
            log("node logs kept in %s" % dest)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_loadgen(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("eldr-loadgen failed (%d): %s\n%s" % (r.returncode, " ".join(cmd),
                                                                 r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# ------------------------------------------------------------------------------- herding
def table_head(title, header):
    """Prints a result table's heading, its column names (header: "| a | b |") and the Markdown
    rule under them, one cell per column."""
    print("## " + title)
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))


def herding_cases():
    """(load_sharing, load_sync_ms, routers, rate) of every herding run; the non-default
    load_sync_ms values only at --slow-sync-routers and --slow-sync-rates."""
    cases = []
    for mode in args.load_sharing.split(","):
        for sync in [int(x) for x in args.sync_ms.split(",")]:
            for n in [int(x) for x in args.routers.split(",")]:
                if sync != 5 and str(n) not in args.slow_sync_routers.split(","):
                    continue
                for rate in [int(x) for x in args.rates.split(",")]:
                    if sync != 5 and str(rate) not in args.slow_sync_rates.split(","):
                        continue
                    cases.append((mode, sync, n, rate))
    return cases


def herding_row(mode, sync, n, rate, rep, p, q, load):
    """One policy's figures of a run; load: the 1-minute load average when the run began."""
    return {"load_sharing": mode, "routers": n, "load_sync_ms": sync, "rate": rate, "policy": p,
            "run": rep + 1, "replies": q["replied"], "sent": q["sent"], "errors": q["errors"],
            "timeouts": q["timeouts"], "error_codes": q.get("error_codes"), "route_rps": q["route_rps"],
            "route_p50_us": q["route_p50_us"], "route_p99_us": q["route_p99_us"],
            "tpot_p50_ms": q["tpot_p50_ms"], "tpot_p99_ms": q["tpot_p99_ms"],
            "ttft_p50_ms": q["ttft_p50_ms"], "wall_s": q["wall_s"],
            "ttft_p99_ms": q["ttft_p99_ms"], "batch_size_mean": q["batch_size_mean"],
            "completed": q["completed"], "coverage_mean": q["coverage_mean"],
            "inflight_imbalance": q.get("inflight_imbalance"),
            "inflight_mean": q.get("inflight_mean"), "decision_cv": q.get("decision_cv"),
            "decision_imbalance": q["decision_imbalance"], "incomplete": q["incomplete"],
            "loadgen_cpu_s": q["loadgen_cpu_s"], "load_avg_1m": load}


def herding():
    rows, failed = [], []
    for rep in range(args.repeat):
        for mode, sync, n, rate in herding_cases():
            log("herding: %s, %d routers, load_sync_ms %d, %d req/s (run %d)"
                % (mode, n, sync, rate, rep + 1))
            with Cluster(n, sync_ms=sync, load_sharing=mode) as c:
                admins = [nd["admin"] for nd in c.nodes]
                # Decode workers register, report and finish at node 1: with load authorities
                # node 1 is every worker's authority, and the other routers see its vectors.
                cmd = [loadgen_bin, "--node", admins[0], "--routers", ",".join(admins),
                       "--synthetic", args.preset, "--rate", str(rate), "--duration",
                       str(args.duration), "--decode-workers", str(args.decode_workers),
                       "--policies", args.policies, "--output-tokens", str(args.output_tokens),
                       "--max-batch", str(args.max_batch), "--prompt-max", str(args.prompt_max),
                       "--prefill-base-ms", "0", "--prefill-per-token-ms", "0", "--json",
                       "--quiet",
                       # Preparation in the background: the decode workers report nothing
                       # before the timed phase, and preparing every request first can outlast
                       # worker_timeout_ms on a loaded machine (no_eligible_worker at the start).
                       "--prepare-budget-mib", "64"] + args.herding_loadgen_args.split()
                load = os.getloadavg()[0]
                try:
                    r = run_loadgen(cmd)
                except RuntimeError as e:
                    log(str(e))
                    failed.append({"load_sharing": mode, "routers": n, "load_sync_ms": sync,
                                   "rate": rate, "run": rep + 1, "error": str(e)[-500:]})
                    continue
                for p, q in r["policies"].items():
                    rows.append(herding_row(mode, sync, n, rate, rep, p, q, load))
                results["herding"] = {"runs": rows, "failed": failed}
                save()
    results["herding"] = {"runs": rows, "failed": failed, "cmd_shape": "eldr-loadgen --node A1 "
                          "--routers A1..AN --synthetic %s --duration %g --decode-workers %d "
                          "--policies %s --output-tokens %d --max-batch %d --prompt-max %d "
                          "--prefill-base-ms 0 --prefill-per-token-ms 0" % (
                              args.preset, args.duration, args.decode_workers, args.policies,
                              args.output_tokens, args.max_batch, args.prompt_max)}
    herding_table(rows)
    for f in failed:
        print("failed: %s" % f)


def herding_table(rows):
    """Medians (ranges) per case, and each imbalance figure's ratio to one router's median in
    the same mode, load_sync_ms, rate and policy (the issue's goal: within 5%)."""
    table_head("Herding: %s, %d decode workers, %g s, outputs of %d tokens (medians of %d run(s), "
               "range in brackets; x1 = ratio to the 1-router median)"
               % (args.preset, args.decode_workers, args.duration, args.output_tokens,
                  args.repeat),
               "| load sharing | req/s | load_sync_ms | policy | routers | errors (timeouts) | "
               "route p50 µs | route p99 µs | in-flight max/mean | x1 | decisions CV | x1 | "
               "TPOT p50 ms | x1 | TPOT p99 ms | x1 |")
    keys = sorted({(r["load_sharing"], r["rate"], r["load_sync_ms"], r["policy"], r["routers"])
                   for r in rows})
    for key in keys:
        g = [r for r in rows if (r["load_sharing"], r["rate"], r["load_sync_ms"], r["policy"],
                                 r["routers"]) == key]
        one = [r for r in rows if (r["load_sharing"], r["rate"], r["policy"], r["routers"]) ==
               key[:2] + key[3:4] + (1,)]
        cells = []
        for k, fmt in (("inflight_imbalance", "%.3f"), ("decision_cv", "%.3f"),
                       ("tpot_p50_ms", "%.2f"), ("tpot_p99_ms", "%.2f")):
            xs = [r[k] for r in g if r[k] is not None]
            base = median([r[k] for r in one if r[k] is not None])
            cells.append((fmt + " [" + fmt + "-" + fmt + "]") % (median(xs), min(xs), max(xs))
                         if xs else "-")
            cells.append("%.3f" % (median(xs) / base) if xs and base else "-")
        print("| %s | %d | %d | %s | %d | %d (%d) | %.0f | %.0f | %s |" % (
            key[0], key[1], key[2], key[3], key[4], sum(r["errors"] for r in g),
            sum(r["timeouts"] for r in g), median([r["route_p50_us"] for r in g]),
            median([r["route_p99_us"] for r in g]), " | ".join(cells)))
    print()


# ------------------------------------------------------------------------------- failure
def watch_down(c, victim, survivors, timeout=15.0):
    """Polls the survivors until each lists the victim alive=false; per survivor the seconds from
    t0 (set by the caller right before the kill) to the first poll that saw it, and the node's own
    estimate (poll time - since_ms_ago)."""
    name = "n%d" % victim
    seen = {}
    own = {}
    t0 = watch_down.t0
    deadline = t0 + timeout
    while len(seen) < len(survivors) and time.monotonic() < deadline:
        for s in survivors:
            if s in seen:
                continue
            try:
                st = c.admins[s - 1].call("status", timeout_ms=500)
            except (TimeoutError, RuntimeError):
                continue
            t = time.monotonic()
            m = members(st).get(name)
            if m is not None and not m.get("alive"):
                seen[s] = t - t0
                own[s] = t - m.get("since_ms_ago", 0) / 1000.0 - t0
    return seen, own


def failure():
    out = {}
    modes = [("sigkill", False)]
    if os.geteuid() == 0 and shutil.which("ip"):
        modes.append(("link_down", True))
    for mode, netns in modes:
        rounds = args.kills if mode == "sigkill" else args.partitions
        log("failure detection: %s, %d rounds" % (mode, rounds))
        seen_all, own_all, rejoin = [], [], []
        with Cluster(3, netns=netns) as c:
            for k in range(rounds):
                watch_down.t0 = time.monotonic()
                if mode == "sigkill":
                    os.kill(c.pid(3), 9)
                else:
                    c.script("partition", "3")
                seen, own = watch_down(c, 3, [1, 2])
                if len(seen) < 2:
                    log("round %d: not detected by every survivor within 15 s: %s" % (k, seen))
                seen_all += list(seen.values())
                own_all += list(own.values())
                t1 = time.monotonic()
                if mode == "sigkill":
                    c.restart(3)
                    c.admins[2].close()
                    c.admins[2] = Admin(c.nodes[2]["admin"])
                else:
                    c.script("heal", "3")
                c.wait_formed()
                rejoin.append(time.monotonic() - t1)
        out[mode] = {"detected_s": seen_all, "node_estimate_s": own_all, "rejoin_s": rejoin}
    results["failure"] = out
    table_head("Failure detection: node 3 of 3 lost, both survivors polled (%d SIGKILLs, %d link "
               "cuts)" % (args.kills, args.partitions if len(modes) > 1 else 0),
               "| cause | observations | p50 ms | p90 ms | max ms | node's own estimate p50 / max "
               "ms | rejoin (restart or heal) p50 s |")
    for mode, o in out.items():
        d = o["detected_s"]
        e = o["node_estimate_s"]
        print("| %s | %d | %.1f | %.1f | %.1f | %.1f / %.1f | %.2f |" % (
            mode, len(d), pct(d, 0.5) * 1e3, pct(d, 0.9) * 1e3, max(d or [float("nan")]) * 1e3,
            pct(e, 0.5) * 1e3, max(e or [float("nan")]) * 1e3, median(o["rejoin_s"])))
    print()


# ------------------------------------------------------------------------------- epoch
def epoch():
    n = 3
    log("epoch propagation: %d nodes, %d imports" % (n, args.imports))
    per_import = []
    with Cluster(n) as c:
        admins = [nd["admin"] for nd in c.nodes]
        # A centroid set: the loadgen fits one on the synthetic preset and imports it at node 1.
        run_loadgen([loadgen_bin, "--node", admins[0], "--synthetic", args.preset, "--rate", "200",
                     "--duration", "1", "--decode-workers", str(args.decode_workers),
                     "--route-only", "--policies", "eldr", "--json", "--quiet"])
        f = msgpack.unpackb(c.admins[0].call("centroids.export", {"model": "default"},
                                             timeout_ms=10000), raw=False)
        for k in range(args.imports):
            cur = max(model_epoch(a.call("status")) or 0 for a in c.admins)
            f["epoch"] = cur + 1
            blob = msgpack.packb(f, use_bin_type=True)
            t0 = time.monotonic()
            res = c.admins[0].call("centroids.import", {"model": "default", "file": blob},
                                   timeout_ms=30000)
            t_ack = time.monotonic() - t0
            want = res["epoch"]
            seen = {1: t_ack}
            deadline = t0 + 10
            while len(seen) < n and time.monotonic() < deadline:
                for i in range(2, n + 1):
                    if i in seen:
                        continue
                    e = model_epoch(c.admins[i - 1].call("status", timeout_ms=1000))
                    if e is not None and e >= want:
                        seen[i] = time.monotonic() - t0
            per_import.append({"epoch": want, "ack_s": t_ack,
                               "all_s": max(seen.values()) if len(seen) == n else None,
                               "per_node_s": seen})
            time.sleep(0.2)
    results["epoch"] = per_import
    alls = [p["all_s"] for p in per_import if p["all_s"] is not None]
    acks = [p["ack_s"] for p in per_import]
    table_head("Epoch propagation: centroids.import at n1 of %d, until every node reports the new "
               "epoch (%d imports)" % (n, len(per_import)),
               "| imports | not propagated in 10 s | import ack p50 ms | every node p50 ms | "
               "every node max ms |")
    print("| %d | %d | %.1f | %.1f | %.1f |" % (len(per_import), len(per_import) - len(alls),
                                               median(acks) * 1e3, median(alls) * 1e3,
                                               max(alls or [float("nan")]) * 1e3))
    print()


# ------------------------------------------------------------------------------- throughput
def route_message(request_id, model, blocks, retry=False):
    """A route_request (docs/protocol.md section 3), marked as a failover resend when `retry`."""
    m = {"version": 1, "type": "route_request", "id": request_id, "model": model,
         "blocks": blocks}
    if retry:
        m["retry"] = True
    return msgpack.packb(m, use_bin_type=True)


def route_once(endpoint, request_id, model, blocks, timeout_ms=5000, retry=False):
    """One route request (docs/protocol.md section 3) on its own DEALER: (worker, epoch)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(route_message(request_id, model, blocks, retry))
        if not sock.poll(timeout_ms):
            raise TimeoutError("%s: route %s timed out" % (endpoint, request_id))
        r = msgpack.unpackb(sock.recv(), raw=False)
        if r.get("type") != "route_reply":
            raise RuntimeError("%s: route %s: %s" % (endpoint, request_id, r))
        return r["worker"], r["epoch"]
    finally:
        sock.close(0)


def peer_decisions(admin):
    return admin.call("status").get("cluster", {}).get("router", {}).get("peer_decisions", 0)


def check_retries(c, n, count, mode, timeout=30):
    """Retries at another router: (unmarked, marked), each the number of `count` ids that got the
    first answer again, or None when not checked.

    Unmarked (shared decisions only; in the authority mode routers do not share decisions): new
    ids routed at router 1 and, once every other router has applied that many more of its peers'
    decisions (shared every cluster.load_sync_ms), each again at another router. Marked (both
    modes): new ids routed at router 1 and each resent, marked as a failover resend, at another
    router the moment the first answer arrived -- the other router asks its peers (docs/cluster.md,
    "Retries: ask, don't broadcast")."""
    if count == 0 or n < 2:
        return None, None
    model = c.admins[0].call("status")["models"][0]["name"]
    marked = 0
    for i in range(count):
        blocks = [(i + 1) * 2000003 + b for b in range(4)]
        first = route_once(c.nodes[0]["route"], "marked-check-%d" % i, model, blocks)
        again = route_once(c.nodes[1 + i % (n - 1)]["route"], "marked-check-%d" % i, model,
                           blocks, retry=True)
        marked += first == again
    if mode != "decisions":
        return None, marked
    before = [peer_decisions(a) for a in c.admins[1:]]
    first = []
    for i in range(count):
        blocks = [(i + 1) * 1000003 + b for b in range(4)]
        first.append(route_once(c.nodes[0]["route"], "retry-check-%d" % i, model, blocks))
    deadline = time.monotonic() + timeout
    while any(peer_decisions(a) < b + count for a, b in zip(c.admins[1:], before)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other routers did not apply %d shared decisions" % count)
    same = 0
    for i in range(count):
        blocks = [(i + 1) * 1000003 + b for b in range(4)]
        again = route_once(c.nodes[1 + i % (n - 1)]["route"], "retry-check-%d" % i, model, blocks)
        same += first[i] == again
    return same, marked


# timed_cpu_window: node CPU per reply counts the nodes' CPU from the generator's timed phase
# to its exit. Until 2026-12-05 it counted from before the generator started, so it included
# what the nodes spent during the generator's preparation (its workload, the prefill caches'
# resets, the set's import: 6-7 s at --counts all, longer with several generators on two
# cores), the same whatever the rate; three nodes pay it three times. Both are printed.
def throughput_loadgen(c):
    """The throughput case's eldr-loadgen command for cluster c, without --rate/--duration."""
    admins = [nd["admin"] for nd in c.nodes]
    return [loadgen_bin, "--node", admins[0], "--routers", ",".join(admins),
            "--synthetic", args.preset, "--decode-workers",
            str(args.decode_workers), "--route-only", "--policies", "eldr", "--json",
            "--quiet", "--output-tokens", str(args.output_tokens), "--prompt-max",
            str(args.prompt_max),
            # The cluster is thrown away after the run: no epoch to restore (a restore waits
            # for the refit leader, which an overloaded cluster may be electing again).
            "--keep-centroids", "--prepare-budget-mib", str(args.prepare_budget_mib)] + \
        args.throughput_loadgen_args.split()


def separate():
    """N routers that share nothing but the machine: N single-node clusters side by side, each
    with its own generator at 1/N of --throughput-rate, run at once. Against the throughput
    case's N-router cluster at the same total rate, what is the cluster's own cost and what is
    N processes on these cores."""
    rows = []
    for rep in range(args.repeat):
        for n in [int(x) for x in args.throughput_routers.split(",")]:
            rate = args.throughput_rate // n
            log("separate: %d single-node clusters at %d req/s each (run %d)" % (n, rate, rep + 1))
            clusters = []
            try:
                for _ in range(n):
                    clusters.append(Cluster(1))
                bases = [throughput_loadgen(c) for c in clusters]
                if not args.no_warmup:
                    for b in bases:
                        run_loadgen(b + ["--rate", "1000", "--duration", "2"])
                load = os.getloadavg()[0]
                out = [None] * n
                cpu_prep = [cpu_of(c.pid(1)) for c in clusters]
                cpu0 = [float("nan")] * n

                # Each node's CPU from its own generator's timed phase on (timed_cpu_window).
                def one(i):
                    def start():
                        cpu0[i] = cpu_of(clusters[i].pid(1))
                    out[i], _ = run_loadgen_timed(
                        bases[i] + ["--rate", str(rate), "--duration",
                                    str(args.throughput_duration)], start)
                threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                cpu1 = [cpu_of(c.pid(1)) for c in clusters]
            finally:
                for c in clusters:
                    c.stop()
            if any(r is None for r in out):
                raise RuntimeError("separate: a generator failed (see above)")
            node_cpu = sum(b - a for a, b in zip(cpu0, cpu1))
            with_prep = sum(b - a for a, b in zip(cpu_prep, cpu1))
            replied = sum(r["replied"] for r in out)
            row = {"routers": n, "run": rep + 1, "offered": rate * n, "replied": replied,
                   "sent": sum(r["sent"] for r in out), "errors": sum(r["errors"] for r in out),
                   "route_rps": sum(r["route_rps"] for r in out), "node_cpu_s": node_cpu,
                   "node_cpu_us_per_reply": node_cpu / replied * 1e6 if replied else float("nan"),
                   "node_cpu_us_per_reply_with_prep":
                       with_prep / replied * 1e6 if replied else float("nan"),
                   "route_p50_us": median([r["route_p50_us"] for r in out]),
                   # Each generator's p99 over its own node; the worst of them bounds the
                   # pooled p99 from above.
                   "route_p99_us_worst": max(r["route_p99_us"] for r in out),
                   "load_avg_1m": load}
            rows.append(row)
            log("separate: %s" % json.dumps(row))
    results["separate"] = rows
    table_head("N single-node clusters side by side (%d req/s offered in all, route-only, %g s)"
               % (args.throughput_rate, args.throughput_duration),
               "| run | nodes | replies/s | errors | node CPU µs per reply | the same with the "
               "generators' preparation | rtt p50 µs (median of the nodes) | rtt p99 µs (the "
               "worst node's) | load avg 1m |")
    for r in rows:
        print("| %d | %d | %.0f | %d | %.0f | %.0f | %.0f | %.0f | %.1f |" % (
            r["run"], r["routers"], r["route_rps"], r["errors"], r["node_cpu_us_per_reply"],
            r["node_cpu_us_per_reply_with_prep"],
            r["route_p50_us"], r["route_p99_us_worst"], r["load_avg_1m"]))
    print()


def throughput():
    rows = []
    modes = args.load_sharing.split(",")
    for rep in range(args.repeat):
        for mode, sums, n in [(m, s, int(x)) for m in modes
                              for s in args.shard_sums.split(",")
                              for x in args.throughput_routers.split(",")]:
            mib, batch, seen = (sums.split("/") + ["10", "64"][len(sums.split("/")) - 1:])[:3]
            log("throughput: %d routers at %d req/s, load_sharing %s, shard_sum_cache_mib %s, "
                "store_batch_ms %s (run %d)" % (n, args.throughput_rate, mode, mib, batch, rep + 1))
            with Cluster(n, load_sharing=mode, shard_sum_cache_mib=int(mib),
                         store_batch_ms=int(batch), seen_blocks_mib=int(seen)) as c:
                base = throughput_loadgen(c)
                if not args.no_warmup:
                    run_loadgen(base + ["--rate", "1000", "--duration", "2"])
                k0 = router_counters(c.admins)
                p0 = peer_counters(c.admins)
                pids = {c.pid(i) for i in range(1, n + 1)}
                b0 = peer_bytes(pids)
                f0 = shard_failure_counters(c.admins)
                load = os.getloadavg()[0]
                cpu_prep = [cpu_of(c.pid(i)) for i in range(1, n + 1)]
                cpu0 = []

                # The nodes' CPU from the generator's timed phase on (timed_cpu_window).
                def start():
                    cpu0.extend(cpu_of(c.pid(i)) for i in range(1, n + 1))
                r, _ = run_loadgen_timed(base + ["--rate", str(args.throughput_rate),
                                                 "--duration", str(args.throughput_duration)],
                                         start)
                cpu1 = [cpu_of(c.pid(i)) for i in range(1, n + 1)]
                k1 = router_counters(c.admins)
                p1 = peer_counters(c.admins)
                b1 = peer_bytes(pids)
                f1 = shard_failure_counters(c.admins)
                retries_same, marked_same = check_retries(c, n, args.check_retries, mode)
                decided = k1[0] - k0[0]
                # Messages to other nodes on the requests' path: shard requests not to the own
                # shard, and the replica stores (load sharing's batched messages are apart).
                asked = (k1[1] - k0[1]) - (k1[2] - k0[2])
                stores = k1[3] - k0[3]
                node_cpu = sum(b - a for a, b in zip(cpu0, cpu1))
                with_prep = sum(b - a for a, b in zip(cpu_prep, cpu1))
                wall = r["wall_s"]
                cores = (node_cpu + r["loadgen_cpu_s"]) / wall if wall > 0 else float("nan")
                per_decision = {k + "_per_decision": (p1[k] - p0[k]) / decided if decided
                                else float("nan") for k in PEER_COUNTERS}
                per_decision["peer_bytes_per_decision"] = (
                    (b1 - b0) / decided if decided and b0 is not None and b1 is not None
                    else float("nan"))
                log("throughput: across nodes per decision: %s; the generator's worker "
                    "messages %d" % (json.dumps(per_decision), r.get("worker_messages", -1)))
                rows.append({**per_decision, "worker_messages": r.get("worker_messages"),
                             "routers": n, "load_sharing": mode, "shard_sums_mib": sums,
                             "run": rep + 1, "retries_checked": args.check_retries,
                             "retries_same": retries_same,
                             "marked_retries_same": marked_same,
                             "remote_asks_per_decision": asked / decided if decided else float("nan"),
                             "coverage": r.get("coverage_mean", float("nan")),
                             "remote_stores_per_decision":
                                 stores / decided if decided else float("nan"),
                             "failovers_per_decision":
                                 (f1[0] - f0[0]) / decided if decided else float("nan"),
                             "failures_per_decision":
                                 (f1[1] - f0[1]) / decided if decided else float("nan"),
                             "failovers_refused":
                                 f1[2] - f0[2], "load_avg_1m": load,
                             "offered": args.throughput_rate,
                             "node_cpu_us_per_reply": node_cpu / r["replied"] * 1e6
                             if r["replied"] else float("nan"),
                             "node_cpu_us_per_reply_with_prep": with_prep / r["replied"] * 1e6
                             if r["replied"] else float("nan"),
                             "route_rps": r["route_rps"], "replied": r["replied"],
                             "sent": r["sent"], "errors": r["errors"],
                             "route_p50_us": r["route_p50_us"], "route_p99_us": r["route_p99_us"],
                             "node_cpu_s": node_cpu, "loadgen_cpu_s": r["loadgen_cpu_s"],
                             "wall_s": wall, "cores_used": cores,
                             "replies_per_core": r["route_rps"] / cores if cores else float("nan"),
                             "replies_per_node_core": r["route_rps"] / (node_cpu / wall)
                             if node_cpu > 0 and wall > 0 else float("nan")})
    results["throughput"] = rows
    table_head("Route throughput at saturation (%d req/s offered, route-only, %g s, eldr, 2 cores "
               "shared by the nodes and the generator; medians of %d run(s))"
               % (args.throughput_rate, args.throughput_duration, args.repeat),
               "| load sharing | shard sums MiB / store batch ms | routers | replies/s | errors | "
               "coverage | remote shard requests per decision | remote store messages per "
               "decision | shard failovers (failures) per decision | rtt p50 µs | rtt p99 µs | node CPU s "
               "| node CPU µs per reply | the same with the generator's preparation | loadgen "
               "CPU s | cores used | replies/s per core used | "
               "replies/s per node core | load avg 1m |")
    for mode, sums, n in sorted({(r["load_sharing"], r["shard_sums_mib"], r["routers"])
                                 for r in rows}):
        g = [r for r in rows if r["routers"] == n and r["load_sharing"] == mode
             and r["shard_sums_mib"] == sums]
        m = lambda k: median([r[k] for r in g])  # noqa: E731
        print("| %s | %s | %d | %.0f | %d | %.3f | %.3f | %.3f | %.3f (%.3f) | %.0f | %.0f | %.2f "
              "| %.0f | %.0f | %.2f | %.2f | %.0f | %.0f | %s |" % (
            mode, sums, n, m("route_rps"), max(r["errors"] for r in g), m("coverage"),
            m("remote_asks_per_decision"), m("remote_stores_per_decision"),
            m("failovers_per_decision"), m("failures_per_decision"), m("route_p50_us"),
            m("route_p99_us"), m("node_cpu_s"), m("node_cpu_us_per_reply"),
            m("node_cpu_us_per_reply_with_prep"), m("loadgen_cpu_s"),
            m("cores_used"), m("replies_per_core"), m("replies_per_node_core"),
            "-".join("%.1f" % x for x in sorted({min(r["load_avg_1m"] for r in g),
                                                  max(r["load_avg_1m"] for r in g)}))))
    print()


# ------------------------------------------------------------------------------------ shard
# What crosses between the nodes, by kind, counted by the routers (summed over the nodes):
# decisions applied from peers (batched every load_sync_ms: about one message per peer and
# interval), worker messages a peer's load monitor forwarded (one message each), and with load
# authorities the deltas and vectors sent (one message each).
PEER_COUNTERS = ("peer_decisions", "peer_worker_messages", "load_deltas_sent", "load_vectors_sent")


def peer_bytes(pids):
    """Bytes sent so far over the TCP connections between the nodes `pids` (both ends a node's
    socket: CAF's middleman), from `ss -tinp`; None when ss is missing."""
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
    except OSError:
        return None
    sent = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"pid=(\d+)", line)
        if not m or int(m.group(1)) not in pids or i + 1 >= len(lines):
            continue
        b = re.search(r"bytes_sent:(\d+)", lines[i + 1])
        f = line.split()
        sent[(f[3], f[4])] = int(b.group(1)) if b else 0
    return sum(v for (a, b), v in sent.items() if (b, a) in sent)


def peer_counters(admins):
    out = dict.fromkeys(PEER_COUNTERS, 0)
    for a in admins:
        r = a.call("status").get("cluster", {}).get("router", {})
        for k in PEER_COUNTERS:
            out[k] += r.get(k, 0)
    return out


def router_counters(admins):
    """Summed over the nodes: (decisions, shard requests, of them local, replica stores)."""
    d = q = loc = st = 0
    for a in admins:
        s = a.call("status")
        r = s.get("cluster", {}).get("router", {})
        q += r.get("shard_requests", 0)
        loc += r.get("shard_local_requests", 0)
        st += r.get("shard_store_messages", 0)
        d += sum(m.get("routed", 0) for m in s.get("models", []))
    return d, q, loc, st


def shard_failure_counters(admins):
    """Summed over the nodes: (shard failovers, shard failures, failovers refused by the
    failover budget; 0 from a build without it)."""
    fo = fa = refused = 0
    for a in admins:
        r = a.call("status").get("cluster", {}).get("router", {})
        fo += r.get("shard_failovers", 0)
        fa += r.get("shard_failures", 0)
        refused += r.get("shard_failovers_refused", 0)
    return fo, fa, refused


def shard_histograms(nodes):
    """eldr_shard_request_seconds{shard="remote"} summed over the nodes' /metrics: {le: count}."""
    import urllib.request
    out = {}
    pat = re.compile(r'^eldr_shard_request_seconds_bucket\{(?=[^}]*shard="remote")[^}]*'
                     r'le="([^"]+)"[^}]*\} (\d+)')
    for nd in nodes:
        url = nd.get("metrics") or ""
        if not url:
            continue
        with urllib.request.urlopen(url, timeout=5) as f:
            for line in f.read().decode().splitlines():
                m = pat.match(line)
                if m:
                    le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
                    out[le] = out.get(le, 0) + int(m.group(2))
    return out


def histogram_quantile(before, after, q):
    """The q-quantile (seconds) of the observations between two cumulative bucket scrapes,
    interpolated linearly inside the bucket, as Prometheus does; nan when there were none."""
    les = sorted(after)
    cum = [after[le] - before.get(le, 0) for le in les]
    if not cum or cum[-1] == 0:
        return float("nan")
    rank = q * cum[-1]
    lo_le, lo_c = 0.0, 0
    for le, c in zip(les, cum):
        if c >= rank:
            if le == float("inf"):
                return lo_le
            return lo_le + (le - lo_le) * (rank - lo_c) / max(c - lo_c, 1)
        lo_le, lo_c = le, c
    return les[-1]


def shard():
    setups = [("1 node", 1, []),
              ("2 nodes, every shard remote", 2,
               ["--roles-of", "1=router,load-monitor,refit", "--roles-of", "2=signature-cache"]),
              ("3 nodes, all roles", 3, [])]
    rows = []
    for rep in range(args.repeat):
        for name, n, roles in setups:
            log("shard: %s at %d req/s (run %d)" % (name, args.shard_rate, rep + 1))
            with Cluster(n, extra=roles + ["--threads", str(args.shard_threads)]) as c:
                routers = [nd["admin"] for nd, a in zip(c.nodes, c.admins)
                           if "router" in a.call("status").get("node", {}).get("roles", [])]
                base = [loadgen_bin, "--node", c.nodes[0]["admin"], "--routers", ",".join(routers),
                        "--synthetic", args.preset, "--decode-workers", str(args.decode_workers),
                        "--route-only", "--policies", "eldr", "--json", "--quiet",
                        "--rate", str(args.shard_rate)]
                run_loadgen(base + ["--duration", "4"])  # warm-up: the stores' first writes
                before = router_counters(c.admins)
                h0 = shard_histograms(c.nodes)
                r = run_loadgen(base + ["--duration", "8", "--warmup", "2"])
                h1 = shard_histograms(c.nodes)
                after = router_counters(c.admins)
                d, q, loc, st = (b - a for a, b in zip(before, after))
                remote_n = (h1.get(float("inf"), 0) - h0.get(float("inf"), 0))
                over_1ms = remote_n - (h1.get(1e-3, 0) - h0.get(1e-3, 0))
                rows.append({"setup": name, "run": rep + 1, "rate": args.shard_rate,
                             "route_p50_us": r["route_p50_us"], "route_p99_us": r["route_p99_us"],
                             "route_p99_all_us": r["route_p99_all_us"], "errors": r["errors"],
                             "decisions": d, "shard_per_decision": q / d if d else float("nan"),
                             "local_per_decision": loc / d if d else float("nan"),
                             "stores_per_decision": st / d if d else float("nan"),
                             "remote_shard_p50_us": 1e6 * histogram_quantile(h0, h1, 0.5),
                             "remote_shard_p99_us": 1e6 * histogram_quantile(h0, h1, 0.99),
                             "remote_shard_over_1ms": over_1ms / remote_n if remote_n else
                             float("nan")})
    results["shard"] = rows
    table_head("Route latency with signature shards on other nodes (%d req/s, route-only, "
               "runtime.threads %d per node, after a 4 s warm-up; %d run(s) each)"
               % (args.shard_rate, args.shard_threads, args.repeat),
               "| setup | run | errors | rtt p50 µs | rtt p99 µs (after 2 s) | rtt p99 µs, whole run | "
               "shard requests per decision (local) | remote store messages per decision | "
               "remote shard request p50 / p99 µs (whole run) | remote shard requests > 1 ms |")
    for r in rows:
        print("| %s | %d | %d | %.0f | %.0f | %.0f | %.2f (%.2f) | %.2f | %.0f / %.0f | %.1f%% |" % (
            r["setup"], r["run"], r["errors"], r["route_p50_us"], r["route_p99_us"],
            r["route_p99_all_us"], r["shard_per_decision"], r["local_per_decision"],
            r["stores_per_decision"], r["remote_shard_p50_us"], r["remote_shard_p99_us"],
            100 * r["remote_shard_over_1ms"]))
    print()


# ------------------------------------------------------------------------------------ fanin
class CpuSampler:
    """A process's CPU seconds from /proc every `period` s on a thread, so that the CPU of a
    window inside a run can be read afterwards: the loadgen's setup, cold prefix caches and drain
    are then left out of the figure."""

    def __init__(self, pid, period=0.1):
        self.pid = pid
        self.period = period
        self.samples = []  # (time.monotonic(), CPU s)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done.is_set():
            self.samples.append((time.monotonic(), cpu_of(self.pid)))
            self.done.wait(self.period)

    def close(self):
        self.done.set()
        self.thread.join()

    def at(self, t):
        """CPU seconds at time t, interpolated linearly between the samples around it."""
        s = self.samples
        for (t0, c0), (t1, c1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c0
        return float("nan")

    def rate(self, t0, t1):
        """CPU seconds per second over [t0, t1]."""
        return (self.at(t1) - self.at(t0)) / (t1 - t0)


def run_loadgen_timed(cmd, on_start=None):
    """run_loadgen, and the time its timed phase began: the loadgen says "timed phase begins" on
    stderr right before its first request (a --quiet in `cmd` is left out, since it silences
    that line). `on_start`, if given, is called at that moment (e.g. to read the nodes' CPU)."""
    cmd = [a for a in cmd if a != "--quiet"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = []
    tail = []

    def read_stderr():
        for line in p.stderr:
            if not started and "timed phase begins" in line:
                started.append(time.monotonic())
                if on_start is not None:
                    on_start()
            tail.append(line)
            del tail[:-40]

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    out = p.stdout.read()
    p.wait()
    reader.join()
    if p.returncode != 0 or not started:
        raise RuntimeError("eldr-loadgen failed (%d): %s\n%s" % (p.returncode, " ".join(cmd),
                                                                 "".join(tail)[-2000:]))
    r = json.loads(out.strip().splitlines()[-1])
    if r.get("prepared_at_start", 0) < r.get("requests", 0):
        log("warning: the generator prepared %d of its %d requests before its clock: it encoded "
            "the rest during the timed phase, on the nodes' cores (its --prepare-budget-mib was "
            "full)" % (r["prepared_at_start"], r["requests"]))
    return r, started[0]


def fanin_weights(own, total):
    """--router-weights giving n1 `own` of `total` req/s and n2, n3 half the rest each."""
    w = [2 * own, total - own, total - own]
    g = functools.reduce(math.gcd, w)
    return [x // g for x in w]


def n1_counters(admin):
    """Router n1's own decisions and the load-sharing traffic it received or sent."""
    s = admin.call("status")
    r = s.get("cluster", {}).get("router", {})
    out = {k: r.get(k, 0) for k in ("peer_decisions", "peer_worker_messages", "load_deltas_sent",
                                     "load_vectors_applied")}
    out["routed"] = sum(m.get("routed", 0) for m in s.get("models", []))
    # Its signature-cache shard: the shard requests it answered (the routers' sums of prefix
    # hits; n1 routes little or nothing, so nearly all are other routers') and its commits.
    caches = s.get("signature_cache") or []
    caches = caches if isinstance(caches, list) else []
    out["shard_signed"] = sum(m.get("signed_requests", 0) for m in caches)
    out["shard_commits"] = sum(m.get("commits", 0) for m in caches)
    return out


def fanin_run(c, mode, rep, total, mult):
    """One run at `total` req/s, n1 at --fanin-own-rate: n1's CPU over the steady part."""
    admins = [nd["admin"] for nd in c.nodes]
    weights = fanin_weights(args.fanin_own_rate, total)
    cmd = [loadgen_bin, "--node", admins[1], "--routers", ",".join(admins),
           "--router-weights", ",".join(map(str, weights)), "--synthetic", args.preset,
           "--decode-workers", str(args.decode_workers), "--route-only", "--policies", "eldr",
           "--json", "--output-tokens", str(args.output_tokens), "--prompt-max",
           str(args.prompt_max), "--rate", str(total), "--duration", str(args.fanin_duration),
           # The warm-up imported the set; an import per run would land in the measured CPU.
           "--no-import", "--keep-centroids",
           # Preparation in the background from the start: the workers send no load report
           # before the timed phase, and a preparation of every request up front took longer
           # than worker_timeout_ms at 2,400 req/s (no_eligible_worker at the run's start).
           "--prepare-budget-mib", "64"] + args.fanin_loadgen_args.split()
    load = os.getloadavg()[0]
    samplers = [CpuSampler(c.pid(i)) for i in range(1, 4)]
    k0 = n1_counters(c.admins[0])
    try:
        r, t_play = run_loadgen_timed(cmd)
    finally:
        for s in samplers:
            s.close()
    k1 = n1_counters(c.admins[0])
    q = r["policies"]["eldr"]
    # The steady part: after --fanin-skip s (every prompt of the pool seen by now, so the prefix
    # caches are warm at every rate alike) until 0.5 s before the last arrival.
    w0, w1 = t_play + args.fanin_skip, t_play + args.fanin_duration - 0.5
    cpu = [s.rate(w0, w1) for s in samplers]
    d = {k: k1[k] - k0[k] for k in k0}
    wall = q["wall_s"]
    own_rps = d["routed"] / wall if wall > 0 else float("nan")
    return {"load_sharing": mode, "run": rep + 1, "total_rps": total, "multiple": mult,
            "weights": weights, "load_avg_1m": load, "sent": q["sent"], "replied": q["replied"],
            "errors": q["errors"], "timeouts": q["timeouts"],
            "error_replies": q["error_replies"], "error_codes": q.get("error_codes"),
            "route_rps": q["route_rps"], "route_p50_us": q["route_p50_us"],
            "route_p99_us": q["route_p99_us"], "wall_s": wall, "own_rps": own_rps, "n1_cpu_per_s": cpu[0],
            "n2_cpu_per_s": cpu[1], "n3_cpu_per_s": cpu[2],
            "n1_cpu_us_per_own_reply": cpu[0] / own_rps * 1e6 if own_rps else float("nan"),
            "loadgen_cpu_s": q["loadgen_cpu_s"], "prepare_stalls": q.get("prepare_stalls"),
            "worker_messages": q["worker_messages"],
            "worker_errors": q["worker_errors"],
            "n1_routed": d["routed"], "n1_peer_decisions": d["peer_decisions"],
            "n1_load_vectors_applied": d["load_vectors_applied"],
            "n1_peer_decisions_per_s": d["peer_decisions"] / wall,
            "n1_peer_worker_messages_per_s": d["peer_worker_messages"] / wall,
            "n1_load_deltas_sent_per_s": d["load_deltas_sent"] / wall,
            "n1_load_vectors_applied_per_s": d["load_vectors_applied"] / wall,
            "n1_shard_signed_per_s": d["shard_signed"] / wall,
            "n1_shard_commits_per_s": d["shard_commits"] / wall}


def fanin_idle(c, seconds=3.0):
    """n1's CPU per second with no traffic at all (heartbeats, timers): the floor of every run."""
    s = CpuSampler(c.pid(1))
    time.sleep(seconds)
    s.close()
    return s.rate(s.samples[0][0], s.samples[-1][0])


def fanin():
    totals = [int(x) for x in args.fanin_totals.split(",")]
    rows, idle = [], []
    for rep in range(args.repeat):
        for mode in args.load_sharing.split(","):
            log("fanin: load_sharing %s, n1 at %d req/s, totals %s (run %d)"
                % (mode, args.fanin_own_rate, totals, rep + 1))
            with Cluster(3, load_sharing=mode) as c:
                admins = [nd["admin"] for nd in c.nodes]
                # Warm-up: imports the centroid set at n2 (kept), registers the workers.
                run_loadgen([loadgen_bin, "--node", admins[1], "--routers", ",".join(admins),
                             "--synthetic", args.preset, "--decode-workers",
                             str(args.decode_workers), "--route-only", "--policies", "eldr",
                             "--json", "--quiet", "--output-tokens", str(args.output_tokens),
                             "--prompt-max", str(args.prompt_max), "--rate", str(totals[0]),
                             "--duration", "3", "--keep-centroids"]
                            + args.fanin_loadgen_args.split())
                idle.append({"load_sharing": mode, "run": rep + 1,
                             "n1_cpu_per_s": fanin_idle(c)})
                # Every other repeat the other way round, so drift over a cluster's life (or the
                # machine's load) does not line up with the rate.
                order = list(enumerate(totals))
                if rep % 2:
                    order.reverse()
                for k, total in order:
                    log("fanin: %s, total %d req/s" % (mode, total))
                    rows.append(fanin_run(c, mode, rep, total, total / totals[0]))
                    results["fanin"] = {"runs": rows, "idle": idle, "totals": totals}
                    save()
    results["fanin"] = {"runs": rows, "idle": idle, "own_rate": args.fanin_own_rate,
                        "totals": totals, "duration_s": args.fanin_duration,
                        "loadgen_args": args.fanin_loadgen_args}
    fanin_table(results["fanin"])


def slope(xs, ys):
    """Least-squares slope of ys over xs and its standard error (nan with under 3 points)."""
    n = len(xs)
    if n < 3:
        return float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return b, math.sqrt(resid / (n - 2) / sxx)


def m2(rows, key):
    """Median of a key that older result files lack (nan then)."""
    xs = [r[key] for r in rows if key in r]
    return median(xs) if xs else float("nan")


def fanin_table(res):
    """The fan-in table from the case's results (also from a saved file: --tables-from)."""
    rows, idle, totals = res["runs"], res["idle"], res["totals"]
    table_head("Fan-in: router n1 of 3 at %d req/s own rate, the cluster at %s req/s total "
               "(route-only, %s; medians of %d run(s), range in brackets)"
               % (res["own_rate"], "/".join(map(str, totals)), res["loadgen_args"],
                  max(r["run"] for r in rows)),
               "| load sharing | total req/s | errors (timeouts) | n1 own replies/s | n1 peer "
               "decisions/s | n1 peer worker msgs/s | n1 load vectors/s | n1 CPU ms/s | "
               "n1 CPU µs per own reply | n1 CPU / 1x | n2 CPU ms/s | n3 CPU ms/s | "
               "n1 shard requests answered/s | n1 shard commits/s |")
    for mode in sorted({r["load_sharing"] for r in rows}):
        base = None
        for total in totals:
            g = [r for r in rows if r["load_sharing"] == mode and r["total_rps"] == total]
            if not g:
                continue
            m = lambda k: median([r[k] for r in g])  # noqa: E731
            cpu = [r["n1_cpu_per_s"] * 1e3 for r in g]
            base = median(cpu) if base is None else base
            print("| %s | %d | %d (%d) | %.0f | %.0f | %.0f | %.0f | %.1f [%.1f-%.1f] | %.0f | "
                  "%.2f | %.0f | %.0f | %.0f | %.0f |" % (
                      mode, total, sum(r["errors"] for r in g), sum(r["timeouts"] for r in g),
                      m("own_rps"), m("n1_peer_decisions_per_s"),
                      m("n1_peer_worker_messages_per_s"), m("n1_load_vectors_applied_per_s"),
                      median(cpu), min(cpu), max(cpu), m("n1_cpu_us_per_own_reply"),
                      median(cpu) / base, m("n2_cpu_per_s") * 1e3, m("n3_cpu_per_s") * 1e3,
                      m2(g, "n1_shard_signed_per_s"), m2(g, "n1_shard_commits_per_s")))
    print()
    for mode in sorted({r["load_sharing"] for r in rows}):
        # What one more request/s elsewhere in the cluster costs router n1: its shared-state
        # cost per event (a peer decision and the forwarded finished id, or nothing).
        g = [r for r in rows if r["load_sharing"] == mode]
        b, se = slope([r["total_rps"] - r["own_rps"] for r in g], [r["n1_cpu_per_s"] for r in g])
        xs = [i["n1_cpu_per_s"] * 1e3 for i in idle if i["load_sharing"] == mode]
        print("- %s: n1 CPU per request/s routed elsewhere %.2f ± %.2f µs (least squares over %d "
              "runs, ± one standard error); n1 idle %.1f ms/s [%.1f-%.1f]"
              % (mode, b * 1e6, se * 1e6, len(g), median(xs), min(xs), max(xs)))
        # The same CPU against the shard requests n1's shard answered: what one answered shard
        # request costs the answering node, the commits of the stores that come with the same
        # traffic included (both grow with the rate, so one slope holds both).
        if all("n1_shard_signed_per_s" in r for r in g):
            b, se = slope([r["n1_shard_signed_per_s"] for r in g],
                          [r["n1_cpu_per_s"] for r in g])
            print("  %s: n1 CPU per shard request answered/s %.2f ± %.2f µs (stores' commits "
                  "included)" % (mode, b * 1e6, se * 1e6))
    print()


# ----------------------------------------------------------------------------------- recall
def recalled_at(admin):
    r = admin.call("status")["cluster"]["router"]
    return r.get("recalled", 0) + r.get("marked_retries_remembered", 0)


def recall_probe(c, model, i, offset_ms):
    """Request `i` at router 1 and, `offset_ms` after it was sent, its marked failover resend at
    router 2 or 3; both answered: (actual offset s, first rtt s, resend rtt s, same decision,
    whether the resend's router knew the first decision: asked of its peers or remembered)."""
    a = ctx.socket(zmq.DEALER)
    b = ctx.socket(zmq.DEALER)
    other = 1 + i % (c.n - 1)
    try:
        for s, node in ((a, c.nodes[0]), (b, c.nodes[other])):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(node["route"])
        rid = "recall-probe-%d" % i
        blocks = [(i + 1) * 3000017 + k for k in range(4)]
        # Connect both first (a dummy round trip each), so the offset is the resend's alone.
        for s in (a, b):
            s.send(route_message(rid + "-warm-" + str(id(s)), model, blocks))
            if not s.poll(5000):
                raise TimeoutError("recall: a warm-up route timed out")
            s.recv()
        known0 = recalled_at(c.admins[other])
        replies = {}
        t0 = time.perf_counter()
        a.send(route_message(rid, model, blocks))
        while time.perf_counter() - t0 < offset_ms * 1e-3:
            if a not in replies and a.poll(0):  # the first answer's time, not the wait's
                replies[a] = (time.perf_counter(), msgpack.unpackb(a.recv(), raw=False))
        t1 = time.perf_counter()
        b.send(route_message(rid, model, blocks, retry=True))
        poller = zmq.Poller()
        poller.register(a, zmq.POLLIN)
        poller.register(b, zmq.POLLIN)
        while len(replies) < 2:
            ready = dict(poller.poll(5000))
            if not ready:
                raise TimeoutError("recall: %s not answered" % rid)
            for s in (a, b):
                if s in ready and s not in replies:
                    replies[s] = (time.perf_counter(), msgpack.unpackb(s.recv(), raw=False))
        (ta, ra), (tb, rb) = replies[a], replies[b]
        if ra.get("type") != "route_reply" or rb.get("type") != "route_reply":
            raise RuntimeError("recall: %s: %s / %s" % (rid, ra, rb))
        return (t1 - t0, ta - t0, tb - t1,
                (ra["worker"], ra["epoch"]) == (rb["worker"], rb["epoch"]),
                recalled_at(c.admins[other]) > known0)
    finally:
        a.close(0)
        b.close(0)


def recall():
    """The retry-at-another-router window (issue 14): a client's resend marked as a failover,
    sent to another router some time after the first request, while eldr-loadgen keeps the
    routers busy at a given rate. Same = the resend got the first decision (its router asked the
    peers, or -- shared decisions -- had heard of it)."""
    offsets = [float(x) for x in args.recall_offsets_ms.split(",")]
    rows = []
    for mode in args.load_sharing.split(","):
        for rate in [int(x) for x in args.recall_rates.split(",")]:
            for rep in range(args.repeat):
                log("recall: %s, %d req/s around the probes (run %d)" % (mode, rate, rep + 1))
                with Cluster(3, load_sharing=mode) as c:
                    admins = [nd["admin"] for nd in c.nodes]
                    base = [loadgen_bin, "--node", admins[0], "--routers", ",".join(admins),
                            "--synthetic", args.preset, "--decode-workers",
                            str(args.decode_workers), "--route-only", "--policies", "eldr",
                            "--json", "--quiet", "--output-tokens", str(args.output_tokens),
                            "--prompt-max", str(args.prompt_max), "--keep-centroids"]
                    run_loadgen(base + ["--rate", "200", "--duration", "1"])  # workers, a set
                    model = c.admins[0].call("status")["models"][0]["name"]
                    duration = 3 + args.recall_ids * 0.03
                    gen = subprocess.Popen(base + ["--rate", str(rate), "--duration",
                                                   "%.0f" % duration],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    try:
                        time.sleep(1.0)  # the generator registers its workers and gets going
                        k0 = [a.call("status")["cluster"]["router"] for a in c.admins]
                        for i in range(args.recall_ids):
                            if gen.poll() is not None:
                                raise RuntimeError("recall: eldr-loadgen ended before the probes")
                            off, rtt_a, rtt_b, same, known = recall_probe(
                                c, model, i, offsets[i % len(offsets)])
                            rows.append({"load_sharing": mode, "rate": rate, "run": rep + 1,
                                         "offset_ms": offsets[i % len(offsets)],
                                         "actual_offset_ms": off * 1e3,
                                         "first_rtt_ms": rtt_a * 1e3,
                                         "resend_rtt_ms": rtt_b * 1e3, "same": same,
                                         "known": known})
                        k1 = [a.call("status")["cluster"]["router"] for a in c.admins]
                    finally:
                        gen.wait()
                    counters = {k: sum(b.get(k, 0) - a.get(k, 0) for a, b in zip(k0, k1))
                                for k in ("recalls", "recalled", "recall_misses",
                                          "recall_peer_failures", "marked_retries_remembered")}
                    log("recall counters (3 routers summed): %s" % counters)
                    rows[-1]["counters"] = counters
    results["recall"] = rows
    table_head("Marked resends at another router: the retry window (3 nodes of all roles, "
               "route-only background load, %d ids per run, %d run(s))"
               % (args.recall_ids, args.repeat),
               "| load sharing | background req/s | resend sent after (ms, asked / actual "
               "median) | probes | first decision known (asked or remembered) | same decision | "
               "first request rtt p50 ms | resend rtt p50 ms | resend rtt p99 ms |")
    for mode, rate, off in sorted({(r["load_sharing"], r["rate"], r["offset_ms"]) for r in rows}):
        g = [r for r in rows if (r["load_sharing"], r["rate"], r["offset_ms"]) == (mode, rate, off)]
        print("| %s | %d | %g / %.2f | %d | %d (%.0f%%) | %d (%.0f%%) | %.2f | %.2f | %.2f |" % (
            mode, rate, off, median([r["actual_offset_ms"] for r in g]), len(g),
            sum(r["known"] for r in g), 100.0 * sum(r["known"] for r in g) / len(g),
            sum(r["same"] for r in g), 100.0 * sum(r["same"] for r in g) / len(g),
            median([r["first_rtt_ms"] for r in g]), median([r["resend_rtt_ms"] for r in g]),
            pct([r["resend_rtt_ms"] for r in g], 0.99)))
    print()
    table_head("The same probes by whether the first answer had arrived when the resend was sent",
               "| load sharing | background req/s | resends after the first answer | of them "
               "the first decision known | resends before it | of them known |")
    for mode, rate in sorted({(r["load_sharing"], r["rate"]) for r in rows}):
        g = [r for r in rows if (r["load_sharing"], r["rate"]) == (mode, rate)]
        after = [r for r in g if r["actual_offset_ms"] > r["first_rtt_ms"]]
        before = [r for r in g if r["actual_offset_ms"] <= r["first_rtt_ms"]]
        print("| %s | %d | %d | %d | %d | %d (%.0f%%) |" % (
            mode, rate, len(after), sum(r["known"] for r in after), len(before),
            sum(r["known"] for r in before),
            100.0 * sum(r["known"] for r in before) / len(before) if before else float("nan")))
    print()


# ---------------------------------------------------------------------------------- handoff
def cache_row(admin):
    s = admin.call("status", timeout_ms=30000)
    rows = s.get("signature_cache") or [{}]
    return rows[0]


class RouteProbe(threading.Thread):
    """Route requests to one endpoint every `period` s (16 random blocks each), one at a time:
    (send time, round trip s or None for a timeout)."""

    def __init__(self, endpoint, model, period=0.005, worker_endpoint=None, workers=0):
        super().__init__(daemon=True)
        self.endpoint, self.model, self.period = endpoint, model, period
        # Decode workers kept alive (a load_report each every 200 ms) while the probe runs.
        self.worker_endpoint, self.workers = worker_endpoint, workers
        self.samples = []
        self.errors = {}
        self.stop = threading.Event()

    def run(self):
        import random
        rng = random.Random(7)
        i = 0
        wsock, reported = None, 0.0
        if self.worker_endpoint:
            wsock = ctx.socket(zmq.DEALER)
            wsock.setsockopt(zmq.LINGER, 0)
            wsock.connect(self.worker_endpoint)
        while not self.stop.is_set():
            t = time.monotonic()
            if wsock is not None and t - reported >= 0.2:
                reported = t
                for w in range(self.workers):
                    wsock.send(msgpack.packb({"version": 1, "type": "load_report",
                                              "model": self.model, "worker": w, "in_flight": 0,
                                              "seq": i + 1}, use_bin_type=True))
                while wsock.poll(0):
                    wsock.recv()
            try:
                route_once(self.endpoint, "probe-%d" % i, self.model,
                           [rng.getrandbits(63) for _ in range(16)], timeout_ms=10000)
                self.samples.append((t, time.monotonic() - t))
            except (TimeoutError, RuntimeError) as e:
                self.samples.append((t, None))
                k = re.sub(r"probe-\d+", "probe-N", str(e))[:160]
                self.errors[k] = self.errors.get(k, 0) + 1
            i += 1
            time.sleep(max(0.0, self.period - (time.monotonic() - t)))
        if wsock is not None:
            wsock.close(0)


def window_stats(samples, t0, t1):
    xs = [r for t, r in samples if t0 <= t < t1 and r is not None]
    lost = sum(1 for t, r in samples if t0 <= t < t1 and r is None)
    if not xs:
        return {"n": 0, "lost": lost}
    return {"n": len(xs), "lost": lost, "p50_ms": median(xs) * 1e3, "p99_ms": pct(xs, 0.99) * 1e3,
            "max_ms": max(xs) * 1e3}


def handoff_log(path):
    """From a node's log: its 'handed N block(s) ... in T ms' lines (sigcache_cluster.cpp), as
    (N, T), and how often a peer was declared gone."""
    handed, gone = [], 0
    try:
        for line in open(path, errors="replace"):
            m = re.search(r"handed (\d+) block\(s\) to .* in (\d+) ms", line)
            if m:
                handed.append((int(m.group(1)), int(m.group(2))))
            if " is gone: " in line:
                gone += 1
    except OSError:
        pass
    return handed, gone


def handoff():
    rows = []
    saved_grace = args.handoff_grace_ms
    args.handoff_grace_ms = 10000  # the default: n2 reads through n1 while it is handed blocks
    try:
        for rep in range(args.repeat):
            for fill in [float(x) for x in args.handoff_fill_s.split(",")]:
                log("handoff: fill %g s at %d req/s (run %d)" % (fill, args.handoff_fill_rate,
                                                                  rep + 1))
                with Cluster(2) as c:
                    rows.append(handoff_run(c, fill, rep))
    finally:
        args.handoff_grace_ms = saved_grace
    results["handoff"] = rows
    table_head("A node that rejoins empty takes its share (2 nodes, R = 2: n1 hands n2 every "
               "block; probe: a route at n1 every 5 ms, 16 random blocks)",
               "| blocks at n1 | n2 start -> all received (s) | n1's hand-off (ms) | blocks sent "
               "| hand-offs (n2 declared gone again) | bridge ended (ms after it began) | probe "
               "before p50 / p99 / max ms | during p50 / p99 / max ms | after p50 / p99 / max ms "
               "| lost |")
    for r in rows:
        f = lambda w: "%.2f / %.2f / %.1f" % (w.get("p50_ms", float("nan")),  # noqa: E731
                                              w.get("p99_ms", float("nan")),
                                              w.get("max_ms", float("nan")))
        print("| %d | %.2f | %s | %d | %d (%d) | %s | %s | %s | %s | %d |" % (
            r["blocks"], r["received_s"], r["n1_handoff_ms"], r["sent"], r["handoffs"],
            r["n2_gone_again"],
            ", ".join("%s %s" % kv for kv in sorted(r.get("bridge_ended_ms", {}).items())) or "-",
            f(r["before"]),
            f(r["during"]), f(r["after"]),
            r["before"]["lost"] + r["during"]["lost"] + r["after"]["lost"]))
    print()


def handoff_run(c, fill, rep):
    admins = [nd["admin"] for nd in c.nodes]
    model = c.admins[0].call("status")["models"][0]["name"]
    run_loadgen([loadgen_bin, "--node", admins[0], "--routers", admins[0], "--synthetic",
                 args.preset, "--decode-workers", str(args.decode_workers), "--route-only",
                 "--policies", "eldr", "--json", "--quiet", "--keep-centroids",
                 "--prompt-pool", "0", "--prompt-min", "1024", "--prompt-max", "1024",
                 "--prefill-cache-blocks", "100000000", "--rate", str(args.handoff_fill_rate),
                 "--duration", str(fill)])
    blocks = cache_row(c.admins[0]).get("blocks_with_counts", 0)
    sent0 = cache_row(c.admins[0]).get("handoff_sent_blocks", 0)
    finished0 = cache_row(c.admins[0]).get("handoffs_finished")
    c.script("kill", "2", "--signal", "KILL")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = members(c.admins[0].call("status"))
        if not m.get("n2", {}).get("alive", False):
            break
        time.sleep(0.02)
    shutil.rmtree(os.path.join(c.dir, "n2", "data"), ignore_errors=True)
    probe = RouteProbe(c.nodes[0]["route"], model, worker_endpoint=c.nodes[0]["worker"],
                       workers=args.decode_workers)
    probe.start()
    time.sleep(2.0)
    t_start = time.monotonic()
    # Log lines from here on are the rejoin's (the bridge lines below).
    log_from = {i: os.path.getsize(os.path.join(c.dir, "n%d" % i, "log")) for i in (1, 2)}
    c.restart(2)
    c.admins[1].close()
    c.admins[1] = Admin(c.nodes[1]["admin"])
    try:
        c.wait_formed(timeout=args.handoff_wait_s)
        t_formed = time.monotonic()
    except RuntimeError as e:  # a hand-off storm: record it
        log("handoff: %s" % e)
        t_formed = float("nan")
    received_at = None
    sent = None
    deadline = time.monotonic() + 300
    n1_ms = "-"
    while time.monotonic() < deadline:
        try:
            row = cache_row(c.admins[0])
            got = cache_row(c.admins[1])
        except (TimeoutError, RuntimeError):
            continue
        sent = row.get("handoff_sent_blocks", 0) - sent0
        # n1's hand-off over (builds that report it), and every block n1 holds stored at n2 or
        # refused there (a block sent twice, after a ring change, is stored once).
        over = finished0 is None or (row.get("handoffs_finished", 0) > finished0
                                     and not row.get("handoff_running", False))
        if over and sent > 0 and got.get("handoff_received_blocks", 0) + \
                got.get("handoff_refused_blocks", 0) >= blocks:
            received_at = time.monotonic()
            if finished0 is not None:
                n1_ms = row.get("handoff_last_ms", "-")
            break
        time.sleep(0.02)
    time.sleep(2.0)
    probe.stop.set()
    probe.join()
    end = received_at if received_at is not None else time.monotonic()
    handed, gone = handoff_log(os.path.join(c.dir, "n1", "log"))
    # When each router stopped reading the ring before the join (builds that confirm hand-offs).
    bridged = {}
    for i in (1, 2):
        try:
            f = open(os.path.join(c.dir, "n%d" % i, "log"), errors="replace")
            if i == 1:  # n2's log starts again with its restart
                f.seek(log_from[1])
            for line in f:
                m = re.search(r"handed its blocks over after (\d+) ms", line)
                if m:
                    bridged["n%d" % i] = int(m.group(1))
                if "hand-off not confirmed" in line:
                    bridged["n%d" % i] = "unconfirmed"
        except OSError:
            pass
    if probe.errors:
        log("probe errors: %s" % probe.errors)
    return {"run": rep + 1, "fill_s": fill, "blocks": blocks, "sent": sent,
            "formed_s": t_formed - t_start,
            "received_s": (received_at - t_start) if received_at else float("nan"),
            "n1_handoff_ms": n1_ms if n1_ms != "-" else (handed[-1][1] if handed else "-"),
            # n1's hand-offs and n2's departures seen at n1 after the kill (a storm: many).
            "handoffs": len(handed), "n2_gone_again": max(0, gone - 1),
            "bridge_ended_ms": bridged,
            "probe_errors": probe.errors,
            "before": window_stats(probe.samples, t_start - 2.0, t_start),
            "during": window_stats(probe.samples, t_start, end),
            "after": window_stats(probe.samples, end, end + 2.0)}


# ----------------------------------------------------------------------------------- idle
def idle():
    sizes = [int(x) for x in args.idle_nodes.split(",")]
    modes = args.load_sharing.split(",")
    rows = []
    for rep in range(args.repeat):
        for mode in modes:
            for n in sizes:  # alternated within each round: the machine's noise hits both
                with Cluster(n, load_sharing=mode) as c:
                    time.sleep(2.0)  # settled: start-up work (opening stores, first hellos) over
                    pids = [c.pid(i) for i in range(1, n + 1)]
                    before = [cpu_of(p) for p in pids]
                    t0 = time.monotonic()
                    time.sleep(args.idle_seconds)
                    wall = time.monotonic() - t0
                    after = [cpu_of(p) for p in pids]
                per_node = [(a - b) / wall * 1000.0 for a, b in zip(after, before)]
                row = {"round": rep + 1, "mode": mode, "nodes": n,
                       "cpu_ms_per_s": sum(per_node), "per_node_ms_per_s": per_node}
                rows.append(row)
                log("idle: %s" % json.dumps(row))
    results["idle"] = rows
    table_head("Idle cluster: CPU with no traffic (ms of CPU per second)",
               "| round | load sharing | nodes | all nodes | per node |")
    for r in rows:
        print("| %d | %s | %d | %.1f | %s |" % (
            r["round"], r["mode"], r["nodes"], r["cpu_ms_per_s"],
            " / ".join("%.1f" % x for x in r["per_node_ms_per_s"])))
    print()


def save():
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=str)


def tables_from(path):
    saved = json.load(open(path))
    for part in args.only.split(","):
        if part == "fanin" and "fanin" in saved:
            fanin_table(saved["fanin"])
        if part == "herding" and "herding" in saved:
            herding_table(saved["herding"]["runs"])


if args.tables_from:
    tables_from(args.tables_from)
    sys.exit(0)
try:
    for part in args.only.split(","):
        {"herding": herding, "failure": failure, "epoch": epoch,
         "throughput": throughput, "shard": shard, "fanin": fanin, "recall": recall,
         "handoff": handoff, "idle": idle, "separate": separate}[part]()
        save()
finally:
    save()
    log("results in %s" % args.out)
