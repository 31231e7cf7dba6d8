#!/usr/bin/python3
"""Tests of cluster/python/eldr_client_aio.py (the asyncio client): against a real eldr-node
(this build's, started on free ports) for the protocol, pipelining and failover to a node, and
against fake ROUTER nodes (pyzmq, port 0) for what a real node cannot be made to do on cue (hold
an answer, answer garbage, serve CURVE with a key the test chose).

usage: eldr_client_aio_test.py --build-dir BUILD    exit 0 when every test passes, 77 = skipped
(eldr-node not built). Needs Debian's python3-zmq and python3-msgpack (/usr/bin/python3).
"""
import argparse
import asyncio
import os
import sys
import tempfile
import threading
import traceback

import msgpack
import zmq

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "adversarial"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "py"))
import eldr_client as ec  # noqa: E402
import eldr_client_aio as aio  # noqa: E402
import eldr_live as live  # noqa: E402
import eldr_testing  # noqa: E402

MODEL = live.MODEL


class FakeNode(eldr_testing.FakeRouter):
    """A ROUTER on 127.0.0.1:0 served by a thread: script(msg) -> list of (delay-free) reply
    payloads, or None to hold the message (kept in .held with its peer for release())."""

    def __init__(self, script, server_secret=None, bind="tcp://127.0.0.1:*"):
        super().__init__(server_secret, bind)
        self.script = script
        self.received = []
        self.held = []
        self.outbox = []
        self.lock = threading.Lock()
        self.start()

    def serve(self):
        while not self.stopping.is_set():
            # The poll timeout also bounds how late the thread sees the outbox.
            if self.sock.poll(10, zmq.POLLIN):
                peer, payload = self.sock.recv_multipart()
                msg = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                with self.lock:
                    self.received.append(msg)
                out = self.script(msg)
                if out is None:
                    with self.lock:
                        self.held.append((peer, msg))
                else:
                    for r in out:
                        self.sock.send_multipart([peer, r])
            with self.lock:
                outbox, self.outbox = self.outbox, []
            for frames in outbox:
                self.sock.send_multipart(frames)

    def release(self, reply_for):
        """Answers every held message with reply_for(msg) (from the serving thread)."""
        with self.lock:
            held, self.held = self.held, []
            for peer, msg in held:
                self.outbox.append([peer, reply_for(msg)])


