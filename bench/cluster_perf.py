#!/usr/bin/python3
"""Where a cluster's node CPU goes: starts N nodes (deploy/local/eldr-cluster, every node all
roles), runs eldr-loadgen route-only at a fixed rate over every router (as cluster_bench.py's
throughput case does) under `perf record -a --call-graph dwarf`, and prints the nodes' CPU seconds
and the share of their samples under each of a few frames (inclusive: a sample counts for every
listed frame on its stack). Needs perf (Debian's linux-perf) and root or perf_event_paranoid <= 1.

usage: /usr/bin/python3 bench/cluster_perf.py --bin-dir build [--nodes 3] [--rate 1500]
       [--duration 6] [--warmup-requests 0] [--loadgen-args '--counts all']

--warmup-requests: route this many requests before the measured run (at 1,000 req/s), e.g.
routers x sample_size to fill every router's refit reservoir first (steady state).
"""
import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--bin-dir", required=True)
ap.add_argument("--nodes", type=int, default=3)
ap.add_argument("--rate", type=float, default=1500)
ap.add_argument("--duration", type=float, default=6)
ap.add_argument("--warmup-requests", type=int, default=0)
ap.add_argument("--loadgen-args", default="")
ap.add_argument("--prepare-budget-mib", type=int, default=4096,
                help="eldr-loadgen's: enough to encode every request before the clock, so that "
                     "its preparation is not in the profile")
ap.add_argument("--base-port", type=int, default=0, help="0: a free-looking port from the pid")
ap.add_argument("--top", type=int, default=0,
                help="also the N leaf functions and the N threads (by name) with the most "
                     "samples, each as a share and as µs of node CPU per request")
ap.add_argument("--focus", default="",
                help="a frame's symbol substring (e.g. default_multiplexer::run): also the --top "
                     "frames called under it, at each of the next --focus-depth levels, and the "
                     "leaf functions of its samples")
ap.add_argument("--focus-depth", type=int, default=3)
args = ap.parse_args()

# (label, substring of a frame's symbol). Inclusive shares, so they overlap and need not sum to 100.
FRAMES = [
    ("route decision (router sign_and_route)", "eldr::router::sign_and_route"),
    # Its parts: with peers the router sums the carried counts and stores them itself; alone (a
    # one-node ring) the cache actor signs, and the router only decides in its reply handler.
    ("  the decision itself (decide_and_wire)", "decide_and_wire"),
    ("  summing carried counts (router start_gather)", "eldr::router::start_gather"),
    ("  finishing the signature (router finish_gather)", "eldr::router::finish_gather"),
    ("  replica stores (router store_at_owners)", "store_at_owners"),
    ("refit reservoir fill (signature_sample::claim_row)", "eldr::signature_sample::claim_row"),
    ("signature cache (sigcache actor)", "eldr::sigcache::"),
    ("RocksDB writes", "rocksdb::DBImpl::Write"),
    ("ZeroMQ edge thread (zmq_frontend)", "eldr::zmq_frontend::impl::run"),
    ("CAF network multiplexer", "caf::io::network::default_multiplexer::run"),
    ("CAF clock thread (timeouts, delayed sends)", "thread_safe_actor_clock::run_dispatch_loop"),
    ("kernel: system calls (sockets, futexes, polls)", "entry_SYSCALL_64"),
    ("kernel: page faults", "asm_exc_page_fault"),
]


def tool(name):
    for p in (os.path.join(args.bin_dir, name), os.path.join(args.bin_dir, "tools", name, name)):
        if os.path.exists(p):
            return p
    sys.exit("cluster_perf: %s not found under %s" % (name, args.bin_dir))


