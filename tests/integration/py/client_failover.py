#!/usr/bin/python3
"""Failover and CURVE tests of cluster/python/eldr_client.py against fake nodes: ROUTER sockets
bound to port 0 on loopback (optionally CURVE servers), served by threads with a scripted
handler, and a closed port. Run by tests/integration/client_failover_test.cpp; prints
"all N tests passed" and exits 0 when every test passes, "SKIP: ..." and 0 when pyzmq or msgpack
is missing.
"""
import os
import sys
import threading
import time

try:
    import msgpack
    import zmq
except ImportError as e:
    print("SKIP: %s (install python3-zmq and python3-msgpack); all 0 tests passed" % e)
    sys.exit(0)

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ in it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "cluster", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support",
                                "py"))
import eldr_client as ec  # noqa: E402
import eldr_testing  # noqa: E402


def route_answer(rid, worker):
    return msgpack.packb({"version": 1, "type": "route_reply", "id": rid, "worker": worker,
                          "endpoint": "tcp://10.0.0.%d:5600" % worker, "epoch": 1,
                          "covered_blocks": 0, "total_blocks": 1}, use_bin_type=True)


class FakeNode(eldr_testing.FakeRouter):
    """A ROUTER on 127.0.0.1:0; script(msg) -> list of reply payloads. Keeps what it received;
    wait_received(n) blocks (bounded) until n messages have come."""

    def __init__(self, script, server_secret=None):
        super().__init__(server_secret)
        self.script = script
        self.received = []
        self.cv = threading.Condition()
        self.start()

    def serve(self):
        while not self.stopping.is_set():
            if not self.sock.poll(20, zmq.POLLIN):
                continue
            peer, payload = self.sock.recv_multipart()
            msg = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            with self.cv:
                self.received.append(msg)
                self.cv.notify_all()
            for reply in self.script(msg):
                self.sock.send_multipart([peer, reply])

    def wait_received(self, n):
        with self.cv:
            self.cv.wait_for(lambda: len(self.received) >= n, timeout=10)
            return list(self.received)


def silent(msg):
    return []


def answering(worker):
    return lambda msg: [route_answer(msg["id"], worker)]


def closed_port():
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind("tcp://127.0.0.1:*")
    ep = s.getsockopt(zmq.LAST_ENDPOINT).decode()
    s.close(0)
    return ep


def eq(got, want, what):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def raises(exc, fn, what, contains=None):
    try:
        fn()
    except exc as e:
        if contains is not None and contains not in str(e):
            raise AssertionError("%s: %r does not mention %r" % (what, str(e), contains))
        return
    raise AssertionError("%s: no %s" % (what, exc.__name__))


def test_failover_same_id():
    with FakeNode(silent) as a, FakeNode(answering(2)) as b:
        with ec.RouteClient([a.endpoint, b.endpoint], timeout_ms=150) as c:
            eq(c.last_endpoint, None, "before any answer")
            r = c.route("req-1", "m", [1])
            eq((r["id"], r["worker"]), ("req-1", 2), "answered by the second endpoint")
            eq(c.failovers, 1, "failovers")
            eq(c.last_endpoint, b.endpoint, "last_endpoint")
            eq(a.wait_received(1)[0]["id"], "req-1", "first endpoint's id")
            eq(b.wait_received(1)[0]["id"], "req-1", "second endpoint's id: the same")
            eq("retry" in a.wait_received(1)[0], False, "the first attempt is not marked")
            eq(b.wait_received(1)[0].get("retry"), True, "the resend is marked retry")
            eq(c.route("req-2", "m", [1])["id"], "req-2", "next call")
            eq(c.failovers, 1, "the next call starts at the endpoint that answered")
    with FakeNode(answering(3)) as b:
        with ec.WorkerClient([closed_port(), b.endpoint], timeout_ms=150) as w:
            w.next_id = lambda: "fin-1"
            b.script = lambda msg: [msgpack.packb({"version": 1, "type": "worker_ack",
                                                   "id": msg["id"], "state": "active",
                                                   "epoch": 1})]
            eq(w.finished("m", 1, ["q1"])["id"], "fin-1", "finished fails over")
            eq(w.failovers, 1, "worker failovers")


