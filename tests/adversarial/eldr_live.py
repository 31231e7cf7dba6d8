#!/usr/bin/python3
"""Shared pieces of the live-node harnesses (tests/adversarial/live_node.py, the fault campaign in
tests/integration/fault_campaign.py and bench/soak.py): an eldr-node process started on free ports
(port 0, endpoints read from its "eldr-node ready {json}" line), strict clients for its three
ZeroMQ ROUTER endpoints and its metrics HTTP port, a toy centroid file, a MessagePack encoder that
can also write what Python's msgpack refuses to (invalid UTF-8 in a str, NaN as float32), and a
scripted vLLM KV-event publisher (XPUB + replay ROUTER) the node can be told to subscribe to.

Needs Debian's python3-zmq and python3-msgpack: run with /usr/bin/python3. Waits are bounded by
deadlines on observable conditions, never sleeps used as synchronisation.
"""
import math
import os
import struct
import subprocess
import sys
import threading
import time

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "py"))
import eldr_testing  # noqa: E402

U64 = (1 << 64) - 1
MODEL = "toy"
GEOMETRY = (2, 8, 2)  # layers, experts, top_k of the toy model
K = 4  # decode workers of the toy pool


class Violation(Exception):
    """An invariant or an oracle did not hold."""


# ---------------------------------------------------------------------------------------------
# MessagePack encoding with hostile extras


class RawStr:
    """A msgpack str whose bytes are written as they are (may be invalid UTF-8)."""

    def __init__(self, data):
        self.data = bytes(data)

    def __repr__(self):
        return "RawStr(%r)" % self.data[:40]


class F32:
    """A float written as float32 (NaN, inf)."""

    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return "F32(%r)" % self.v


class Raw:
    """Bytes spliced into the encoding as they are (truncations, deep nesting)."""

    def __init__(self, data):
        self.data = bytes(data)

    def __repr__(self):
        return "Raw(%d bytes)" % len(self.data)


def pack(obj):
    out = bytearray()
    _pack(obj, out)
    return bytes(out)


def _pack_len(out, n, fix_base, fix_max, c8, c16, c32):
    if n <= fix_max and fix_base is not None:
        out.append(fix_base | n)
    elif n < 256 and c8 is not None:
        out += bytes([c8, n])
    elif n < 65536:
        out += bytes([c16]) + struct.pack(">H", n)
    else:
        out += bytes([c32]) + struct.pack(">I", n)


def _pack(o, out):
    if isinstance(o, Raw):
        out += o.data
    elif isinstance(o, RawStr):
        _pack_len(out, len(o.data), 0xA0, 31, 0xD9, 0xDA, 0xDB)
        out += o.data
    elif isinstance(o, F32):
        out += b"\xca" + struct.pack(">f", o.v)
    elif isinstance(o, (list, tuple)):
        _pack_len(out, len(o), 0x90, 15, None, 0xDC, 0xDD)
        for x in o:
            _pack(x, out)
    elif isinstance(o, dict):
        _pack_len(out, len(o), 0x80, 15, None, 0xDE, 0xDF)
        for k, v in o.items():
            _pack(k, out)
            _pack(v, out)
    elif isinstance(o, str):
        _pack(RawStr(o.encode("utf-8", "surrogatepass")), out)
    else:
        out += msgpack.packb(o, use_bin_type=True)


def unpack_strict(data):
    """A reply as the strictest client reads it: one object, str must be valid UTF-8."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# ---------------------------------------------------------------------------------------------
# Centroid files (docs/centroid-file.md)


def toy_centroid_file(epoch=1, shift=0, model_name=MODEL, workers=K):
    """Worker w's centroid puts 0.5 on experts {2w, 2w+1} (+shift) of both layers: unit rows."""
    layers, experts, top_k = GEOMETRY
    width = layers * experts
    vals = []
    for w in range(workers):
        row = [0.0] * width
        for l in range(layers):
            for e in (2 * w, 2 * w + 1):
                row[l * experts + (e + shift) % experts] = 0.5
        vals += row
    return msgpack.packb({
        "format": "eldr-centroids", "version": 1,
        "model": {"name": model_name, "layers": layers, "experts": experts, "top_k": top_k},
        "transform": "count", "layer_mask": list(range(layers)), "epoch": epoch,
        "workers": workers, "width": width,
        "centroids": struct.pack("<%df" % len(vals), *vals),
        "provenance": {"source": "eldr_live.py", "tool": "test", "seed": 0,
                       "calibration_requests": 0, "rho": 0.0, "objective": 0.0,
                       "kmeans_variant": "none"},
    }, use_bin_type=True)


