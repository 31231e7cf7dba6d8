#!/usr/bin/python3
"""Tests of cluster/python/eldr_client.py without a node: a fake ROUTER server thread (pyzmq, port
0) decodes what the clients send and answers canned replies.

  test_eldr_client.py              runs every test; exit code 0 when all pass
  test_eldr_client.py encode DIR   writes the bytes the real clients send, one file per message
                                   kind, for python_client_codec_test.cpp to decode with the C++
                                   decoders
  test_eldr_client.py decode DIR   serves the C++-encoded replies found in DIR to the real clients
                                   and prints, as one JSON line, what the clients made of them

Needs Debian's python3-zmq and python3-msgpack (/usr/bin/python3).
"""
import json
import logging
import os
import queue
import sys
import time
import traceback

import msgpack
import zmq

# Run from the source tree by the C++ test: leave no __pycache__ behind in it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "cluster", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support",
                                "py"))
import eldr_client as ec  # noqa: E402
import eldr_testing  # noqa: E402

BIG = 18446744073709539271  # above INT64_MAX: must travel as uint64


class FakeNode(eldr_testing.FakeRouter):
    """A ROUTER on a random loopback port. script(msg, raw) -> list of replies to send back (dicts
    are packed, bytes sent as they are); every decoded request is put on self.got."""

    def __init__(self, script):
        super().__init__()
        self.script = script
        self.got = queue.Queue()
        self.errors = []
        self.start()

    def serve(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stopping.is_set():
            if not poller.poll(50):
                continue
            frames = self.sock.recv_multipart()
            try:
                if len(frames) != 2:
                    raise AssertionError("request of %d frames, expected identity + 1" % len(frames))
                raw = frames[1]
                msg = msgpack.unpackb(raw, raw=False)
                self.got.put((msg, raw))
                for r in self.script(msg, raw) or []:
                    payload = r if isinstance(r, bytes) else msgpack.packb(r, use_bin_type=True)
                    self.sock.send_multipart([frames[0], payload])
            except Exception as e:  # reported by the test through self.errors
                self.errors.append(e)
                self.got.put((None, None))

    def next(self, timeout=10):
        msg, raw = self.got.get(timeout=timeout)
        if msg is None:
            raise self.errors[-1]
        return msg, raw


def env(t, **fields):
    return dict({"version": 1, "type": t}, **fields)


def answer_all(msg, raw):
    """Canned replies for every request type, echoing the id."""
    t, rid = msg.get("type"), msg.get("id")
    if t == "route_request":
        r = env("route_reply", id=rid, worker=3, endpoint="tcp://10.0.0.3:5600", epoch=9,
                covered_blocks=2, total_blocks=len(msg["blocks"]))
        if msg.get("explain"):
            r["explain"] = {"policy": "eldr", "tau": 0.1, "band": [[3, 0.8], [1, 0.75]]}
        return [r]
    if t in ("worker_register", "load_report", "finished", "worker_drain"):
        draining = t == "worker_drain" and msg["drain"]
        return [env("worker_ack", id=rid, state="draining" if draining else "active", epoch=9)]
    if t == "publisher_register":
        return [env("worker_ack", id=rid, state="subscribed", epoch=9)]
    if t == "admin_request":
        return [env("admin_reply", id=rid, ok=True,
                    result={"command": msg["command"], "args": msg["args"]})]
    return [env("error_reply", id=rid, code=3, message="unknown type")]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def eq(a, b, what=""):
    if a != b:
        raise AssertionError("%s: %r != %r" % (what, a, b))


def types_of(msg):
    return {k: type(v).__name__ for k, v in msg.items()}


# The sample counts of docs/protocol.md section 3: one 2-token block of a 2-layer, 8-expert,
# top-2 model, given as each token's top-2 row per layer (how a MoE router reports them).
def sample_counts(seq=None):
    return ec.counts_message(2, 8, 2, [(7, 1, [[[1, 5], [5, 1]], [[6, 7], [7, 6]]])], seq=seq)


# ---------------------------------------------------------------------------------------------
# Tests


def test_counts_message():
    m = sample_counts()
    eq(m, {"v": 1, "model": [2, 8, 2],
           "blocks": [[7, 1, 2, [2, 2], b"\x01\x05\x06\x07", b"\x02\x02\x02\x02"]]},
       "docs example")
    # The same counts as mappings, a flat id list, bytes and negative hashes, explicit tokens.
    m2 = ec.counts_message(2, 8, 2, [(b"\xaa" * 24 + BIG.to_bytes(8, "big"), BIG - 2**64,
                                      [{5: 2, 1: 2}, [6, 7, 7, 6]], 2)], seq=3)
    eq(m2["blocks"][0], [BIG, BIG, 2, [2, 2], b"\x01\x05\x06\x07", b"\x02\x02\x02\x02"], "forms")
    eq(list(m2), ["v", "model", "seq", "blocks"], "key order")
    # Straight from a MoE router's output: numpy top-k arrays [tokens, k] per layer, numpy hashes.
    try:
        import numpy as np
    except ImportError:  # optional: the client itself does not need numpy
        np = None
    if np is not None:
        topk = [np.array([[1, 5], [5, 1]], dtype=np.int64), np.array([[6, 7], [7, 6]])]
        m3 = ec.counts_message(2, 8, 2, [(np.uint64(7), np.int64(1), topk)])
        eq(m3, m, "numpy input")
        check(all(type(x) is int for x in m3["blocks"][0][:3]), "numpy scalars become ints")
    # Every rule the node checks is checked here first.
    bad = {
        "expert id": [(1, None, [[[1, 8]], [[1, 2]]])],
        "sum": [(1, None, [[[1, 2]], [[1, 2], [3, 4]]])],
        "distinct": [(1, None, [[[1, 1]], [[1, 2]]])],
        "layers": [(1, None, [[[1, 2]]])],
        "tokens": [(1, None, [{1: 256, 2: 256}, {1: 256, 2: 256}])],
        "not k": [(1, None, [[1, 2, 3], [1, 2, 3]])],
        "hash": [(2**64, None, [[[1, 2]], [[1, 2]]])],
    }
    for what, blocks in bad.items():
        try:
            ec.counts_message(2, 8, 2, blocks)
        except ValueError:
            continue
        raise AssertionError("counts_message accepted a bad block (%s)" % what)
    for geo in [(0, 8, 2), (2, 4097, 2), (257, 4096, 2), (2, 8, 9)]:
        try:
            ec.counts_message(*geo, [])
        except ValueError:
            continue
        raise AssertionError("counts_message accepted geometry %r" % (geo,))
    # More than 256 experts: version 2, ids as little-endian uint16 (docs/protocol.md's example).
    wide = sample_wide_counts()
    eq(wide, {"v": 2, "model": [2, 512, 2],
              "blocks": [[5, None, 1, [2, 2], b"\x03\x00\x2c\x01\x07\x00\xff\x01",
                          b"\x01\x01\x01\x01"]]}, "docs version 2 example")
    eq(ec.counts_message(2, 256, 2, [(5, None, [[[3, 255]], [[7, 0]]])])["v"], 1, "256 experts: v1")
    for ids in ([[3, 512]], [[3, -1]]):
        try:
            ec.counts_message(2, 512, 2, [(5, None, [ids, [[7, 511]]])])
        except ValueError:
            continue
        raise AssertionError("counts_message accepted ids %r of a 512-expert model" % (ids,))


def sample_wide_counts():
    return ec.counts_message(2, 512, 2, [(5, None, [[[3, 300]], [[511, 7]]])])


def test_route_encoding_and_reply():
    with FakeNode(answer_all) as node:
        c = ec.RouteClient(node.endpoint, timeout_ms=5000)
        counts = sample_counts(seq=7)
        reply = c.route("req-1", "qwen3-30b-a3b", [1, BIG - 2**64, b"\x00" * 31 + b"\x07"],
                        counts=counts, label=2, explain=True, cached_blocks=2)
        msg, _ = node.next()
        eq(set(msg), {"version", "type", "id", "model", "blocks", "counts", "cached_blocks",
                      "label", "explain"}, "route_request keys")
        eq(msg["cached_blocks"], 2, "cached_blocks")
        eq(msg["version"], 1, "version")
        eq(msg["type"], "route_request", "type")
        eq(msg["id"], "req-1", "id")
        eq(msg["model"], "qwen3-30b-a3b", "model")
        eq(msg["blocks"], [1, BIG, 7], "blocks normalised to uint64")
        eq(msg["counts"], counts, "counts nested as a map")
        check(isinstance(msg["counts"]["blocks"][0][4], bytes), "ids travel as bin")
        eq(msg["label"], 2, "label")
        check(msg["explain"] is True, "explain is a bool")
        eq(reply["worker"], 3, "worker")
        eq(reply["endpoint"], "tcp://10.0.0.3:5600", "endpoint")
        eq((reply["epoch"], reply["covered_blocks"], reply["total_blocks"]), (9, 2, 3), "reply")
        eq(reply["explain"]["policy"], "eldr", "policy")
        eq(reply["explain"]["band"][1][0], 1, "band")

        # cached_blocks is at most the blocks: refused before anything is sent.
        try:
            c.route("req-3", "m", [1, 2], cached_blocks=3)
            check(False, "cached_blocks over the blocks refused")
        except ValueError as e:
            check("cached_blocks" in str(e), "the error names cached_blocks: %s" % e)

        # Optional fields are left out, not sent as defaults.
        c.route("req-2", "m", [])
        msg, _ = node.next()
        eq(set(msg), {"version", "type", "id", "model", "blocks"}, "minimal route_request keys")
        eq(msg["blocks"], [], "empty blocks")
        c.close()


def test_route_errors():
    def script(msg, raw):
        rid = msg["id"]
        if rid == "busy":
            return [env("error_reply", id=rid, code=6, message="busy")]
        if rid == "future":
            return [env("error_reply", id=rid, code=99, message="from the future")]
        if rid == "noid":  # the node could not read the id
            return [env("error_reply", code=1, message="route_request.blocks: expected array")]
        if rid == "silent":
            return []
        if rid == "stale":  # a late answer to an earlier call comes first, then the right one
            return [env("route_reply", id="someone-else", worker=1, endpoint="x", epoch=1,
                        covered_blocks=0, total_blocks=0),
                    env("route_reply", id=rid, worker=2, endpoint="y", epoch=1,
                        covered_blocks=0, total_blocks=0)]
        if rid == "garbage":
            return [b"\xc1"]
        if rid == "v2":
            return [{"version": 2, "type": "route_reply", "id": rid}]
        return answer_all(msg, raw)

    with FakeNode(script) as node:
        c = ec.RouteClient(node.endpoint, timeout_ms=3000)
        for rid, code, name in [("busy", 6, "overloaded"), ("future", 99, "internal"),
                                ("noid", 1, "malformed")]:
            try:
                c.route(rid, "m", [1])
            except ec.EldrError as e:
                eq((e.code, e.name), (code, name), "error code of " + rid)
                check(e.message, "error message")
                check(name in str(e), "str(EldrError) names the code")
            else:
                raise AssertionError("no EldrError for " + rid)
        eq(c.route("stale", "m", [1])["worker"], 2, "replies to other ids are dropped")
        for rid in ("garbage", "v2"):
            try:
                c.route(rid, "m", [1])
            except ec.ProtocolError:
                pass
            else:
                raise AssertionError("no ProtocolError for " + rid)
        c.close()

        c = ec.RouteClient(node.endpoint, timeout_ms=200)
        t0 = time.monotonic()
        try:
            c.route("silent", "m", [1])
        except TimeoutError:
            elapsed = time.monotonic() - t0
            check(0.15 <= elapsed < 3.0, "timeout took %.3f s for 200 ms" % elapsed)
        else:
            raise AssertionError("no TimeoutError")
        # The client stays usable after a timeout.
        eq(c.route("ok", "m", [1])["id"], "ok", "usable after a timeout")
        c.close()


def test_route_pipelined():
    held = []

    def script(msg, raw):
        # Answer nothing until three requests are in, then all of them in reverse order.
        held.append(msg)
        if len(held) < 3:
            return []
        return [r for m in reversed(held) for r in answer_all(m, None)]

    with FakeNode(script) as node:
        c = ec.RouteClient(node.endpoint, timeout_ms=5000)
        for i in range(3):
            c.send("p%d" % i, "m", [i])
        got = [c.receive()["id"] for _ in range(3)]
        eq(got, ["p2", "p1", "p0"], "replies arrive in the node's order, matched by id")
        try:
            c.receive(timeout_ms=100)
        except TimeoutError:
            pass
        else:
            raise AssertionError("receive() with nothing pending did not time out")
        c.close()


def test_unreachable():
    # A port nothing listens on: the request queues in the DEALER and the call times out.
    port = eldr_testing.free_port()
    for cls in (ec.RouteClient, ec.WorkerClient, ec.AdminClient):
        c = cls("tcp://127.0.0.1:%d" % port, timeout_ms=150)
        try:
            if cls is ec.RouteClient:
                c.route("r", "m", [1])
            elif cls is ec.WorkerClient:
                c.register("m", 0, "tcp://x:1")
            else:
                c.call("status")
        except TimeoutError:
            pass
        else:
            raise AssertionError(cls.__name__ + " did not time out")
        c.close()  # must not hang on the queued message (LINGER 0)


def test_worker_messages():
    with FakeNode(answer_all) as node:
        c = ec.WorkerClient(node.endpoint, timeout_ms=5000)
        expect = {
            "worker_register": {"model": "str", "worker": "int", "endpoint": "str",
                                "capacity": "int"},
            "load_report": {"model": "str", "worker": "int", "in_flight": "int", "running": "int",
                            "waiting": "int", "kv_usage": "float", "seq": "int"},
            "finished": {"model": "str", "worker": "int", "requests": "list"},
            "worker_drain": {"model": "str", "worker": "int", "drain": "bool"},
            "publisher_register": {"model": "str", "endpoint": "str", "replay_endpoint": "str"},
        }
        calls = [
            ("worker_register", lambda: c.register("m", 3, "tcp://10.0.0.3:5600", capacity=64),
             {"worker": 3, "endpoint": "tcp://10.0.0.3:5600", "capacity": 64}, "active"),
            ("load_report", lambda: c.report_load("m", 3, in_flight=5, running=4, waiting=1,
                                                  kv_usage=0.25, seq=42),
             {"in_flight": 5, "running": 4, "waiting": 1, "kv_usage": 0.25, "seq": 42}, "active"),
            ("finished", lambda: c.finished("m", 3, ["a", "b", "c"]),
             {"requests": ["a", "b", "c"]}, "active"),
            ("worker_drain", lambda: c.drain("m", 3), {"drain": True}, "draining"),
            ("worker_drain", lambda: c.drain("m", 3, drain=False), {"drain": False}, "active"),
            ("publisher_register", lambda: c.register_publisher("m", "tcp://h:5557",
                                                                "tcp://h:5558"),
             {"endpoint": "tcp://h:5557", "replay_endpoint": "tcp://h:5558"}, "subscribed"),
        ]
        ids = set()
        for t, call, fields, state in calls:
            ack = call()
            msg, _ = node.next()
            eq(msg["type"], t, "type")
            eq(msg["version"], 1, t + ".version")
            want = dict(expect[t], version="int", type="str", id="str")
            eq(types_of(msg), want, t + " keys and types")
            eq(msg["model"], "m", t + ".model")
            for k, v in fields.items():
                eq(msg[k], v, t + "." + k)
            check(msg["id"] and msg["id"] not in ids, t + ": a fresh correlation id")
            ids.add(msg["id"])
            eq(ack["id"], msg["id"], "ack id")
            eq(ack["state"], state, t + " ack state")
            eq(ack["epoch"], 9, "ack epoch")
        # report_load numbers its reports itself when no seq is given: increasing, and above
        # what a previous run of the worker sent (the wall clock), so a restart is not ignored.
        before = time.time_ns() // 1000
        c.report_load("m", 3, in_flight=1)
        c.report_load("m", 3, in_flight=1)
        s1, s2 = node.next()[0]["seq"], node.next()[0]["seq"]
        check(before <= s1 < s2, "automatic load_report seq: %d, %d" % (s1, s2))
        try:
            c.report_load("m", 3, in_flight=1, kv_usage=1.5)
        except ValueError:
            pass
        else:
            raise AssertionError("kv_usage 1.5 was sent")
        c.close()

    def refuse(msg, raw):
        return [env("error_reply", id=msg["id"], code=4, message="no pool for model x")]

    with FakeNode(refuse) as node:
        c = ec.WorkerClient(node.endpoint, timeout_ms=5000)
        try:
            c.register("x", 0, "tcp://h:1")
        except ec.EldrError as e:
            eq((e.code, e.name, e.message), (4, "unknown_model", "no pool for model x"), "error")
        else:
            raise AssertionError("no EldrError from a worker error_reply")
        c.close()


def test_admin():
    def script(msg, raw):
        rid, cmd = msg["id"], msg["command"]
        if cmd == "centroids.export":
            return [env("admin_reply", id=rid, ok=True, result=b"\x00\x01\xff")]
        if cmd == "refit":
            return [env("admin_reply", id=rid, ok=False, code=5, error="too few samples")]
        if cmd == "bogus":  # an endpoint may also answer a plain error_reply
            return [env("error_reply", id=rid, code=3, message="unknown command")]
        if cmd == "anonymous":  # a reply without an id answers the one call outstanding
            return [env("admin_reply", ok=True, result=None)]
        return answer_all(msg, raw)

    with FakeNode(script) as node:
        c = ec.AdminClient(node.endpoint, timeout_ms=5000)
        r = c.call("status")
        msg, _ = node.next()
        eq(set(msg), {"version", "type", "id", "command", "args"}, "admin_request keys")
        eq((msg["type"], msg["command"], msg["args"]), ("admin_request", "status", {}),
           "status request")
        eq(r, {"command": "status", "args": {}}, "result")

        blob = bytes(range(256))
        c.call("centroids.import", model="m", file=blob)
        msg, _ = node.next()
        eq(msg["args"], {"model": "m", "file": blob}, "import args")
        check(isinstance(msg["args"]["file"], bytes), "file travels as bin")

        c.call("policy", model="m", policy="jsq", tau=0.5)
        msg, _ = node.next()
        eq(msg["args"], {"model": "m", "policy": "jsq", "tau": 0.5}, "policy args")

        eq(c.call("centroids.export", model="m"), b"\x00\x01\xff", "bin result")
        node.next()
        eq(c.call("anonymous"), None, "reply without id")
        node.next()
        for cmd, code, text in [("refit", 5, "too few samples"), ("bogus", 3, "unknown command")]:
            try:
                c.call(cmd, model="m")
            except ec.EldrError as e:
                eq((e.code, e.message), (code, text), cmd + " error")
            else:
                raise AssertionError("no EldrError for " + cmd)
            node.next()
        c.close()


def test_strings_checked_at_the_edge():
    """Endpoints the node would refuse raise ValueError naming the field before anything is
    sent; a reply string that is not UTF-8 (an older node) decodes with U+FFFD."""
    def raw_str(b):
        return bytes([0xa0 | len(b)]) + b

    def bad_endpoint_reply(msg, raw):
        # A route_reply whose endpoint is the two bytes ff fe, written by hand: msgpack would not.
        return [b"\x87" + raw_str(b"version") + b"\x01" + raw_str(b"type") +
                raw_str(b"route_reply") + raw_str(b"id") + msgpack.packb(msg["id"]) +
                raw_str(b"worker") + b"\x02" + raw_str(b"endpoint") + raw_str(b"\xff\xfe") +
                raw_str(b"epoch") + b"\x00" + raw_str(b"covered_blocks") + b"\x00"]

    with FakeNode(answer_all) as node:
        c = ec.WorkerClient(node.endpoint, timeout_ms=5000)
        refused = [
            (lambda: c.register("m", 1, 'tcp://a"b'), "worker_register.endpoint: contains"),
            (lambda: c.register("m", 1, "tcp://a:1\nx"), "worker_register.endpoint: contains"),
            (lambda: c.register("m", 1, ""), "worker_register.endpoint: 0 bytes"),
            (lambda: c.register_publisher("m", "inproc://x"),
             "publisher_register.endpoint: 'inproc://x' is not"),
            (lambda: c.register_publisher("m", "tcp://h:1", "tcp://h:2 "),
             "publisher_register.replay_endpoint: contains"),
        ]
        for call, start in refused:
            try:
                call()
            except ValueError as e:
                check(str(e).startswith(start), "%r starts with %r" % (str(e), start))
            else:
                raise AssertionError("sent: " + start)
        c.register("m", 1, "10.0.0.1:5600")  # no scheme: opaque to the node, accepted
        eq(node.next()[0]["endpoint"], "10.0.0.1:5600", "schemeless worker endpoint")
        # metrics_url: checked as the node checks it (cluster/http/http_url.hpp), sent only when given.
        for bad in ("https://h/metrics", "http://u@h/", "http://h:0/", "http://h/#x",
                    "http://[::1/", "http://a;b/", "tcp://h:1"):
            try:
                c.register("m", 1, "10.0.0.1:5600", metrics_url=bad)
            except ValueError as e:
                check(str(e).startswith("worker_register.metrics_url: "), str(e))
            else:
                raise AssertionError("metrics_url sent: " + bad)
        c.register("m", 1, "10.0.0.1:5600", metrics_url="http://[::1]:8000/metrics")
        eq(node.next()[0]["metrics_url"], "http://[::1]:8000/metrics", "metrics_url sent")
        c.close()
    with FakeNode(bad_endpoint_reply) as node:
        c = ec.RouteClient(node.endpoint, timeout_ms=5000)
        reply = c.route("r1", "m", [1])
        eq(reply["endpoint"], "\ufffd\ufffd", "endpoint that is not UTF-8")
        c.close()


def test_route_warnings_are_surfaced_and_logged():
    # Issue 12: a reply routed by load because of counts of another geometry looked normal. The
    # client gives every route reply "fallback" and "warnings" and logs each warning code at most
    # once per 10 s.
    text = "counts_geometry: counts are L=2 E=16 k=2, the model is L=2 E=8 k=2; routed by load"

    def warned(msg, raw):
        r = env("route_reply", id=msg["id"], worker=1, endpoint="tcp://h:1", epoch=2,
                covered_blocks=0, total_blocks=len(msg["blocks"]))
        if msg["model"] == "bad":
            r["fallback"] = "counts_geometry"
            r["warnings"] = [text]
        return [r]

    class Capture(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    cap = Capture()
    logging.getLogger("eldr_client").addHandler(cap)
    try:
        with FakeNode(warned) as node:
            c = ec.RouteClient(node.endpoint, timeout_ms=5000)
            plain = c.route("r-0", "good", [1])
            eq(plain["fallback"], "", "no fallback")
            eq(plain["warnings"], [], "no warnings")
            for i in range(3):
                reply = c.route("r-%d" % (i + 1), "bad", [1, 2])
                eq(reply["fallback"], "counts_geometry", "fallback")
                eq(reply["warnings"], [text], "warnings")
            c.send("r-9", "bad", [1])
            eq(c.receive()["warnings"], [text], "pipelined warnings")
            eq(c.warned_replies, 4, "warned replies")
            eq(c.fallback_replies, 4, "fallback replies")
            eq(len(cap.lines), 1, "one log line per code per 10 s: %r" % cap.lines)
            check(text in cap.lines[0], "the warning is logged: %r" % cap.lines)
            c.close()
    finally:
        logging.getLogger("eldr_client").removeHandler(cap)


TESTS = [test_counts_message, test_route_encoding_and_reply, test_route_errors,
         test_route_pipelined, test_unreachable, test_worker_messages, test_admin,
         test_strings_checked_at_the_edge, test_route_warnings_are_surfaced_and_logged]


def run_tests():
    failed = 0
    for t in TESTS:
        try:
            t()
            print("PASS", t.__name__, flush=True)
        except Exception:
            failed += 1
            print("FAIL", t.__name__, flush=True)
            traceback.print_exc()
    print("%d of %d tests failed" % (failed, len(TESTS)) if failed else "all %d tests passed"
          % len(TESTS), flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Cross-language checks with python_client_codec_test.cpp. The values here and there must agree.


def encode_fixtures(out_dir):
    """Captures what the real clients put on the wire, one file per message kind."""
    with FakeNode(answer_all) as node:
        def capture(name, call):
            call()
            _, raw = node.next()
            with open(os.path.join(out_dir, name + ".msgpack"), "wb") as f:
                f.write(raw)

        r = ec.RouteClient(node.endpoint, timeout_ms=5000)
        w = ec.WorkerClient(node.endpoint, timeout_ms=5000)
        a = ec.AdminClient(node.endpoint, timeout_ms=5000)
        capture("route_request", lambda: r.route(
            "req-1", "qwen3-30b-a3b", [1, BIG - 2**64, b"\x00" * 31 + b"\x07"],
            counts=sample_counts(seq=7), label=2, explain=True))
        capture("route_request_min", lambda: r.route("req-2", "m", []))
        capture("worker_register", lambda: w.register("m", 3, "tcp://10.0.0.3:5600", 64))
        capture("load_report", lambda: w.report_load("m", 3, in_flight=5, running=4, waiting=1,
                                                     kv_usage=0.25, seq=42))
        capture("finished", lambda: w.finished("m", 3, ["a", "b", "c"]))
        capture("worker_drain", lambda: w.drain("m", 3, drain=False))
        capture("publisher_register", lambda: w.register_publisher(
            "m", "tcp://10.0.0.3:5557", "tcp://10.0.0.3:5558"))
        capture("admin_status", lambda: a.call("status"))
        capture("admin_import", lambda: a.call("centroids.import", model="m",
                                               file=bytes(range(256))))
        for c in (r, w, a):
            c.close()
    # The counts message alone, as a counts publisher would send it.
    with open(os.path.join(out_dir, "counts.msgpack"), "wb") as f:
        f.write(msgpack.packb(sample_counts(seq=7), use_bin_type=True))
    with open(os.path.join(out_dir, "counts_wide.msgpack"), "wb") as f:
        f.write(msgpack.packb(sample_wide_counts(), use_bin_type=True))
    return 0


def plain(v):
    """JSON-safe: bytes as {"hex": ...}."""
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def decode_fixtures(in_dir):
    """Serves each C++-encoded reply in in_dir to the matching real client call; prints one JSON
    object: name -> {"ok": reply/result} or {"error": {code, name, message, id}}."""
    out = {}
    for name in sorted(os.listdir(in_dir)):
        if not name.endswith(".msgpack"):
            continue
        with open(os.path.join(in_dir, name), "rb") as f:
            payload = f.read()
        key = name[:-len(".msgpack")]
        with FakeNode(lambda msg, raw: [payload]) as node:
            # The C++ side wrote fixed ids; make the client correlate on them.
            try:
                if key.startswith("route") or key.startswith("error"):
                    c = ec.RouteClient(node.endpoint, timeout_ms=5000)
                    res = c.route("req-1", "m", [1])
                elif key.startswith("worker"):
                    c = ec.WorkerClient(node.endpoint, timeout_ms=5000)
                    c.next_id = lambda: "w-1"
                    res = c.register("m", 0, "tcp://h:1")
                else:
                    c = ec.AdminClient(node.endpoint, timeout_ms=5000)
                    c.next_id = lambda: "a-1"
                    res = c.call("status")
                out[key] = {"ok": plain(res)}
            except ec.EldrError as e:
                out[key] = {"error": {"code": e.code, "name": e.name, "message": e.message,
                                      "id": e.id}}
            except Exception as e:  # reported to the C++ test, which fails on it
                out[key] = {"exception": "%s: %s" % (type(e).__name__, e)}
            c.close()
    print(json.dumps(out), flush=True)
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "encode":
        return encode_fixtures(argv[2])
    if len(argv) == 3 and argv[1] == "decode":
        return decode_fixtures(argv[2])
    if len(argv) == 1:
        return run_tests()
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
