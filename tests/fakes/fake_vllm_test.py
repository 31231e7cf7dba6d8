#!/usr/bin/python3
"""Integration tests of the fake vLLM against its spec (docs/vllm.md), with real processes:
a fake prefill and a fake decode instance on port 0, the REAL ESFT trace, a ZeroMQ subscriber
that binds while the fake's KV-event publisher connects (as vLLM does with a non-wildcard
endpoint). Exit 77 (skipped) when the shared trace data is absent.
Run: /usr/bin/python3 fake_vllm_test.py
"""
import base64
import http.client
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import msgpack
import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support", "py"))
import eldr_testing  # noqa: E402
import fake_vllm as fv  # noqa: E402

DATA = os.environ.get("ELDR_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
TRACE = os.path.join(DATA, "esft-deepseek-v2-lite.eldrtrace")
SEED = "4242"


def wait_for(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Instance:
    def __init__(self, tmp, name, *extra):
        self.ready_path = os.path.join(tmp, name + ".json")
        self.log = open(os.path.join(tmp, name + ".log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_vllm.py"), "--model", "esft",
             "--trace", TRACE, "--port", "0", "--ready-file", self.ready_path,
             "--time-scale", "0.01", "--python-hash-seed", SEED] + list(extra),
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.ready = wait_for(self._ready, name + " ready file")
        self.port = self.ready["port"]

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("fake exited with %s" % self.proc.returncode)
        try:
            with open(self.ready_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=dict({"Content-Type": "application/json"},
                                                        **(headers or {})))
        r = c.getresponse()
        out = r.status, r.getheader("Content-Type"), r.read()
        c.close()
        return out

    def post(self, path, body, headers=None):
        status, _, data = self.request("POST", path, body, headers)
        return status, json.loads(data)

    def stop(self):
        # A fake that ignores SIGTERM for 10 s fails the test (and is killed, not left behind).
        stopped = eldr_testing.stop_process(self.proc, timeout=10)
        self.log.close()
        if not stopped:
            raise AssertionError("the fake vLLM did not exit within 10 s of SIGTERM")


def parse_sse(raw):
    """Strict: only `data: <json>` events separated by blank lines, ending with [DONE]."""
    text = raw.decode("utf-8")
    assert text.endswith("data: [DONE]\n\n"), text[-80:]
    events = text.split("\n\n")
    assert events[-1] == "", "trailing bytes after the last event"
    out = []
    for ev in events[:-2]:
        assert ev.startswith("data: ") and "\n" not in ev, repr(ev)
        out.append(json.loads(ev[len("data: "):]))
    assert events[-2] == "data: [DONE]"
    return out


PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


class FakeVllmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.trace = fv.Trace.load(TRACE)
        cls.ctx = zmq.Context()
        cls.sub = cls.ctx.socket(zmq.SUB)
        cls.sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = cls.sub.bind_to_random_port("tcp://127.0.0.1")
        cls.prefill = Instance(cls.tmp.name, "prefill", "--role", "prefill",
                               "--enable-return-routed-experts", "--dense-layers", "1",
                               "--kv-events-endpoint", "tcp://127.0.0.1:%d" % port,
                               "--kv-events-topic", "kv")
        cls.decode = Instance(cls.tmp.name, "decode", "--role", "decode",
                              "--enable-return-routed-experts", "--kv-hold-s", "60")

    @classmethod
    def tearDownClass(cls):
        cls.prefill.stop()
        cls.decode.stop()
        cls.sub.close(0)
        cls.ctx.term()
        cls.tmp.cleanup()

    def do_prefill(self, prompt, rid):
        status, body = self.prefill.post("/v1/completions", {
            "model": "esft", "prompt": prompt, "max_tokens": 1, "stream": False,
            "return_token_ids": True, "kv_transfer_params": PREFILL_PARAMS},
            {"X-Request-Id": rid})
        self.assertEqual(status, 200, body)
        return body

    def test_prefill_returns_nixl_params_and_the_traces_routed_experts(self):
        body = self.do_prefill("req:esft-law-3 what does the contract say about notice", "p1")
        ktp = body["kv_transfer_params"]
        self.assertEqual(set(ktp), {"do_remote_prefill", "do_remote_decode", "remote_block_ids",
                                    "remote_engine_id", "remote_request_id", "remote_host",
                                    "remote_port", "tp_size"})
        self.assertIs(ktp["do_remote_prefill"], True)
        self.assertEqual(ktp["remote_engine_id"], self.prefill.ready["engine_id"])
        self.assertEqual(ktp["remote_request_id"], "cmpl-p1-0")
        choice = body["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        n = len(choice["prompt_token_ids"])
        self.assertEqual(n, 8)
        arr = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])), allow_pickle=False)
        self.assertEqual(arr.dtype, np.uint8)
        self.assertEqual(arr.shape, (n, 1 + 26, 6))  # num_tokens - 1 rows; dense layer 0 first
        self.assertTrue((arr[:, 0, :] == 0).all())
        req = self.trace.requests[self.trace.index["esft-law-3"]]
        np.testing.assert_array_equal(arr[:, 1:, :], req[3][:n])

    def test_decode_with_the_prefills_params_streams_strict_sse(self):
        prompt = "req:esft-summary-2 summarise this article in three lines please"
        ktp = self.do_prefill(prompt, "p2")["kv_transfer_params"]
        status, ctype, raw = self.decode.request("POST", "/v1/completions", {
            "model": "esft", "prompt": prompt, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "kv_transfer_params": ktp},
            {"X-Request-Id": "p2"})
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/event-stream"))
        chunks = parse_sse(raw)
        texts = [c["choices"][0]["text"] for c in chunks[:-1]]
        self.assertEqual(texts, [" o0", " o1", " o2", " o3", " o4"])
        for c in chunks[:-1]:
            self.assertEqual(list(c), ["id", "object", "created", "model", "choices"])
            self.assertEqual(c["id"], "cmpl-p2-0")
            self.assertEqual(c["object"], "text_completion")
        self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks[:-1]],
                         [None, None, None, None, "length"])
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"], {"prompt_tokens": 8, "total_tokens": 13,
                                               "completion_tokens": 5})
        # the transfer consumed the prefill's hold: reading it twice fails like a stale NIXL read
        status, ctype, raw = self.decode.request("POST", "/v1/completions", {
            "model": "esft", "prompt": prompt, "max_tokens": 2, "stream": True,
            "kv_transfer_params": ktp})
        self.assertEqual(parse_sse(raw)[0]["error"]["code"], 500)

    def test_decode_without_params_is_refused_and_counted(self):
        before = self.counter("fake_vllm:decode_requests_without_kv_transfer_total")
        status, body = self.decode.post("/v1/completions", {"model": "esft", "prompt": "a b",
                                                           "max_tokens": 2})
        self.assertEqual(status, 400)
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
        self.assertEqual(body["error"]["param"], "kv_transfer_params")
        bad = dict(PREFILL_PARAMS, do_remote_decode=False, do_remote_prefill=True,
                   remote_block_ids=[[1]])  # the keys vLLM requires are null/absent
        del bad["remote_host"]
        status, body = self.decode.post("/v1/completions", {"model": "esft", "prompt": "a b",
                                                           "kv_transfer_params": bad})
        self.assertEqual(status, 400)
        self.assertEqual(self.counter("fake_vllm:decode_requests_without_kv_transfer_total"),
                         before + 2)

    def test_params_naming_an_unknown_prefill_fail_the_kv_load(self):
        ktp = dict(self.do_prefill("req:esft-intent-5 hello", "p3")["kv_transfer_params"],
                   remote_engine_id="not-the-engine")
        status, body = self.decode.post("/v1/completions", {"model": "esft",
                                                           "prompt": "req:esft-intent-5 hello",
                                                           "kv_transfer_params": ktp})
        self.assertEqual(status, 500)
        self.assertIn("unknown engine id", body["error"]["message"])
        self.assertGreaterEqual(self.counter("fake_vllm:kv_load_failures_total"), 1)

    def test_chat_non_streaming_and_errors_have_vllms_shapes(self):
        status, body = self.decode.post("/v1/chat/completions", {"model": "other",
                                                                "messages": []})
        self.assertEqual((status, body["error"]["type"]), (404, "NotFoundError"))
        for bad in (b"not json", {"model": "esft", "prompt": 5, "kv_transfer_params": {}},
                    {"model": "esft", "prompt": "x", "max_tokens": -1},
                    {"model": "esft", "prompt": "x", "stream_options": {}, "stream": False}):
            status, body = self.prefill.post("/v1/completions", bad)
            self.assertEqual(status, 400, bad)
            self.assertEqual(body["error"]["code"], 400)
        ktp = self.prefill.post("/v1/chat/completions", {
            "model": "esft", "messages": [{"role": "user", "content": "req:esft-intent-9 hi"}],
            "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS})[1]["kv_transfer_params"]
        status, body = self.decode.post("/v1/chat/completions", {
            "model": "esft", "messages": [{"role": "user", "content": "req:esft-intent-9 hi"}],
            "max_tokens": 3, "kv_transfer_params": ktp})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["choices"][0]["message"]["content"], " o0 o1 o2")

    def test_models_health_and_metrics(self):
        status, _, raw = self.decode.request("GET", "/v1/models")
        models = json.loads(raw)
        self.assertEqual((status, models["object"], models["data"][0]["id"]), (200, "list", "esft"))
        status, _, raw = self.decode.request("GET", "/health")
        self.assertEqual((status, raw), (200, b""))
        text = self.decode.request("GET", "/metrics")[2].decode()
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                     "vllm:generation_tokens_total"):
            self.assertIn('%s{model_name="esft",engine="0"} ' % name, text)
        self.assertIn("# TYPE vllm:num_requests_running gauge", text)

    def test_kv_events_carry_vllms_sha256_cbor_hashes(self):
        # A connecting PUB can lose what it sends before it has read the subscription (ZeroMQ's
        # slow joiner; vLLM's publisher is the same): each attempt prefills a new prompt and
        # waits for its own BlockStored; the hashes must be vLLM's sha256_cbor chain.
        seqs = []
        for attempt in range(50):
            words = ["req:esft-translation-1"] + ["a%dw%d" % (attempt, i) for i in range(40)]
            body = self.do_prefill(" ".join(words), "p4-%d" % attempt)
            ids = body["choices"][0]["prompt_token_ids"]
            want = [fv.external_hash(h) for h in fv.block_hashes(ids, 16, fv.none_hash(SEED))]
            self.assertEqual(len(want), 2)
            while self.sub.poll(200):
                topic, seq, payload = self.sub.recv_multipart()
                self.assertEqual(topic, b"kv")
                seqs.append(int.from_bytes(seq, "big"))
                ts, events, dp = msgpack.unpackb(payload, raw=False)
                self.assertIsInstance(ts, float)
                self.assertEqual(dp, 0)
                stored = [e for e in events if e["type"] == "BlockStored"]
                if stored and stored[0]["block_hashes"] == want:
                    self.assertIsNone(stored[0]["parent_block_hash"])
                    self.assertEqual(stored[0]["token_ids"], ids[:32])
                    self.assertEqual(seqs, sorted(seqs))  # sequence numbers only grow
                    return
        self.fail("no BlockStored with the prompt's sha256_cbor hashes arrived")

    def counter(self, name):
        text = self.decode.request("GET", "/metrics")[2].decode()
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(name + " missing")


if __name__ == "__main__":
    if not os.path.exists(TRACE):
        print("SKIP: %s not found (set ELDR_SHARED_DATA)" % TRACE)
        sys.exit(77)
    unittest.main()