def counts_message(blocks, domain):
    """An eldr counts message (docs/protocol.md section 2): each block a 1-token block of the toy
    geometry whose token picks experts {2d, 2d+1} in both layers (d = domain % 4)."""
    layers, experts, top_k = GEOMETRY
    d = domain % K
    out = []
    parent = None
    for h in blocks:
        ids = bytes([2 * d, 2 * d + 1] * layers)
        out.append([h, parent, 1, [2] * layers, ids, b"\x01" * len(ids)])
        parent = h
    return {"v": 1, "model": list(GEOMETRY), "blocks": out}


# ---------------------------------------------------------------------------------------------
# The node process


def find_binary(build_dir, name):
    for sub in ("tools/%s/%s" % (name, name), name):
        p = os.path.join(build_dir, sub)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise FileNotFoundError("%s not found under %s" % (name, build_dir))


MODELS_TOML = ("[[models]]\nname = \"toy\"\nworkers = 4\nwiden_single = false\n"
               "worker_timeout_ms = {timeout}\ncentroids = \"{centroids}\"\n{extra}")


def node_toml(data_dir, centroids, worker_timeout_ms=600000, model_extra="", extra="",
              log_level="warn"):
    return ("[node]\nname = \"live-node\"\ndata_dir = \"%s\"\n"
            "[endpoints]\nroute = \"tcp://127.0.0.1:0\"\nworker = \"tcp://127.0.0.1:0\"\n"
            "admin = \"tcp://127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\n"
            "[runtime]\nlog_level = \"%s\"\n%s" % (data_dir, log_level, extra) +
            MODELS_TOML.format(timeout=worker_timeout_ms, centroids=centroids, extra=model_extra))


