#!/usr/bin/python3
"""Bounded soak benchmark (not in CI): a release eldr-node driven by eldr-loadgen with its
emulated prefill and decode workers at a steady rate, for 10 minutes at 5,000 req/s by default.
Every --sample seconds it records the node's RSS (/proc/PID/status) and the route p99 of that
window from the node's eldr_route_latency_seconds histogram; eldr-loadgen's per-second client
round trips (--json route_seconds) give the client-side p99 of each window at the end.

Reports, as a markdown table and one JSON object (--json-out FILE, or the last line):
  - the RSS slope: a least-squares line through the samples after --warmup seconds, as % of the
    mean RSS per 10 minutes (target: flat within 5%);
  - the worst window's p99 (node-side and client round trip), and the errors.

usage: bench/soak.py [--build build-release] [--duration 600] [--rate 5000] [--sample 10]
                     [--warmup 60] [--workers 16] [--preset qwen-task] [--route-only]
                     [--output-tokens 16] [--loadgen-arg=ARG ...] [--json-out FILE] [--keep]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(root, "tests", "support", "py"))
import eldr_testing  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(root, "build-release"))
ap.add_argument("--duration", type=float, default=600)
ap.add_argument("--rate", type=float, default=5000)
ap.add_argument("--sample", type=float, default=10)
ap.add_argument("--warmup", type=float, default=60,
                help="seconds left out of the RSS fit (start-up, caches filling)")
ap.add_argument("--workers", type=int, default=16)
ap.add_argument("--preset", default="qwen-task")
ap.add_argument("--route-only", action="store_true",
                help="routes only (no decode emulation); default: the emulated workers run")
ap.add_argument("--output-tokens", type=int, default=16,
                help="decode tokens per request: at 5,000 req/s, 16 workers x 64 sequences keep "
                     "up with 16 tokens (about 0.1 s of decode each), not with loadgen's 512")
ap.add_argument("--prefill-workers", type=int, default=32,
                help="emulated prefill workers (one KV-event publisher each); with loadgen's "
                     "default 2 workers and 20 ms prefills, arrivals queue behind prefill at "
                     "about 30 req/s")
ap.add_argument("--prefill-ms", type=float, default=1.0,
                help="fixed cost of one emulated prefill (loadgen --prefill-base-ms); the "
                     "per-token cost is set to 0.005 ms")
ap.add_argument("--prompt-pool", type=int, default=8192,
                help="distinct prompts (eldr-loadgen --prompt-pool): bounds the loadgen's own "
                     "preparation memory; 0 = every request its own prompt")
ap.add_argument("--loadgen-arg", action="append", default=[],
                help="extra eldr-loadgen argument (repeatable), e.g. --loadgen-arg=--no-counts")
ap.add_argument("--json-out", default="")
ap.add_argument("--keep", action="store_true", help="keep the data dir and logs")
args = ap.parse_args()

node_bin = os.path.join(args.build, "tools/eldr-node/eldr-node")
loadgen_bin = os.path.join(args.build, "tools/eldr-loadgen/eldr-loadgen")
for b in (node_bin, loadgen_bin):
    if not os.access(b, os.X_OK):
        sys.exit("%s not built (cmake --build %s --target eldr-node eldr-loadgen)" % (b, args.build))


def start_node(data):
    ready = os.path.join(data, "ready.json")
    p = subprocess.Popen(eldr_testing.loopback_node_argv(node_bin, os.path.join(data, "db"))
                         + ["--ready-file", ready],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(data, "node.log"), "w"))
    ep = eldr_testing.wait_ready_file(ready, p, 60)
    if ep is not None:
        return p, ep
    if p.poll() is not None:
        sys.exit("eldr-node exited; see " + os.path.join(data, "node.log"))
    sys.exit("eldr-node did not become ready in 60 s")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def scrape(url):
    return urllib.request.urlopen(url, timeout=5).read().decode()


def histogram(text, name):
    """Cumulative buckets [(le, count)] of one histogram, summed over its label sets."""
    out = {}
    pat = re.compile(r'^%s_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} (\d+)' % name)
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            out[le] = out.get(le, 0) + int(m.group(2))
    return sorted(out.items())


def quantile(buckets, before, q):
    """q-quantile (s) of what was observed between two scrapes, linear inside a bucket."""
    prev = dict(before)
    counts = [(le, c - prev.get(le, 0)) for le, c in buckets]
    total = counts[-1][1] if counts else 0
    if total == 0:
        return float("nan"), 0
    rank, lo, below = q * total, 0.0, 0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return lo, total
            return lo + (le - lo) * (rank - below) / max(c - below, 1), total
        lo, below = le, c
    return lo, total


def fit(points):
    """Least-squares slope (per second) and mean of [(t, y)]."""
    n = len(points)
    if n < 2:
        return float("nan"), float("nan")
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    cov = sum((t - mt) * (y - my) for t, y in points)
    return (cov / var if var else float("nan")), my


data = tempfile.mkdtemp(prefix="eldr-soak-")
node, ep = start_node(data)
samples = []  # (t since loadgen start, rss MiB, node p99 ms of the window, routes in the window)
stop = threading.Event()
t_start = [None]


def sampler():
    before = histogram(scrape(ep["metrics"]), "eldr_route_latency_seconds")
    t_start[0] = time.monotonic()
    while not stop.wait(args.sample):
        try:
            text = scrape(ep["metrics"])
        except OSError:
            continue
        after = histogram(text, "eldr_route_latency_seconds")
        p99, n = quantile(after, before, 0.99)
        before = after
        t = time.monotonic() - t_start[0]
        samples.append((t, rss_kb(node.pid) / 1024.0, p99 * 1000, n))
        print("  t=%5.0f s  rss %7.1f MiB  node p99 %7.3f ms  routes %d" % samples[-1],
              file=sys.stderr, flush=True)


try:
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    cmd = [loadgen_bin, "--node", ep["admin"], "--synthetic", args.preset, "--rate",
           str(args.rate), "--duration", str(args.duration), "--decode-workers",
           str(args.workers), "--policies", "eldr", "--output-tokens", str(args.output_tokens),
           "--prompt-pool", str(args.prompt_pool),
           "--prefill-workers", str(args.prefill_workers), "--prefill-base-ms", str(args.prefill_ms),
           "--prefill-per-token-ms", "0.005",
           "--drain-s", "60", "--json", "--quiet"] + args.loadgen_arg
    if args.route_only:
        cmd.append("--route-only")
    print("soak: %s" % " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    stop.set()
    th.join(args.sample + 10)
    if r.returncode != 0:
        sys.exit("eldr-loadgen failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
    lg = json.loads(r.stdout)
finally:
    stop.set()
    eldr_testing.stop_process(node, timeout=60)

pol = lg.get("policies", {}).get("eldr", {})
# eldr-loadgen fits and prepares before its first route: the run's clock starts at the first
# window that saw routes (windows before it are left out).
first = next((i for i, x in enumerate(samples) if x[3] > 0), len(samples))
t0 = samples[first - 1][0] if first > 0 else 0.0
samples = [(t - t0, rss, p99, n) for t, rss, p99, n in samples[first:]]
per_second = pol.get("route_seconds", [])
# Client p99 per sampling window: the worst second's p99 inside the window.
windows = []
for t, rss, p99, n in samples:
    secs = [x for i, x in enumerate(per_second) if t - args.sample <= i < t and x.get("replies")]
    windows.append((t, rss, p99, n, max((x["p99_us"] for x in secs), default=float("nan")) / 1000))
after_warmup = [(t, rss) for t, rss, _, _, _ in windows if t >= args.warmup]
slope, mean = fit(after_warmup)
slope_pct = slope * 600 / mean * 100 if mean == mean and mean else float("nan")
valid = [w for w in windows if w[3] > 0]
worst_node = max((w[2] for w in valid), default=float("nan"))
worst_client = max((w[4] for w in valid if w[4] == w[4]), default=float("nan"))

print("## Soak: %s, %.0f req/s for %.0f s, %d decode workers%s" %
      (args.preset, args.rate, args.duration, args.workers,
       " (route-only)" if args.route_only else " (emulated workers)"))
print()
print("| t s | RSS MiB | node route p99 ms | client rtt p99 ms (worst second) | routes in window |")
print("|---|---|---|---|---|")
for t, rss, p99, n, cp99 in windows:
    print("| %.0f | %.1f | %.3f | %.3f | %d |" % (t, rss, p99, cp99, n))
print()
print("RSS slope after %.0f s warm-up: %+.2f%% of the mean (%.1f MiB) per 10 minutes "
      "(target: within +-5%%): %s" % (args.warmup, slope_pct, mean,
                                       "flat" if abs(slope_pct) <= 5 else "NOT flat"))
print("worst window p99: node %.3f ms, client rtt %.3f ms; replies/s %.0f, errors %d of %d" %
      (worst_node, worst_client, lg.get("route_rps", float("nan")), lg.get("errors", -1),
       lg.get("sent", -1)))
summary = {
    "preset": args.preset, "rate": args.rate, "duration_s": args.duration,
    "workers": args.workers, "route_only": args.route_only, "warmup_s": args.warmup,
    "rss_slope_pct_per_10min": slope_pct, "rss_mean_mib": mean,
    "rss_first_mib": windows[0][1] if windows else None,
    "rss_last_mib": windows[-1][1] if windows else None,
    "worst_node_p99_ms": worst_node, "worst_client_p99_ms": worst_client,
    "route_rps": lg.get("route_rps"), "errors": lg.get("errors"), "sent": lg.get("sent"),
    "samples": [{"t": t, "rss_mib": rss, "node_p99_ms": p99, "routes": n,
                 "client_p99_ms": cp99} for t, rss, p99, n, cp99 in windows],
}
text = json.dumps(summary, allow_nan=True)
if args.json_out:
    with open(args.json_out, "w") as f:
        f.write(text + "\n")
print(text)
if not args.keep:
    import shutil
    shutil.rmtree(data, ignore_errors=True)
else:
    print("data and node log kept in %s" % data, file=sys.stderr)
