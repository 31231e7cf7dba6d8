#!/usr/bin/python3
"""The route call's latency against a live eldr-node, as eldr-proxy makes it and as the blocking
client makes it, one call at a time (nothing else in the event loop): what eldr_client_aio's own
machinery (futures, timers, loop turns) adds to the ZeroMQ round trip and the node's decision.

  eldr_route_rtt.py --build-dir BUILD [--calls 300] [--client-root CHECKOUT] [--counts]

--client-root: take cluster/python (eldr_client, eldr_client_aio) from another checkout, to
compare two versions in one session. --counts: every call carries a counts message for its 16
blocks of 16 tokens (random distinct top-k ids of the trace's geometry, made before timing), as
eldr-proxy's calls do, instead of hashes only. Prints p50 and p90 of each (the first 50 calls are warm-up).
Needs ../shared/data (or --shared-data / $ELDR_SHARED_DATA).
"""
import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--shared-data", default=os.environ.get("ELDR_SHARED_DATA") or
                    os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--client-root", default=ROOT)
    ap.add_argument("--counts", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.client_root, "cluster", "python"))
    sys.path.insert(1, os.path.join(ROOT, "tests", "integration", "py"))
    sys.path.insert(1, os.path.join(ROOT, "tests", "adversarial"))
    import eldr_client as ec
    import eldr_client_aio as aio
    import eldr_live as live
    from proxy_harness import MODEL, centroid_file, node_toml, read_trace
    with tempfile.TemporaryDirectory(prefix="eldr-route-rtt-") as tmp:
        geometry, trace = read_trace(os.path.join(a.shared_data,
                                                  "esft-deepseek-v2-lite.eldrtrace"))
        labels = sorted({lab for lab, _, _ in trace.values()})
        with open(os.path.join(tmp, "centroids"), "wb") as f:
            f.write(centroid_file(geometry, trace, labels))
        with open(os.path.join(tmp, "node.toml"), "w") as f:
            f.write(node_toml(os.path.join(tmp, "data"), os.path.join(tmp, "centroids")))
        node = live.Node(live.find_binary(a.build_dir, "eldr-node"),
                         os.path.join(tmp, "node.toml"), os.path.join(tmp, "node.log")).start()
        try:
            blocks = list(range(1, 17))
            layers, experts, top_k = geometry
            rng = np.random.default_rng(1)

            def counts_for(i):
                if not a.counts:
                    return None
                keys = [1000 * i + b for b in blocks]  # new blocks every call, as new prompts
                ids = np.argsort(rng.random((16 * len(keys), layers, experts)), axis=2)
                return keys, ec.counts_message(layers, experts, top_k, ec.TopkIds(
                    keys, [None] + keys[:-1], ids[:, :, :top_k].astype(np.uint16), 16))
            calls = [counts_for(i) for i in range(2 * a.calls)]
            workers = ec.WorkerClient(node.endpoint("worker"))
            for w in range(4):
                workers.register(MODEL, w, "http://127.0.0.1:%d" % (9000 + w))
            blocking = ec.RouteClient(node.endpoint("route"))
            t_sync = []
            for i in range(a.calls):
                keys, counts = calls[i] or (blocks, None)
                t = time.perf_counter()
                r = blocking.route("sync-%d" % i, MODEL, keys, counts=counts)
                t_sync.append(time.perf_counter() - t)
                workers.finished(MODEL, r["worker"], ["sync-%d" % i])

            async def as_the_proxy():
                client = aio.AsyncRouteClient(node.endpoint("route"))
                out = []
                for i in range(a.calls):
                    keys, counts = calls[a.calls + i] or (blocks, None)
                    t = time.perf_counter()
                    # eldr-proxy's _route: a task, shielded from the client's cancellation.
                    task = asyncio.ensure_future(client.route("aio-%d" % i, MODEL, keys,
                                                              counts=counts))
                    r = await asyncio.shield(task)
                    out.append(time.perf_counter() - t)
                    workers.finished(MODEL, r["worker"], ["aio-%d" % i])
                await client.close()
                return out
            t_aio = asyncio.run(as_the_proxy())
        finally:
            node.stop()

    def summary(v):
        v = sorted(v[50:])
        return "p50 %.3f ms, p90 %.3f ms" % (statistics.median(v) * 1e3,
                                             v[int(0.9 * (len(v) - 1))] * 1e3)
    print("blocking RouteClient: %s" % summary(t_sync))
    print("AsyncRouteClient as eldr-proxy calls it: %s" % summary(t_aio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