def route_answer(rid, worker=1):
    return msgpack.packb({"version": 1, "type": "route_reply", "id": rid, "worker": worker,
                          "endpoint": "http://decode-%d:8000" % worker, "epoch": 1,
                          "covered_blocks": 0, "total_blocks": 1}, use_bin_type=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def wait_for(cond, what, timeout=10.0):
    """Polls cond() until true or the deadline (a condition, never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------------------------------------
# Against the real node


async def test_real_node_protocol(node):
    admin = aio.AsyncAdminClient(node.endpoint("admin"), timeout_ms=10000)
    workers = aio.AsyncWorkerClient(node.endpoint("worker"), timeout_ms=10000)
    router = aio.AsyncRouteClient(node.endpoint("route"), timeout_ms=10000)
    try:
        for w in range(4):
            ack = await workers.register(MODEL, w, "http://10.1.0.%d:8000" % w, capacity=0,
                                         metrics_url="http://10.1.0.%d:8000/metrics" % w)
            check(ack["state"] == "active", "register %d: %r" % (w, ack))
        imported = await admin.call("centroids.import", model=MODEL,
                                    file=live.toy_centroid_file())
        check(imported["epoch"] >= 1, "import: %r" % imported)

        # 200 routes outstanding at once on one socket; each answer matched to its call by id.
        async def one(i):
            d = i % 4
            blocks = eldr_testing.toy_blocks(d, 10_000 * (i + 1), 3)
            counts = ec.counts_message(2, 8, 2, blocks)
            r = await router.route("aio-%d" % i, MODEL, [b[0] for b in blocks], counts=counts,
                                   explain=(i < 4))
            return i, r
        results = await asyncio.gather(*(one(i) for i in range(200)))
        for i, r in results:
            check(r["id"] == "aio-%d" % i, "reply id %r for call %d" % (r["id"], i))
            check(r["worker"] == i % 4, "locality: call %d went to %r" % (i, r))
            check(r["endpoint"] == "http://10.1.0.%d:8000" % (i % 4), "endpoint: %r" % r)
            check(r["covered_blocks"] == 3 and r["total_blocks"] == 3, "coverage: %r" % r)
            check(r["fallback"] == "" and r["warnings"] == [], "fallback/warnings: %r" % r)
        check(results[0][1]["explain"]["policy"] == "eldr", "explain: %r" % results[0][1])
        check(router.in_flight == 0, "calls left in flight: %d" % router.in_flight)

        # A retried id gets the decision the node remembers.
        again = await router.route("aio-5", MODEL, [1, 2, 3])
        check(again["worker"] == 1, "retry of aio-5 decided anew: %r" % again)

        # finished events bring the node's in-flight count back to 0.
        for w in range(4):
            await workers.finished(MODEL, w, ["aio-%d" % i for i in range(200) if i % 4 == w])
        rows = await admin.call("workers", model=MODEL)
        check(all(r["load"] == 0 for r in rows), "loads after finished: %r" % rows)

        # Errors come back as EldrError with the protocol's code.
        try:
            await router.route("bad", "no-such-model", [1])
            check(False, "unknown model accepted")
        except ec.EldrError as e:
            check(e.code == 4 and e.name == "unknown_model", "error: %r" % e)
        for bad in ("ftp://x/metrics", "https://x/metrics", "http://u@x/metrics",
                    "http://x/metrics#a", "http://"):
            try:
                await workers.register(MODEL, 0, "http://x:1", metrics_url=bad)
                check(False, "metrics_url %r was sent" % bad)
            except ValueError as e:
                check("metrics_url" in str(e), "metrics_url error: %s" % e)
        check(router.failovers == 0, "failovers against one live node: %d" % router.failovers)
    finally:
        for c in (admin, workers, router):
            await c.close()


async def test_failover_to_the_real_node(node):
    """First endpoint silent: the call is resent with the same id to the node, whose answer
    wins; the node's endpoint is where the next call starts."""
    silent = FakeNode(lambda msg: None)
    router = aio.AsyncRouteClient([silent.endpoint, node.endpoint("route")], timeout_ms=300)
    try:
        r = await router.route("fo-1", MODEL, [77])
        check(r["id"] == "fo-1", "reply: %r" % r)
        check(router.failovers == 1, "failovers: %d" % router.failovers)
        check(router.endpoint == node.endpoint("route"), "current endpoint: %s" % router.endpoint)
        check(router.last_endpoint == node.endpoint("route"), "last: %s" % router.last_endpoint)
        check([m["id"] for m in silent.received] == ["fo-1"], "silent got %r" % silent.received)
        r2 = await router.route("fo-2", MODEL, [78])
        check(r2["id"] == "fo-2" and router.failovers == 1, "second call failed over again")
        # The silent node answers fo-1 late: dropped, counted, nothing breaks.
        silent.release(lambda m: route_answer(m["id"], worker=3))
        await wait_for(lambda: router.late_replies == 1, "the late reply to be dropped")
        r3 = await router.route("fo-3", MODEL, [79])
        check(r3["id"] == "fo-3", "after a late reply: %r" % r3)
    finally:
        await router.close()
        silent.close()


# ---------------------------------------------------------------------------------------------
# Against fake nodes


async def test_first_answer_wins_from_an_earlier_endpoint():
    """The first endpoint answers after the client moved on: its answer is still taken."""
    slow = FakeNode(lambda msg: None)
    silent = FakeNode(lambda msg: None)
    router = aio.AsyncRouteClient([slow.endpoint, silent.endpoint], timeout_ms=2000)
    try:
        task = asyncio.ensure_future(router.route("w-1", MODEL, [1]))
        await wait_for(lambda: len(silent.received) == 1, "the resend to the second endpoint")
        slow.release(lambda m: route_answer(m["id"], worker=2))
        r = await task
        check(r["worker"] == 2 and router.last_endpoint == slow.endpoint, "winner: %r" % r)
        check(router.endpoint == slow.endpoint, "current endpoint: %s" % router.endpoint)
        check(silent.received[0]["id"] == "w-1", "resent with another id: %r" % silent.received)
        # The resend is marked (route_request.retry), the first send is not.
        check("retry" not in slow.received[0], "first send marked: %r" % slow.received[0])
        check(silent.received[0].get("retry") is True, "resend: %r" % silent.received[0])
    finally:
        await router.close()
        slow.close()
        silent.close()


async def test_a_call_waits_for_a_node_that_comes_up_and_a_timed_out_one_is_withdrawn():
    """IMMEDIATE: nothing is queued for an endpoint without a connection. A call made before
    the node listens is sent once it does, within the call's time; one whose time ran out is
    withdrawn and never reaches a node that comes up later."""
    gone = FakeNode(lambda msg: None)
    endpoint = gone.endpoint
    gone.close()  # its port is free: nothing listens there now
    early = aio.AsyncRouteClient([endpoint], timeout_ms=100, max_attempts=1)
    late = aio.AsyncRouteClient([endpoint], timeout_ms=5000, max_attempts=1)
    node = None
    try:
        try:
            await early.route("q-1", MODEL, [1])
            check(False, "answered with nothing listening")
        except TimeoutError:
            pass
        task = asyncio.ensure_future(late.route("q-2", MODEL, [2]))
        await wait_for(lambda: late._dealers and late._dealers[0].waiting,
                       "the call to wait for a connection")
        node = FakeNode(lambda msg: [route_answer(msg["id"], worker=4)], bind=endpoint)
        r = await task
        check(r["id"] == "q-2" and r["worker"] == 4, "reply: %r" % r)
        # Anything `early` had queued would reach the node before this, on the same connection.
        early.timeout_ms = 5000
        r = await early.route("q-3", MODEL, [3])
        check(r["id"] == "q-3", "reply: %r" % r)
        check([m["id"] for m in node.received] == ["q-2", "q-3"],
              "the withdrawn call was sent late: %r" % node.received)
    finally:
        await early.close()
        await late.close()
        if node is not None:
            node.close()


async def test_timeout_and_duplicate_ids():
    silent = FakeNode(lambda msg: None)
    router = aio.AsyncRouteClient([silent.endpoint], timeout_ms=100, max_attempts=2)
    try:
        first = asyncio.ensure_future(router.route("t-1", MODEL, [1]))
        await wait_for(lambda: router.in_flight == 1, "the call to be in flight")
        try:
            await router.route("t-1", MODEL, [1])
            check(False, "a second call with an id in flight was sent")
        except ValueError as e:
            check("already in flight" in str(e), "duplicate id error: %s" % e)
        try:
            await first
            check(False, "no answer, yet no TimeoutError")
        except TimeoutError as e:
            check("2 attempts" in str(e), "timeout message: %s" % e)
        check(router.in_flight == 0, "pending after a timeout: %d" % router.in_flight)
        check([m["id"] for m in silent.received] == ["t-1", "t-1"], "%r" % silent.received)
    finally:
        await router.close()
        silent.close()


async def test_bad_replies_are_dropped_and_counted():
    def script(msg):
        return [b"\xc1 not msgpack", msgpack.packb({"version": 9, "type": "route_reply"}),
                route_answer(msg["id"], worker=1)]
    fake = FakeNode(script)
    router = aio.AsyncRouteClient(fake.endpoint, timeout_ms=5000)
    try:
        r = await router.route("b-1", MODEL, [1])
        check(r["worker"] == 1, "answer after garbage: %r" % r)
        check(router.bad_replies == 2, "bad replies counted: %d" % router.bad_replies)
    finally:
        await router.close()
        fake.close()


async def test_reply_without_id_answers_the_only_call():
    def script(msg):
        return [msgpack.packb({"version": 1, "type": "error_reply", "code": 1,
                               "message": "route_request.id: missing"})]
    fake = FakeNode(script)
    router = aio.AsyncRouteClient(fake.endpoint, timeout_ms=5000)
    try:
        await router.route("n-1", MODEL, [1])
        check(False, "an error_reply was not raised")
    except ec.EldrError as e:
        check(e.code == 1 and "missing" in e.message, "error: %r" % e)
    finally:
        await router.close()
        fake.close()


async def test_curve():
    server_public, server_secret = ec.curve_keypair()
    fake = FakeNode(lambda msg: [route_answer(msg["id"], worker=0)], server_secret=server_secret)
    router = aio.AsyncRouteClient(fake.endpoint, timeout_ms=5000, server_public_key=server_public)
    wrong = aio.AsyncRouteClient(fake.endpoint, timeout_ms=200,
                                 server_public_key=ec.curve_keypair()[0])
    try:
        r = await router.route("c-1", MODEL, [1])
        check(r["worker"] == 0, "CURVE route: %r" % r)
        try:
            await wrong.route("c-2", MODEL, [1])
            check(False, "a client with the wrong server key got an answer")
        except TimeoutError:
            pass
        for bad in ("short", "~" * 40):
            try:
                aio.AsyncRouteClient(fake.endpoint, server_public_key=bad)
                check(False, "bad key %r accepted" % bad)
            except ValueError as e:
                check("server_public_key" in str(e), "key error names the argument: %s" % e)
    finally:
        await router.close()
        await wrong.close()
        fake.close()


async def test_worker_messages_carry_metrics_url_only_when_given():
    fake = FakeNode(lambda msg: [msgpack.packb({"version": 1, "type": "worker_ack",
                                                "id": msg["id"], "state": "active"})])
    workers = aio.AsyncWorkerClient(fake.endpoint, timeout_ms=5000)
    try:
        await workers.register(MODEL, 1, "http://d1:8000", metrics_url="http://d1:8000/metrics")
        await workers.register(MODEL, 2, "http://d2:8000")
        await workers.finished(MODEL, 1, ["a", "b"])
        await workers.report_load(MODEL, 1, in_flight=3, kv_usage=0.5)
        got = fake.received
        check(got[0]["metrics_url"] == "http://d1:8000/metrics", "metrics_url: %r" % got[0])
        check("metrics_url" not in got[1], "metrics_url sent as None: %r" % got[1])
        check(got[2]["type"] == "finished" and got[2]["requests"] == ["a", "b"], "%r" % got[2])
        check(got[3]["type"] == "load_report" and got[3]["seq"] > 0, "%r" % got[3])
        check(len({m["id"] for m in got}) == 4, "worker message ids repeat: %r" % got)
    finally:
        await workers.close()
        fake.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    try:
        binary = live.find_binary(args.build_dir, "eldr-node")
    except FileNotFoundError as e:
        print("SKIP: %s" % e)
        return 77
    failures = 0
    with tempfile.TemporaryDirectory(prefix="eldr-aio-") as tmp:
        with open(os.path.join(tmp, "toy.centroids"), "wb") as f:
            f.write(live.toy_centroid_file())
        config = os.path.join(tmp, "node.toml")
        with open(config, "w") as f:
            # No centroid file at start: the test imports one through the admin client.
            # The paper's rule, named: test_real_node_protocol checks explain's policy echo.
            f.write(live.node_toml(os.path.join(tmp, "data"), "",
                                   model_extra='policy = "eldr"\n').replace(
                'centroids = ""\n', ""))
        node = live.Node(binary, config, os.path.join(tmp, "node.log")).start()
        try:
            tests = [("test_real_node_protocol", lambda: test_real_node_protocol(node)),
                     ("test_failover_to_the_real_node",
                      lambda: test_failover_to_the_real_node(node))]
            tests += [(name, fn) for name, fn in sorted(globals().items())
                      if name.startswith("test_") and name not in dict(tests)
                      and asyncio.iscoroutinefunction(fn)
                      and fn.__code__.co_argcount == 0]
            for name, fn in tests:
                try:
                    asyncio.run(fn())
                    print("PASS", name)
                except Exception:  # noqa: BLE001 - report every failing test
                    failures += 1
                    print("FAIL", name)
                    traceback.print_exc()
        finally:
            node.stop()
    if failures:
        print("%d tests failed" % failures)
        return 1
    print("all tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
