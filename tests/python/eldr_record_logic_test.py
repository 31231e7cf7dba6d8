#!/usr/bin/python3
"""Unit tests (pure logic: no sockets, no processes, no files) of eldr-record and the Python
modules it is built from: the prompts file parser, vLLM's routed-experts decoding and the
dense-layer map, the eldr-trace encoder and validator, the journal's framing and resume plan,
response parsing and the progress report.

    /usr/bin/python3 tests/python/eldr_record_logic_test.py     # exit 0 when all pass

Needs Debian's python3-msgpack, python3-numpy and python3-aiohttp (/usr/bin/python3).
"""
import base64
import io
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ in it
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "cluster", "python"), os.path.join(ROOT, "tools", "eldr-record")]

import msgpack  # noqa: E402
import numpy as np  # noqa: E402

import eldr_routed_experts as rex  # noqa: E402
import eldr_trace  # noqa: E402
from eldr_record import journal as jr  # noqa: E402
from eldr_record import recorder  # noqa: E402
from eldr_record.progress import Progress  # noqa: E402
from eldr_record.prompts import PromptError, parse_prompts  # noqa: E402


def npy_b64(arr):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def routing(tokens, layers, experts, top_k, seed=0):
    """Random valid routing: k distinct ids per token and layer."""
    rng = np.random.default_rng(seed)
    out = np.empty((tokens, layers, top_k), dtype=np.int64)
    for t in range(tokens):
        for l in range(layers):
            out[t, l] = rng.choice(experts, size=top_k, replace=False)
    return out