class Node:
    """One eldr-node process. stdout and stderr go to `log_path` (after the ready line)."""

    def __init__(self, binary, config_path, log_path, wrapper=None, env=None):
        self.binary = binary
        self.config_path = config_path
        self.log_path = log_path
        self.wrapper = wrapper or []
        self.env = env
        self.proc = None
        self.ready = None
        self.log_lines_seen = 0

    def start(self, timeout=60.0):
        log = open(self.log_path, "ab")
        log.write(b"--- start %.3f\n" % time.time())
        log.flush()
        cmd = self.wrapper + [self.binary, "--config", self.config_path]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=self.env)
        self.ready = eldr_testing.read_ready_line(self.proc, "eldr-node", log, timeout)
        if self.ready is not None:
            return self
        self.proc.kill()
        self.proc.wait()
        raise Violation("eldr-node did not become ready within %.0f s (exit %s); log: %s\n%s" %
                        (timeout, self.proc.returncode, self.log_path, self.log_tail()))

    @property
    def pid(self):
        # The node's own pid (the ready line has it): under a wrapper Popen's may differ.
        if self.ready and isinstance(self.ready.get("pid"), int):
            return self.ready["pid"]
        return self.proc.pid

    def endpoint(self, name):
        return self.ready[name]

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=60.0):
        if not self.alive():
            return self.proc.returncode if self.proc else None
        if not eldr_testing.stop_process(self.proc, timeout):
            raise Violation("eldr-node did not stop within %.0f s of SIGTERM" % timeout)
        return self.proc.returncode

    def kill(self):
        if self.proc is not None:
            eldr_testing.kill_process(self.proc)

    def rss_kb(self):
        try:
            with open("/proc/%d/status" % self.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def cpu_seconds(self):
        with open("/proc/%d/stat" % self.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


# ---------------------------------------------------------------------------------------------
# Clients


class Client:
    """A DEALER on one endpoint. call() sends one message and waits for the reply with its id;
    replies that do not decode strictly raise Violation (the node must never send those)."""

    def __init__(self, ctx, endpoint, kind=zmq.DEALER):
        self.sock = ctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.endpoint = endpoint
        self.n = 0

    def close(self):
        self.sock.close(0)

    def next_id(self, prefix="c"):
        self.n += 1
        return "%s%d" % (prefix, self.n)

    def send(self, msg):
        self.sock.send(pack(msg) if not isinstance(msg, bytes) else msg)

    def recv(self, timeout_ms):
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        try:
            return unpack_strict(frames[-1])
        except Exception as e:  # noqa: BLE001 - any decode failure is the node's fault
            raise Violation("reply on %s does not decode strictly (%s): %r" %
                            (self.endpoint, e, frames[-1][:200]))

    def call(self, msg, timeout_ms=5000):
        msg = dict(msg)
        msg.setdefault("id", self.next_id())
        self.send(msg)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return None
            r = self.recv(left)
            if r is None:
                return None
            # An error_reply without id answers a request the node could not read (protocol.md
            # section 4): with one request outstanding, it is this one's.
            if isinstance(r, dict) and (r.get("id") == msg["id"] or
                                        (r.get("id") is None and r.get("type") == "error_reply")):
                return r


def route_request(rid, blocks, counts=None, explain=False):
    m = {"version": 1, "type": "route_request", "id": rid, "model": MODEL, "blocks": blocks}
    if counts is not None:
        m["counts"] = counts
    if explain:
        m["explain"] = True
    return m


def worker_msg(kind, **fields):
    m = {"version": 1, "type": kind, "model": MODEL}
    m.update(fields)
    return m


def admin_msg(command, **args):
    return {"version": 1, "type": "admin_request", "command": command, "args": args}


class Admin:
    def __init__(self, ctx, endpoint):
        self.c = Client(ctx, endpoint)
        self.calls = 0  # requests sent: each reply counts in the node's replies_sent

    def close(self):
        self.c.close()

    def call(self, command, timeout_ms=10000, **args):
        """The admin_reply (ok or not); Violation when none comes."""
        self.calls += 1
        r = self.c.call(admin_msg(command, **args), timeout_ms)
        if r is None:
            raise Violation("admin %s: no reply within %d ms" % (command, timeout_ms))
        return r

    def ok(self, command, **args):
        r = self.call(command, **args)
        if not r.get("ok"):
            raise Violation("admin %s %r failed: %r" % (command, args, r))
        return r.get("result")


def metrics_hostport(endpoint):
    """host:port of the metrics endpoint as the ready line gives it (http://H:P/metrics)."""
    if "://" in endpoint:
        endpoint = endpoint.split("://", 1)[1]
    return endpoint.split("/", 1)[0]


def http_get(endpoint, path="/metrics", timeout=5.0):
    """(status, body bytes) of one GET; raises OSError on failure."""
    host, port = metrics_hostport(endpoint).rsplit(":", 1)
    return eldr_testing.http_get(host, port, path, timeout)


# ---------------------------------------------------------------------------------------------
# A vLLM KV-event publisher (../shared/reference/vllm-kv-events.md)

END_SEQ = U64.to_bytes(8, "big")


class Publisher:
    """XPUB (so that subscriptions can be waited for) + replay ROUTER answering [empty, seq8]
    with the buffered batches from seq on and the end marker, in vLLM's new reply shape."""

    def __init__(self, ctx):
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.SNDHWM, 1000000)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = "tcp://127.0.0.1:%d" % self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = "tcp://127.0.0.1:%d" % self.router.bind_to_random_port(
            "tcp://127.0.0.1")
        self.seq = 0
        self.buffer = []
        self.lock = threading.Lock()
        self.replay_requests = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def _serve_replay(self):
        while not self.stop.is_set():
            if not self.router.poll(100):
                continue
            frames = self.router.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1][-8:], "big")
            with self.lock:
                self.replay_requests += 1
                batches = [(s, p) for s, p in self.buffer if s >= start]
            for s, p in batches:
                self.router.send_multipart([client, b"", b"kv", s.to_bytes(8, "big"), p])
            self.router.send_multipart([client, b"", b"kv", END_SEQ, b""])

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.pub.close(0)
        self.router.close(0)

    def drain_subscriptions(self):
        n = 0
        while self.pub.poll(0):
            if self.pub.recv()[:1] == b"\x01":
                n += 1
        return n

    def wait_subscriber(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.pub.poll(int(max(1, (deadline - time.monotonic()) * 1000))):
                if self.pub.recv()[:1] == b"\x01":
                    return True
        return False

    @staticmethod
    def batch(events, ts=1.0):
        return msgpack.packb([ts, events, 0], use_bin_type=True)

    def send_batch(self, events, lose=False, seq=None):
        """Publishes the next batch (seq = last + 1 unless given); `lose`: buffered for replay
        but not sent, which opens a gap."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        payload = self.batch(events)
        with self.lock:
            self.buffer.append((seq, payload))
            del self.buffer[:-200000]  # a replay after a node restart finds the whole gap
        if not lose:
            self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
        return seq

    def send_raw(self, frames):
        self.pub.send_multipart(frames)


def stored(hashes, group=None, parent=None):
    return ["BlockStored", hashes, parent, [], 16, None, "GPU", None, None, group]


def removed(hashes, group=None, with_group=True):
    return ["BlockRemoved", hashes, "GPU", group] if with_group else ["BlockRemoved", hashes,
                                                                       "GPU"]


def is_finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def rng_hash(rng):
    return rng.getrandbits(63) | 1
