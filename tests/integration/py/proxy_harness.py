#!/usr/bin/python3
"""Pieces shared by eldr-proxy's end-to-end test (eldr_proxy_test.py) and its benchmark
(bench/eldr_proxy_bench.py): processes that announce "<name> ready {json}", a tap on the node's
route endpoint that keeps every route_request, the ESFT trace read with msgpack, a centroid file
with one centroid per task label, and the node's configuration.

Debian's python3-zmq, python3-msgpack, python3-numpy; waits are bounded by deadlines.
"""
import collections
import os
import subprocess
import sys
import threading

import msgpack
import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "py"))
import eldr_testing  # noqa: E402
import eldr_trace  # noqa: E402
PYTHON = "/usr/bin/python3"
PROXY = os.path.join(ROOT, "tools", "eldr-proxy", "eldr-proxy")
FAKE = os.path.join(ROOT, "tests", "fakes", "fake_vllm.py")
MODEL = "esft"
SEED = "1234"
K = 4
BLOCK = 16


class ReadyProcess:
    """A child process whose stdout announces "<prefix> ready {json}"; its output goes to a log
    file. start() waits (bounded) for that line."""

    def __init__(self, cmd, prefix, log_path, env=None):
        self.cmd, self.prefix, self.log_path, self.env = cmd, prefix, log_path, env
        self.proc = None
        self.ready = None

    def start(self, timeout=60.0):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, env=self.env)
        self.ready = eldr_testing.read_ready_line(self.proc, self.prefix, log, timeout)
        if self.ready is not None:
            return self
        log.close()
        self.kill()
        raise AssertionError("%s did not become ready within %.0f s; log %s:\n%s"
                             % (self.cmd[:2], timeout, self.log_path, self.tail()))

    def tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self):
        if self.proc is not None:
            eldr_testing.kill_process(self.proc)

    def stop(self):
        if self.proc is not None:
            eldr_testing.stop_process(self.proc, timeout=30)


class RouteTap:
    """A relay between the proxy and the node's route endpoint that keeps every route_request:
    a ROUTER on 127.0.0.1:0 for the proxy, a DEALER to the node; replies go back to the peer
    whose request carried the reply's id."""

    def __init__(self, node_route):
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        port = self.front.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = "tcp://127.0.0.1:%d" % port
        self.back = self.ctx.socket(zmq.DEALER)
        self.back.setsockopt(zmq.LINGER, 0)
        self.back.connect(node_route)
        self.requests = {}  # id -> decoded route_request
        self.peers = {}
        self.lock = threading.Lock()
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        while not self.stop:
            # The timeout only bounds how late the thread sees stop.
            ready = dict(poller.poll(20))
            if self.front in ready:
                peer, payload = self.front.recv_multipart()
                msg = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                with self.lock:
                    self.requests[msg.get("id")] = msg
                    self.peers[msg.get("id")] = peer
                self.back.send(payload)
            if self.back in ready:
                payload = self.back.recv_multipart()[-1]
                rid = msgpack.unpackb(payload, raw=False, strict_map_key=False).get("id")
                with self.lock:
                    peer = self.peers.pop(rid, None)
                if peer is not None:
                    self.front.send_multipart([peer, payload])

    def close(self):
        self.stop = True
        self.thread.join()
        self.front.close(0)
        self.back.close(0)
        self.ctx.term()


def read_trace(path):
    """((L, E, k), {id: (label, prompt_tokens, ids (P+O, L, k))}) read with eldr_trace."""
    t = eldr_trace.read_trace(path)
    g = t.geometry
    out = collections.OrderedDict()
    for r in t.requests:
        n = r.prompt_tokens + r.output_tokens
        out[r.id] = (r.label, r.prompt_tokens, r.ids().reshape(n, g.layers, g.top_k))
    return (g.layers, g.experts, g.top_k), out


def centroid_file(geometry, trace, labels):
    """One centroid per label: the label's prompts' mean expert counts, per layer, L2-normed
    over the whole vector (the count transform). Worker w <- labels[w]."""
    L, E, k = geometry
    rows = []
    for lab in labels:
        acc = np.zeros((L, E))
        for label, P, ids in trace.values():
            if label != lab:
                continue
            for l in range(L):
                acc[l] += np.bincount(ids[:P, l, :].ravel(), minlength=E)
        v = acc.ravel()
        rows.append(v / np.linalg.norm(v))
    vals = np.concatenate(rows).astype("<f4")
    return msgpack.packb({
        "format": "eldr-centroids", "version": 1,
        "model": {"name": MODEL, "layers": L, "experts": E, "top_k": k},
        "transform": "count", "layer_mask": list(range(L)), "epoch": 1, "workers": len(labels),
        "width": L * E, "centroids": vals.tobytes(),
        "provenance": {"source": "eldr_proxy_test.py", "tool": "test", "seed": 0,
                       "calibration_requests": len(trace), "rho": 0.0, "objective": 0.0,
                       "kmeans_variant": "none"}}, use_bin_type=True)


# The node's policy for the model, named in its config (the node's default for models with
# centroids); the tests check that each decision was made by it, not by a fallback.
POLICY = "eldr-adaptive"


def node_toml(data_dir, centroids):
    return ("[node]\nname = \"proxy-test\"\ndata_dir = \"%s\"\n"
            "[endpoints]\nroute = \"tcp://127.0.0.1:0\"\nworker = \"tcp://127.0.0.1:0\"\n"
            "admin = \"tcp://127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\n"
            "[runtime]\nlog_level = \"warn\"\n"
            "[[models]]\nname = \"%s\"\nworkers = %d\nwiden_single = false\n"
            "centroids = \"%s\"\npolicy = \"%s\"\n"
            % (data_dir, MODEL, K, centroids, POLICY))