class PromptsTest(unittest.TestCase):
    def parse(self, lines, label_key=None):
        return parse_prompts(lines, "p.jsonl", label_key)

    def assertLineError(self, lines, line, fragment, label_key=None):
        with self.assertRaises(PromptError) as cm:
            self.parse(lines, label_key)
        self.assertIn("p.jsonl:%d:" % line, str(cm.exception))
        self.assertIn(fragment, str(cm.exception))

    def test_completion_chat_ids_labels(self):
        prompts, missing = self.parse([
            json.dumps({"prompt": "hello world", "task": "law"}),
            "",
            json.dumps({"id": 7, "messages": [{"role": "user", "content": "hi"}]}),
            json.dumps({"id": "x", "prompt": "p", "max_tokens": 5}),
        ], label_key="task")
        self.assertEqual([p.id for p in prompts], ["line-1", "7", "x"])
        self.assertEqual([p.line for p in prompts], [1, 3, 4])
        self.assertEqual([p.kind for p in prompts], ["completion", "chat", "completion"])
        self.assertEqual([p.label for p in prompts], ["law", "", ""])
        self.assertEqual(missing, 2)
        self.assertEqual(prompts[0].request_json("m", 32),
                         {"model": "m", "max_tokens": 32, "prompt": "hello world"})
        self.assertEqual(prompts[1].request_json("m", 32),
                         {"model": "m", "max_tokens": 32,
                          "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(prompts[1].path, "/v1/chat/completions")
        self.assertEqual(prompts[2].request_json("m", 32)["max_tokens"], 5)

    def test_digest_follows_content_not_key_order(self):
        a, _ = self.parse(['{"prompt": "a", "t": 1}'])
        b, _ = self.parse(['{"t": 1,  "prompt": "a"}'])
        c, _ = self.parse(['{"t": 2, "prompt": "a"}'])
        self.assertEqual(a[0].digest, b[0].digest)
        self.assertNotEqual(a[0].digest, c[0].digest)

    def test_errors_name_the_line(self):
        ok = json.dumps({"prompt": "a"})
        self.assertLineError([ok, "{not json"], 2, "not valid JSON")
        self.assertLineError([ok, ok, "[1, 2]"], 3, "JSON object")
        self.assertLineError(['{"prompt": "a", "messages": []}'], 1, "exactly one of")
        self.assertLineError(['{"id": "a"}'], 1, "exactly one of")
        self.assertLineError(['{"prompt": ""}'], 1, "non-empty string")
        self.assertLineError(['{"prompt": 3}'], 1, "non-empty string")
        self.assertLineError(['{"messages": []}'], 1, "non-empty list")
        self.assertLineError(['{"messages": ["hi"]}'], 1, "object")
        self.assertLineError(['{"messages": [{"content": "hi"}]}'], 1, "role")
        self.assertLineError(['{"messages": [{"role": "user", "content": 5}]}'], 1, "content")
        self.assertLineError(['{"prompt": "a", "id": ""}'], 1, "\"id\"")
        self.assertLineError(['{"prompt": "a", "id": 1.5}'], 1, "\"id\"")
        self.assertLineError(['{"prompt": "a", "max_tokens": 0}'], 1, "max_tokens")
        self.assertLineError(['{"prompt": "a", "max_tokens": true}'], 1, "max_tokens")
        self.assertLineError(['{"prompt": "a", "t": 3}'], 1, "label 't' must be a string", "t")
        self.assertLineError(['{"prompt": "a", "id": "x"}', ok, '{"prompt": "b", "id": "x"}'],
                             3, "already used on line 1")

    def test_empty_file(self):
        with self.assertRaises(PromptError) as cm:
            self.parse(["", "  "])
        self.assertIn("no prompts", str(cm.exception))


class RoutedExpertsTest(unittest.TestCase):
    def test_decode_npy_every_dtype_vllm_uses(self):
        arr = routing(5, 3, 64, 4)
        for dtype in (np.uint8, np.uint16, np.int32):
            got = rex.decode(npy_b64(arr.astype(dtype)))
            self.assertEqual(got.shape, (5, 3, 4))
            np.testing.assert_array_equal(got, arr)

    def test_decode_nested_lists(self):
        arr = routing(2, 2, 8, 2)
        np.testing.assert_array_equal(rex.decode(arr.tolist()), arr)

    def test_decode_errors(self):
        cases = [
            (None, "--enable-return-routed-experts"),
            ("%%%", "base64"),
            (base64.b64encode(b"hello").decode(), ".npy"),
            (npy_b64(np.zeros((3, 4), dtype=np.uint8)), "3 dimensions"),
            (npy_b64(np.zeros((1, 1, 1), dtype=np.float32) + 1), "integers"),
            (npy_b64(np.full((1, 1, 2), -1, dtype=np.int32)), "negative"),
            ([[1, 2], [3]], "ragged"),
            (12, "base64 string or a list"),
        ]
        for value, fragment in cases:
            with self.subTest(value=str(value)[:20]):
                with self.assertRaises(rex.RoutedExpertsError) as cm:
                    rex.decode(value)
                self.assertIn(fragment, str(cm.exception))

    def test_decode_refuses_pickled_objects(self):
        buf = io.BytesIO()
        np.save(buf, np.array([[[object()]]], dtype=object), allow_pickle=True)
        with self.assertRaises(rex.RoutedExpertsError):
            rex.decode(base64.b64encode(buf.getvalue()).decode())

    def test_auto_finds_leading_and_inner_dense_layers(self):
        moe = routing(6, 4, 16, 3)
        full = np.zeros((6, 6, 3), dtype=np.int64)   # layers 0 and 3 dense
        full[:, [1, 2, 4, 5], :] = moe
        m = rex.MoeLayerMap.from_spec("auto", full)
        self.assertEqual(m.dense_layers, [0, 3])
        self.assertEqual(m.moe_layers, [1, 2, 4, 5])
        np.testing.assert_array_equal(m.select(full), moe)
        again = rex.MoeLayerMap.from_dict(json.loads(json.dumps(m.to_dict())))
        np.testing.assert_array_equal(again.select(full), moe)

    def test_explicit_lists_and_all(self):
        arr = routing(2, 6, 16, 2)
        m = rex.MoeLayerMap.from_spec("2-3,5", arr)
        self.assertEqual((m.moe_layers, m.dense_layers), ([2, 3, 5], [0, 1, 4]))
        self.assertEqual(rex.MoeLayerMap.from_spec("all", arr).moe_layers, list(range(6)))
        for spec, fragment in (("6", "6 layers"), ("2-1", "bad range"), ("a", "not a layer"),
                               ("0,,1", "empty item")):
            with self.assertRaises(rex.RoutedExpertsError) as cm:
                rex.MoeLayerMap.from_spec(spec, arr)
            self.assertIn(fragment, str(cm.exception))
        for layers in ([1, 2, 3, 5], [0], [0, 2, 4, 6], list(range(1, 27))):
            text = rex.format_layer_list(layers)
            self.assertEqual(rex.parse_layer_list(text, 64), layers, text)
        self.assertEqual(rex.format_layer_list(range(1, 27)), "1-26")

    def test_auto_needs_top_k_two(self):
        with self.assertRaises(rex.RoutedExpertsError) as cm:
            rex.MoeLayerMap.from_spec("auto", routing(2, 2, 8, 1))
        self.assertIn("--moe-layers", str(cm.exception))

    def test_select_checks_later_responses(self):
        first = np.zeros((3, 3, 2), dtype=np.int64)
        first[:, 1:, :] = routing(3, 2, 8, 2)
        m = rex.MoeLayerMap.from_spec("auto", first)
        later = routing(3, 3, 8, 2, seed=1)    # layer 0 now has routed ids
        with self.assertRaises(rex.RoutedExpertsError) as cm:
            m.select(later)
        self.assertIn("layer 0 was taken as dense", str(cm.exception))
        with self.assertRaises(rex.RoutedExpertsError) as cm:
            m.select(np.zeros((3, 4, 2), dtype=np.int64))
        self.assertIn("earlier responses had 3 x 2", str(cm.exception))


class TraceTest(unittest.TestCase):
    def setUp(self):
        self.g = eldr_trace.Geometry(layers=3, experts=16, top_k=2)
        self.reqs = [eldr_trace.TraceRequest("a", "law", 4, 2, routing(6, 3, 16, 2, seed=1)),
                     eldr_trace.TraceRequest("b", "", 1, 0, routing(1, 3, 16, 2, seed=2),
                                             arrival_s=1.5)]

    def test_round_trip_and_layout(self):
        data = eldr_trace.encode_trace("m", self.g, "src", self.reqs)
        raw = msgpack.unpackb(data, raw=False)
        self.assertEqual(raw["format"], "eldr-trace")
        self.assertEqual(raw["version"], 1)
        self.assertEqual(raw["model"], {"name": "m", "layers": 3, "experts": 16, "top_k": 2})
        self.assertIsInstance(raw["requests"][0]["experts"], bytes)   # a bin, not a str
        self.assertNotIn("arrival_s", raw["requests"][0])
        # token-major: byte (t * L + l) * k + r
        ids = self.reqs[0].experts
        b = raw["requests"][0]["experts"]
        self.assertEqual(b[(4 * 3 + 2) * 2 + 1], ids[4, 2, 1])
        t = eldr_trace.decode_trace(data)
        self.assertEqual((t.model_name, t.geometry, t.source), ("m", self.g, "src"))
        self.assertEqual([r.id for r in t.requests], ["a", "b"])
        self.assertEqual(t.requests[1].arrival_s, 1.5)
        for got, want in zip(t.requests, self.reqs):
            np.testing.assert_array_equal(got.ids(), want.ids())

    def test_validation_names_the_fault(self):
        def fails(req, fragment, geometry=None):
            with self.assertRaises(eldr_trace.TraceError) as cm:
                eldr_trace.encode_trace("m", geometry or self.g, "", [self.reqs[0], req])
            self.assertIn(fragment, str(cm.exception))

        bad = routing(6, 3, 16, 2, seed=3)
        bad[5, 1, 1] = bad[5, 1, 0]
        fails(eldr_trace.TraceRequest("c", "", 4, 2, bad),
              "token 5 (output token 1), layer 1: expert id %d chosen twice" % bad[5, 1, 0])
        bad = routing(6, 3, 16, 2, seed=3)
        bad[0, 2, 0] = 16
        fails(eldr_trace.TraceRequest("c", "", 4, 2, bad), "expert id 16 is outside 0..15")
        fails(eldr_trace.TraceRequest("c", "", 4, 1, routing(6, 3, 16, 2)),
              "experts has 36 ids, expected")
        fails(eldr_trace.TraceRequest("c", "", 0, 6, routing(6, 3, 16, 2)),
              "prompt_tokens must be >= 1")
        fails(eldr_trace.TraceRequest("a", "", 4, 2, routing(6, 3, 16, 2)), "id also used")
        fails(eldr_trace.TraceRequest("c", "", 4, 2, routing(6, 3, 16, 2), arrival_s=-1),
              "arrival_s")

    def test_version_2_for_more_than_256_experts(self):
        g = eldr_trace.Geometry(layers=2, experts=384, top_k=3)
        ids = routing(3, 2, 384, 3, seed=4)
        ids[0, 0] = [383, 256, 1]
        data = eldr_trace.encode_trace("kimi", g, "", [eldr_trace.TraceRequest("a", "", 2, 1,
                                                                              ids)])
        raw = msgpack.unpackb(data, raw=False)
        self.assertEqual(raw["version"], 2)
        b = raw["requests"][0]["experts"]
        self.assertEqual(len(b), 2 * ids.size)
        self.assertEqual(b[:6], bytes([383 & 255, 383 >> 8, 0, 1, 1, 0]))   # little-endian
        t = eldr_trace.decode_trace(data)
        np.testing.assert_array_equal(t.requests[0].ids(), ids.reshape(-1))
        # E <= 256 stays version 1, byte for byte what older readers take
        small = eldr_trace.encode_trace("m", self.g, "", self.reqs)
        self.assertEqual(msgpack.unpackb(small, raw=False)["version"], 1)
        for bad, fragment in (({"version": 1}, "version 1 file"),
                              ({"experts_bin": b[:-1]}, "odd length")):
            d = msgpack.unpackb(data, raw=False)
            if "version" in bad:
                d["version"] = bad["version"]
            else:
                d["requests"][0]["experts"] = bad["experts_bin"]
            with self.assertRaises(eldr_trace.TraceError) as cm:
                eldr_trace.decode_trace(msgpack.packb(d, use_bin_type=True))
            self.assertIn(fragment, str(cm.exception))
        with self.assertRaises(eldr_trace.TraceError) as cm:
            eldr_trace.encode_trace("m", eldr_trace.Geometry(1, 4097, 2), "", [])
        self.assertIn("at most 4096 experts", str(cm.exception))
        with self.assertRaises(eldr_trace.TraceError) as cm:
            eldr_trace.encode_trace("m", eldr_trace.Geometry(512, 4096, 2), "", [])
        self.assertIn("layers * experts", str(cm.exception))

    def test_decode_rejects(self):
        good = msgpack.unpackb(eldr_trace.encode_trace("m", self.g, "", self.reqs), raw=False)
        for mutate, fragment in ((lambda d: d.update(version=3), "unsupported version 3"),
                                 (lambda d: d.update(format="x"), "format"),
                                 (lambda d: d["model"].update(top_k=17), "top_k"),
                                 (lambda d: d["requests"][0].update(experts="s"), "bin")):
            d = msgpack.unpackb(msgpack.packb(good, use_bin_type=True), raw=False)
            mutate(d)
            with self.assertRaises(eldr_trace.TraceError) as cm:
                eldr_trace.decode_trace(msgpack.packb(d, use_bin_type=True), "f")
            self.assertIn(fragment, str(cm.exception))


class JournalCodecTest(unittest.TestCase):
    def test_round_trip_and_every_torn_tail(self):
        objs = [{"kind": "header", "model": "m"}, {"kind": "request", "id": "a", "x": b"\0" * 40},
                {"kind": "request", "id": "b", "x": b"\1" * 40}]
        data = jr.MAGIC + b"".join(jr.encode_frame(o) for o in objs)
        got, good, problem = jr.decode_frames(data)
        self.assertEqual((got, good, problem), (objs, len(data), ""))
        last_start = len(data) - len(jr.encode_frame(objs[2]))
        for cut in range(last_start + 1, len(data)):
            got, good, problem = jr.decode_frames(data[:cut])
            self.assertEqual(got, objs[:2])
            self.assertEqual(good, last_start)
            self.assertIn("torn", problem)

    def test_bad_checksum_and_magic(self):
        data = bytearray(jr.MAGIC + jr.encode_frame({"kind": "header"}) +
                         jr.encode_frame({"kind": "request", "id": "a"}))
        data[-1] ^= 0xFF
        got, good, problem = jr.decode_frames(bytes(data))
        self.assertEqual(len(got), 1)
        self.assertIn("bad checksum", problem)
        with self.assertRaises(jr.JournalError):
            jr.decode_frames(b"something else")

    def test_header_and_resume_plan(self):
        with self.assertRaises(jr.JournalError) as cm:
            jr.check_header({"model": "m", "max_tokens": 8}, {"model": "m", "max_tokens": 16})
        self.assertIn("max_tokens: journal 8, now 16", str(cm.exception))
        jr.check_header({"kind": "header", "model": "m"}, {"model": "m"})
        prompts, _ = parse_prompts([json.dumps({"prompt": "p%d" % i}) for i in range(5)], "f")
        done = {prompts[1].id: {"digest": prompts[1].digest},
                prompts[3].id: {"digest": prompts[3].digest}}
        self.assertEqual([p.id for p in jr.plan_resume(prompts, done)],
                         ["line-1", "line-3", "line-5"])
        with self.assertRaises(jr.JournalError) as cm:
            jr.plan_resume(prompts, {"gone": {"digest": "x"}})
        self.assertIn("'gone', which is no longer", str(cm.exception))
        with self.assertRaises(jr.JournalError) as cm:
            jr.plan_resume(prompts, {"line-2": {"digest": "other"}})
        self.assertIn("changed since it was recorded", str(cm.exception))


def response(arr, prompt_tokens, completion_tokens, chat=False):
    choice = {"index": 0, "finish_reason": "length", "routed_experts":
              npy_b64(arr.astype(np.uint8)) if arr is not None else None}
    choice["message" if chat else "text"] = {"role": "assistant", "content": "x"} if chat else "x"
    return {"choices": [choice], "usage": {"prompt_tokens": prompt_tokens,
                                           "completion_tokens": completion_tokens}}


class MemoryJournal:
    def __init__(self):
        self.layers, self.requests = None, {}

    def set_layers(self, record):
        self.layers = dict(record, kind="layers")

    def append_request(self, record):
        assert record["id"] not in self.requests
        self.requests[record["id"]] = dict(record, kind="request")


class ResponseTest(unittest.TestCase):
    def test_rows_are_prompt_plus_all_but_the_last_generated_token(self):
        arr = routing(7, 2, 8, 2)
        got, p, o = recorder.routed_experts_of(response(arr, 4, 4))
        self.assertEqual((p, o), (4, 3))
        np.testing.assert_array_equal(got, arr)

    def test_no_routed_experts_is_fatal_and_says_how_to_fix(self):
        for doc in (response(None, 3, 2), {"choices": [{"text": ""}], "usage": {}}):
            with self.assertRaises(recorder.Fatal) as cm:
                recorder.routed_experts_of(doc)
            self.assertIn("--enable-return-routed-experts", str(cm.exception))

    def test_malformed_responses_fail_the_prompt(self):
        arr = routing(3, 2, 8, 2)
        for doc, fragment in ((response(arr, 4, 1), "3 token rows"),
                              (response(arr, 1, 1), "3 token rows"),
                              ({"choices": []}, "no choices"),
                              (dict(response(arr, 2, 2), usage=None), "no usage"),
                              (response(arr, 0, 4), "prompt_tokens is 0"),
                              ([], "not a JSON object")):
            with self.assertRaises(recorder.PromptFailed) as cm:
                recorder.routed_experts_of(doc)
            self.assertIn(fragment, str(cm.exception))

    def test_recording_keeps_moe_layers_and_checks_them(self):
        prompts, _ = parse_prompts(['{"prompt": "a", "t": "x"}', '{"prompt": "b"}',
                                    '{"prompt": "c"}', '{"prompt": "d"}'], "f", "t")
        full = np.zeros((5, 3, 2), dtype=np.int64)
        full[:, 1:, :] = routing(5, 2, 300, 2)
        j = MemoryJournal()
        rec = recorder.Recording(j, "auto", None)
        rec.accept(prompts[0], response(full % 256, 3, 3))
        self.assertEqual(j.layers["moe_layers"], [1, 2])
        r = j.requests["line-1"]
        self.assertEqual((r["prompt_tokens"], r["output_tokens"], r["label"], r["width"]),
                         (3, 2, "x", 1))
        np.testing.assert_array_equal(np.frombuffer(r["experts"], np.uint8).reshape(5, 2, 2),
                                      (full % 256)[:, 1:, :])
        wide = full.copy()
        wide[0, 1, :] = [299, 3]
        d = response(None, 3, 3)
        d["choices"][0]["routed_experts"] = npy_b64(wide.astype(np.uint16))
        rec.accept(prompts[1], d)
        self.assertEqual(j.requests["line-2"]["width"], 2)
        self.assertEqual(j.requests["line-2"]["max_id"], int(wide[:, 1:, :].max()))
        dup = full % 256
        dup[2, 2, 1] = dup[2, 2, 0]
        with self.assertRaises(recorder.PromptFailed) as cm:
            rec.accept(prompts[2], response(dup, 3, 3))
        self.assertIn("chosen twice", str(cm.exception))
        bounded = recorder.Recording(j, "auto", 200)
        with self.assertRaises(recorder.Fatal) as cm:
            bounded.accept(prompts[3], d)
        self.assertIn("but --experts is 200", str(cm.exception))


class FakeStream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


class ProgressTest(unittest.TestCase):
    def test_lines_when_not_a_terminal(self):
        s = FakeStream(False)
        p = Progress(20, stream=s, clock=lambda: 0.0)
        for _ in range(20):
            p.advance()
        lines = s.getvalue().splitlines()
        self.assertEqual(len(lines), 10)          # one per tenth
        self.assertNotIn("\r", s.getvalue())
        self.assertIn("20/20 prompts 100.0%", lines[-1])

    def test_bar_redrawn_at_most_every_interval(self):
        now = [0.0]
        s = FakeStream(True)
        p = Progress(100, done=40, stream=s, clock=lambda: now[0], interval=0.5)
        p.draw(force=True)
        for _ in range(10):
            p.advance()                    # same instant: no redraw
        self.assertEqual(s.getvalue().count("\r"), 1)
        now[0] = 1.0
        p.advance()                        # 11 fresh prompts in 1 s
        self.assertEqual(s.getvalue().count("\r"), 2)
        self.assertIn("51/100 prompts", s.getvalue())
        self.assertIn("11.00/s", s.getvalue())
        p.message("note")
        p.finish()
        self.assertTrue(s.getvalue().endswith("\n"))


if __name__ == "__main__":
    unittest.main()
