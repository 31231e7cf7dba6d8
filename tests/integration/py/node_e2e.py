#!/usr/bin/python3
"""Drives a running eldr-node with the Python client (cluster/python/eldr_client.py), as a
prefill worker, a decode worker and an operator would. Exit 0 when every check holds.

usage: node_e2e.py ROUTE WORKER ADMIN CENTROID_FILE
"""
import os
import sys

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ in it
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "cluster", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support", "py"))
from eldr_client import AdminClient, EldrError, RouteClient, WorkerClient, counts_message  # noqa
import eldr_testing  # noqa: E402

route_ep, worker_ep, admin_ep, centroids = sys.argv[1:5]
model = "toy"
admin = AdminClient(admin_ep, timeout_ms=5000)
workers = WorkerClient(worker_ep, timeout_ms=5000)
router = RouteClient(route_ep, timeout_ms=5000)


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


for w in range(4):
    ack = workers.register(model, w, "tcp://10.1.0.%d:9" % w, capacity=16)
    check(ack["state"] == "active", "register %d: %r" % (w, ack))
with open(centroids, "rb") as f:
    imported = admin.call("centroids.import", model=model, file=f.read())
check(imported["epoch"] >= 1, "import: %r" % imported)


# Prefill: counts of computed blocks go with the request; routed to the domain's home worker.
for d in range(4):
    blocks = eldr_testing.toy_blocks(d, 1000 * (d + 1), 3)
    reply = router.route("py-%d" % d, model, [b[0] for b in blocks],
                         counts=counts_message(2, 8, 2, blocks), explain=True)
    check(reply["worker"] == d, "locality: %r" % reply)
    check(reply["covered_blocks"] == 3 and reply["total_blocks"] == 3, "coverage: %r" % reply)
    check(reply["explain"]["policy"] == "eldr", "explain: %r" % reply)
    check(reply["endpoint"] == "tcp://10.1.0.%d:9" % d, "endpoint: %r" % reply)

# A prefix hit: no counts sent, the node's signature cache supplies them.
reply = router.route("py-hit", model, [3000, 3001, 3002])
check(reply["worker"] == 2 and reply["covered_blocks"] == 3, "cache hit: %r" % reply)

# Decode side: finished events and load reports.
workers.finished(model, 2, ["py-2", "py-hit"])
workers.report_load(model, 1, in_flight=5, seq=10)
rows = {r["worker"]: r for r in admin.call("workers", model=model)}
check(rows[2]["load"] == 0, "finished: %r" % rows[2])
check(rows[1]["load"] == 5, "report: %r" % rows[1])

# Errors come back as EldrError with the protocol's code.
try:
    router.route("bad", "no-such-model", [1])
    check(False, "unknown model accepted")
except EldrError as e:
    check(e.code == 4, "unknown model code: %r" % e.code)

# Pipelined requests are all answered.
for i in range(50):
    router.send("pipe-%d" % i, model, [5000 + i])
answers = [router.receive() for _ in range(50)]
check(sorted(a["id"] for a in answers) == sorted("pipe-%d" % i for i in range(50)), "pipeline")

status = admin.call("status")
check(status["models"][0]["routed"] >= 55, "status: %r" % status["models"][0])
print("ok")