def cpu_of(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def breakdown(data, pids):
    out = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,comm,ip,sym"],
                         capture_output=True, text=True).stdout
    hits, total, pid, comm, stack = collections.Counter(), 0, None, "", []
    leaves, threads = collections.Counter(), collections.Counter()
    # Under --focus: per depth below the focused frame, the frames there; and its samples' leaves.
    below = [collections.Counter() for _ in range(args.focus_depth)]
    focus_leaves = collections.Counter()

    def symbol(frame):
        # "<address> <symbol>+0x..": the symbol without its offset, or "?".
        return frame.split(None, 1)[1].split("+0x")[0] if " " in frame else "?"

    def flush():
        nonlocal total
        if pid in pids:
            total += 1
            for label, frame in FRAMES:
                if any(frame in s for s in stack):
                    hits[label] += 1
            leaves[symbol(stack[0]) if stack else "?"] += 1
            threads[comm] += 1
            if args.focus:
                # The outermost occurrence (stacks are leaf first), so recursion counts once.
                at = max((i for i, s in enumerate(stack) if args.focus in s), default=None)
                if at is not None:
                    focus_leaves[symbol(stack[0])] += 1
                    for d in range(args.focus_depth):
                        if at - 1 - d >= 0:
                            below[d][symbol(stack[at - 1 - d])] += 1

    for line in out.splitlines():
        if not line.strip():
            flush()
            pid, stack = None, []
        elif not line.startswith(("\t", " " * 8)):
            flush()
            # "<comm> <pid>/<tid>": the thread's name may hold spaces.
            head = line.split()
            at = next(i for i, x in enumerate(head) if "/" in x and x.split("/")[0].isdigit())
            comm, pid, stack = " ".join(head[:at]), int(head[at].split("/")[0]), []
        else:
            stack.append(line.strip())
    flush()
    return total, hits, leaves, threads, below, focus_leaves


def main():
    script = os.path.join(root, "deploy/local/eldr-cluster")
    work = tempfile.mkdtemp(prefix="eldr-cluster-perf-")
    port = args.base_port or 20000 + (os.getpid() * 50) % 20000
    try:
        started = subprocess.run([script, "start", str(args.nodes), "--bin", args.bin_dir, "--dir",
                                  work, "--base-port", str(port), "--timeout", "60",
                                  # The steady state: no hand-off grace after the start
                                  # (docs/cluster.md, "Signature cache").
                                  "--handoff-grace-ms", "0"],
                                 capture_output=True, text=True, check=True).stdout
        nodes = [json.loads(x) for x in started.splitlines() if x.startswith("{")]
        pids = {n["pid"] for n in nodes}
        admins = ",".join(n["admin"] for n in nodes)
        loadgen = [tool("eldr-loadgen"), "--node", nodes[0]["admin"], "--routers", admins,
                   "--synthetic", "qwen-task", "--decode-workers", "8", "--route-only",
                   "--policies", "eldr", "--json", "--quiet", "--output-tokens", "16",
                   "--prompt-max", "512", "--keep-centroids",
                   "--prepare-budget-mib", str(args.prepare_budget_mib)] + args.loadgen_args.split()
        warm = max(2000, args.warmup_requests)
        subprocess.run(loadgen + ["--rate", "1000", "--duration", str(warm / 1000.0)],
                       capture_output=True, check=True)
        before = sum(cpu_of(p) for p in pids)
        data = os.path.join(work, "perf.data")
        run = subprocess.run(["perf", "record", "-F", "199", "--call-graph", "dwarf,16384", "-a",
                              "-o", data, "--"] + loadgen +
                             ["--rate", str(args.rate), "--duration", str(args.duration)],
                             capture_output=True, text=True)
        node_cpu = sum(cpu_of(p) for p in pids) - before
        report = json.loads(run.stdout)
        total, hits, leaves, threads, below, focus_leaves = breakdown(data, pids)
        replies = args.rate * args.duration
        print("%d nodes, %g req/s for %g s, errors %s: node CPU %.2f s, %.0f us per request; "
              "%d samples in the nodes" % (args.nodes, args.rate, args.duration,
                                           report.get("errors"), node_cpu,
                                           node_cpu / replies * 1e6, total))
        for label, _ in FRAMES:
            print("  %5.1f%%  %s" % (100.0 * hits[label] / max(total, 1), label))
        us = node_cpu / replies * 1e6  # a sample's share of it: its share of the samples
        tables = [("threads", threads), ("leaf functions", leaves)]
        if args.focus:
            tables += [("frames %d below %s" % (d + 1, args.focus), c) for d, c in enumerate(below)]
            tables += [("leaf functions under %s" % args.focus, focus_leaves)]
        for title, counter in tables:
            if args.top <= 0:
                continue
            print("top %d %s (share of the nodes' samples, us per request):" % (args.top, title))
            for name, n in counter.most_common(args.top):
                print("  %5.1f%%  %6.1f us  %s" % (100.0 * n / max(total, 1),
                                                   us * n / max(total, 1), name[:110]))
    finally:
        subprocess.run([script, "stop", "--dir", work], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


main()
