#!/usr/bin/python3
"""eldr-proxy's talk with eldr's worker endpoint, against a fake node (a pyzmq ROUTER on port 0
whose answers the test scripts): registration retried until a node answers, metrics_url sent;
finished ids batched per worker; a node that forgot a worker (a restarted node answers
`unregistered`) gets it registered again; finished reports a node never acknowledges are
counted lost, and the queue is bounded.

usage: eldr_proxy_parts_test.py      exit 0 when every test passes.
"""
import asyncio
import os
import sys
import traceback

import msgpack

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools", "eldr-proxy"))
import eldr_client_aio as aio  # noqa: E402
import eldr_proxy  # noqa: E402
from eldr_client_aio_test import FakeNode, check, wait_for  # noqa: E402


def ack(msg, state="active"):
    return [msgpack.packb({"version": 1, "type": "worker_ack", "id": msg["id"], "state": state})]


def config(node, decode=3):
    argv = ["--listen", "127.0.0.1:0", "--eldr", "tcp://127.0.0.1:1", "--eldr-worker",
            node.endpoint, "--model", "m", "--prefill", "http://127.0.0.1:2",
            "--layers", "2", "--experts", "8", "--top-k", "2", "--eldr-retry-ms", "50",
            "--worker-timeout-ms", "100"]
    for i in range(decode):
        argv += ["--decode", "http://10.0.0.%d:8200" % i]
    return eldr_proxy.parse_config(argv)


class Parts:
    def __init__(self, cfg):
        self.metrics = eldr_proxy.ProxyMetrics(lambda: 0, lambda: {})
        self.limiter = eldr_proxy.LogLimiter()
        self.client = aio.AsyncWorkerClient(cfg.eldr_worker, timeout_ms=cfg.worker_timeout_ms)
        self.registrar = eldr_proxy.Registrar(self.client, cfg, self.metrics, self.limiter)
        self.finished = eldr_proxy.FinishedReporter(
            self.client, cfg.model, 0.0, self.metrics, self.limiter,
            lambda w: self.registrar.reregister([w]), max_pending=8)

    async def close(self):
        await self.finished.close()
        await self.registrar.close()
        await self.client.close()


async def test_registration_waits_for_a_node_then_reregisters_forgotten_workers():
    state = {"up": False, "forgot": set()}

    def script(msg):
        if not state["up"]:
            return None  # a node that does not answer yet
        if msg["type"] == "finished":
            return ack(msg, "unregistered" if msg["worker"] in state["forgot"] else "active")
        return ack(msg)
    node = FakeNode(script)
    cfg = config(node)
    p = Parts(cfg)
    try:
        p.registrar.start()
        await wait_for(lambda: p.metrics.registrations.value("failed") >= 2,
                       "registration attempts while the node is silent")
        check(not p.registrar.registered_once.is_set(), "registered without a node")
        state["up"] = True
        await asyncio.wait_for(p.registrar.registered_once.wait(), 10)
        regs = [m for m in node.received if m["type"] == "worker_register" and m["id"]]
        by_worker = {m["worker"]: m for m in regs}
        check(sorted(by_worker) == [0, 1, 2], "registered: %r" % sorted(by_worker))
        for w, m in by_worker.items():
            check(m["endpoint"] == "http://10.0.0.%d:8200" % w, "endpoint %r" % m)
            check(m["metrics_url"] == "http://10.0.0.%d:8200/metrics" % w, "metrics_url %r" % m)
        n_regs = len(node.received)
        # Finished ids are batched per worker; worker 1's ack says the node forgot it.
        state["forgot"] = {1}
        for rid, w in (("a", 0), ("b", 1), ("c", 0), ("d", 2)):
            p.finished.add(w, rid)
        await wait_for(lambda: p.metrics.finished.total() == 4, "finished acknowledged")
        fin = {m["worker"]: m["requests"] for m in node.received[n_regs:]
               if m["type"] == "finished"}
        check(fin == {0: ["a", "c"], 1: ["b"], 2: ["d"]}, "batches: %r" % fin)
        await wait_for(lambda: any(m["type"] == "worker_register" and m["worker"] == 1
                                   for m in node.received[n_regs:]),
                       "worker 1 registered again")
        check(not any(m["type"] == "worker_register" and m["worker"] != 1
                      for m in node.received[n_regs:]), "only the forgotten worker again")
    finally:
        await p.close()
        node.close()


async def test_finished_reports_are_bounded_and_counted_when_lost():
    node = FakeNode(lambda msg: None)  # never answers
    p = Parts(config(node))
    try:
        for i in range(20):  # max_pending is 8: the 12 oldest are dropped at once
            p.finished.add(i % 2, "r%d" % i)
        lost = p.metrics.finished_lost.total()
        check(lost == 12, "dropped: %d" % lost)
        await wait_for(lambda: p.metrics.finished_lost.total() == 20, "unacknowledged ids lost",
                       timeout=20)
        check(p.metrics.finished.total() == 0, "nothing acknowledged")
    finally:
        await p.close()
        node.close()


def main():
    failures = 0
    for name, fn in sorted(globals().items()):
        if not name.startswith("test_"):
            continue
        try:
            asyncio.run(fn())
            print("PASS", name)
        except Exception:  # noqa: BLE001
            failures += 1
            print("FAIL", name)
            traceback.print_exc()
    print("%d tests failed" % failures if failures else "all tests passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