def test_late_replies_dropped():
    # As the C++ test: A holds r1, answers it late before r2's answer; B holds r2 and answers it
    # late before p1's answer, which a pipelined receive() must skip.
    def a_script(msg):
        if msg["id"] == "r2":
            return [route_answer("r1", 100), route_answer("r2", 1)]
        return []

    def b_script(msg):
        if msg["id"] == "r2":
            return []
        if msg["id"] == "p1":
            return [route_answer("r2", 200), route_answer("p1", 2)]
        return [route_answer(msg["id"], 2)]

    with FakeNode(a_script) as a, FakeNode(b_script) as b:
        with ec.RouteClient([a.endpoint, b.endpoint], timeout_ms=150) as c:
            eq(c.route("r1", "m", [1])["worker"], 2, "r1 from B")
            r2 = c.route("r2", "m", [1])
            eq((r2["id"], r2["worker"]), ("r2", 1), "r2 from A, not A's late r1")
            eq(c.last_endpoint, a.endpoint, "r2 answered by A")
            eq(c.route("r3", "m", [1])["worker"], 2, "r3 from B")
            eq(c.failovers, 3, "failovers")
            c.send("p1", "m", [1])
            p1 = c.receive(5000)
            eq((p1["id"], p1["worker"]), ("p1", 2), "receive() skips B's late r2")


def test_all_silent():
    with FakeNode(silent) as a, FakeNode(silent) as b:
        with ec.RouteClient([a.endpoint, b.endpoint, closed_port()], timeout_ms=100,
                            max_attempts=4) as c:
            t0 = time.monotonic()
            raises(TimeoutError, lambda: c.route("lost", "m", [1]), "all silent")
            elapsed = time.monotonic() - t0
            if elapsed < 0.38:
                raise AssertionError("4 attempts of 100 ms took %.3f s" % elapsed)
            eq(c.failovers, 3, "failovers")
            eq([m["id"] for m in a.wait_received(2)], ["lost", "lost"], "A got it twice")
    raises(ValueError, lambda: ec.RouteClient([]), "no endpoint", "endpoints")
    raises(ValueError, lambda: ec.RouteClient("tcp://127.0.0.1:1", max_attempts=0),
           "max_attempts 0", "max_attempts")
    # The same checks as the asyncio client's (eldr_client.ClientSettings).
    raises(ValueError, lambda: ec.RouteClient("tcp://127.0.0.1:1", timeout_ms=0),
           "timeout_ms 0", "timeout_ms")


def test_curve():
    if not zmq.has("curve"):
        print("SKIP test_curve: libzmq without CURVE")
        return
    pub, sec = ec.curve_keypair()
    eq(ec.curve_public_key(sec), pub, "curve_public_key")
    with FakeNode(answering(4), server_secret=sec) as node:
        with ec.RouteClient(node.endpoint, timeout_ms=2000, server_public_key=pub) as c:
            eq(c.route("s", "m", [1])["worker"], 4, "ephemeral client pair")
        cpub, csec = ec.curve_keypair()
        with ec.RouteClient(node.endpoint, timeout_ms=2000, server_public_key=pub,
                            public_key=cpub, secret_key=csec) as c:
            eq(c.route("s2", "m", [1])["worker"], 4, "own client pair")
        with ec.AdminClient(node.endpoint, timeout_ms=2000, server_public_key=pub,
                            secret_key=csec) as c:
            pass  # public key derived
        wrong, _ = ec.curve_keypair()
        with ec.RouteClient(node.endpoint, timeout_ms=150, server_public_key=wrong) as c:
            raises(TimeoutError, lambda: c.route("x", "m", [1]), "wrong server key")
        other_pub, other_sec = ec.curve_keypair()
        with FakeNode(answering(66), server_secret=other_sec) as impostor:
            with ec.RouteClient([impostor.endpoint, node.endpoint], timeout_ms=150,
                                server_public_key=pub) as c:
                eq(c.route("f", "m", [1])["worker"], 4, "failover past a wrong server")
    for kwargs, field in (
            ({"server_public_key": pub[:39]}, "server_public_key"),
            ({"server_public_key": pub[:39] + '"'}, "server_public_key"),
            ({"server_public_key": pub, "public_key": "short", "secret_key": sec}, "public_key"),
            ({"server_public_key": pub, "secret_key": "not a key"}, "secret_key"),
            ({"server_public_key": pub, "public_key": pub}, "secret_key"),
            ({"server_public_key": pub, "public_key": other_pub, "secret_key": sec},
             "public_key"),
            ({"secret_key": sec}, "server_public_key")):
        raises(ValueError, lambda: ec.RouteClient("tcp://127.0.0.1:1", **kwargs),
               "invalid %s" % field, field)
    try:
        ec.RouteClient("tcp://127.0.0.1:1", server_public_key=pub, public_key=other_pub,
                       secret_key=sec)
    except ValueError as e:
        if sec in str(e):
            raise AssertionError("the secret key appears in the error")


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    for t in tests:
        t()
        print("PASS", t.__name__)
    print("all %d tests passed" % len(tests))


if __name__ == "__main__":
    main()
