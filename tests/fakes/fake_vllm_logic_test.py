#!/usr/bin/python3
"""Unit tests of the fake vLLM's pure logic (no sockets): the cost model against the C++ one,
the tokenizer and prompt -> trace mapping, the routed-experts encoding, sha256_cbor block hashes,
and KV-event bytes against vLLM's golden payloads. Run: /usr/bin/python3 fake_vllm_logic_test.py
"""
import base64
import hashlib
import io
import json
import os
import re
import sys
import unittest

import msgpack
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
import fake_vllm as fv  # noqa: E402

REFERENCE = os.path.join(ROOT, "..", "shared", "reference", "vllm-kv-vectors")


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def small_trace():
    """Two requests, 2 layers, 4 experts, top-2; ids chosen so positions are recognisable."""
    def ids(tokens, base):
        return bytes((base + t + l + r) % 4 for t in range(tokens) for l in range(2)
                     for r in range(2))
    reqs = [{"id": "a", "label": "", "prompt_tokens": 3, "output_tokens": 2, "experts": ids(5, 0)},
            {"id": "b", "label": "", "prompt_tokens": 2, "output_tokens": 0, "experts": ids(2, 1)}]
    # make the top-2 ids distinct per (token, layer): replace with fixed pairs
    for r in reqs:
        n = r["prompt_tokens"] + r["output_tokens"]
        r["experts"] = bytes(v for t in range(n) for l in range(2)
                             for v in ((t + l) % 4, (t + l + 1) % 4))
    return fv.Trace.from_map({"format": "eldr-trace", "version": 1,
                              "model": {"name": "t", "layers": 2, "experts": 4, "top_k": 2},
                              "source": "test", "requests": reqs})


class CostModel(unittest.TestCase):
    def cxx_defaults(self, header, names):
        text = read(os.path.join(ROOT, header))
        out = {}
        for n in names:
            m = re.search(r"double %s = ([0-9.]+);" % n, text)
            self.assertIsNotNone(m, "%s not found in %s" % (n, header))
            out[n] = float(m.group(1))
        return out

    def test_coefficients_are_the_cxx_defaults(self):
        # One formula, two languages: the fake must time steps as core/cost_model.hpp does.
        self.assertEqual(self.cxx_defaults("core/cost_model.hpp", fv.DECODE_COST), fv.DECODE_COST)
        self.assertEqual(self.cxx_defaults("core/sim/simulator.hpp", fv.PREFILL_COST),
                         fv.PREFILL_COST)

    def test_formula_matches_the_cxx_formula_and_its_documented_values(self):
        text = read(os.path.join(ROOT, "core", "cost_model.cpp"))
        body = text[text.index("decode_cost_model::step_latency_ms"):]
        body = body[:body.index("}") + 1]
        for term in ("base_ms", "per_distinct_expert_ms * static_cast<double>(batch.distinct_",
                     "per_sequence_ms * static_cast<double>(batch.sequences)",
                     "per_context_kilotoken_ms * (static_cast<double>(batch.context_tokens) / "
                     "1000.0)"):
            self.assertIn(term, body.replace("\n", " ").replace("  ", " ").replace(
                "  ", " ").replace("( ", "("))
        # cost_model.hpp: "all 48 * 128 experts cost 21.5 ms", "24 mixed requests (75 distinct
        # per layer) 12.6 ms".
        self.assertAlmostEqual(fv.decode_step_ms(0, 48 * 128, 0) - 6.5, 21.504, places=9)
        self.assertAlmostEqual(fv.decode_step_ms(0, 48 * 75, 0) - 6.5, 12.6, places=9)
        self.assertAlmostEqual(fv.decode_step_ms(24, 100, 5000),
                               6.5 + 0.35 + 0.24 + 0.02, places=9)

    def test_distinct_experts_counts_per_layer(self):
        step = np.array([[[0, 1], [2, 3]], [[1, 2], [2, 3]]], dtype=np.uint8)
        self.assertEqual(fv.distinct_experts(step), 3 + 2)
        self.assertEqual(fv.distinct_experts(step[:0]), 0)


class Mapping(unittest.TestCase):
    def setUp(self):
        self.t = small_trace()

    def test_tokenizer_is_crc32_of_whitespace_words(self):
        words, ids = fv.tokenize("  hello\tworld \n")
        self.assertEqual(words, ["hello", "world"])
        self.assertEqual(ids[0], 0x3610A686 & 0x7FFFFFFF)  # crc32(b"hello")

    def test_req_prefix_names_the_trace_request(self):
        w, ids = fv.tokenize("req:b x y")
        self.assertEqual(fv.pick_request(self.t, w, ids), 1)
        with self.assertRaises(ValueError):
            fv.pick_request(self.t, *fv.tokenize("req:zzz x"))

    def test_first_token_hash_picks_the_request_otherwise(self):
        w, ids = fv.tokenize("hello there")
        self.assertEqual(fv.pick_request(self.t, w, ids), ids[0] % 2)
        self.assertEqual(fv.pick_request(self.t, [], [7, 1]), 1)

    def test_prompt_ids_wrap_and_shared_prefixes_agree(self):
        got = fv.prompt_expert_ids(self.t, 0, 7)
        want = self.t.requests[0][3][[0, 1, 2, 0, 1, 2, 0]]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(fv.prompt_expert_ids(self.t, 0, 4),
                                      fv.prompt_expert_ids(self.t, 0, 9)[:4])

    def test_output_ids_come_from_output_tokens(self):
        np.testing.assert_array_equal(fv.output_expert_ids(self.t, 0, 3),
                                      self.t.requests[0][3][3 + 1])
        np.testing.assert_array_equal(fv.output_expert_ids(self.t, 1, 3),
                                      self.t.requests[1][3][1])  # no outputs: prompt wraps

    def test_bad_traces_are_refused_with_a_reason(self):
        for bad in ({}, {"format": "x"}, {"format": "eldr-trace", "version": 2}):
            with self.assertRaises(fv.TraceError):
                fv.Trace.from_map(bad)


class RoutedExperts(unittest.TestCase):
    def test_base64_npy_uint8_with_dense_layers_zero(self):
        rows = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2)
        s = fv.encode_routed_experts(rows, dense_layers=1)
        arr = np.load(io.BytesIO(base64.b64decode(s)), allow_pickle=False)
        self.assertEqual(arr.dtype, np.uint8)
        self.assertEqual(arr.shape, (3, 3, 2))
        self.assertTrue((arr[:, 0, :] == 0).all())
        np.testing.assert_array_equal(arr[:, 1:, :], rows)


class BlockHashes(unittest.TestCase):
    def test_cbor_subset_matches_rfc8949_examples(self):
        # RFC 8949 Appendix A.
        cases = [(0, "00"), (23, "17"), (24, "1818"), (100, "1864"), (1000, "1903e8"),
                 (1000000, "1a000f4240"), (1000000000000, "1b000000e8d4a51000"),
                 (18446744073709551615, "1bffffffffffffffff"), (-1, "20"), (None, "f6"),
                 (b"", "40"), (b"\x01\x02\x03\x04", "4401020304"), ("a", "6161"),
                 ("IETF", "6449455446"), ([], "80"), ((1, 2, 3), "83010203"),
                 ([1, [2, 3], [4, 5]], "8301820203820405"),
                 (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819")]
        for value, hexs in cases:
            self.assertEqual(fv.cbor_encode(value).hex(), hexs, value)

    def test_agrees_with_cbor2_when_installed(self):
        try:
            import cbor2
        except ImportError:
            self.skipTest("python3-cbor2 not installed (Debian has it: apt install python3-cbor2)")
        x = (b"\x07" * 32, tuple(range(0, 70000, 4111)), None)
        self.assertEqual(fv.cbor_encode(x), cbor2.dumps(x, canonical=True))

    def test_chain_follows_vllm_hash_block_tokens(self):
        root = fv.none_hash("0")
        self.assertEqual(root, hashlib.sha256(b"\x61\x30").digest())  # sha256_cbor("0")
        toks = list(range(40))
        hs = fv.block_hashes(toks, 16, root)
        self.assertEqual(len(hs), 2)  # only full blocks
        b0 = hashlib.sha256(b"\x83\x58\x20" + root + b"\x90" +
                            fv.cbor_encode(tuple(range(16)))[1:] + b"\xf6").digest()
        self.assertEqual(hs[0], b0)
        self.assertEqual(hs[1], fv.sha256_cbor((hs[0], tuple(range(16, 32)), None)))
        self.assertEqual(fv.external_hash(hs[1]), int.from_bytes(hs[1][-8:], "big"))


class KvEvents(unittest.TestCase):
    def golden(self, name):
        path = os.path.join(REFERENCE, name)
        if not os.path.exists(path):
            self.skipTest("golden vectors not found at %s" % REFERENCE)
        meta = json.loads(read(os.path.join(REFERENCE, "vectors.json")))
        return read(path, "rb"), next(v for v in meta["vectors"] if v["file"] == name)

    def test_block_stored_is_byte_identical_to_vllms_golden_payload(self):
        data, meta = self.golden("latest-g_stored_realistic.msgpack")
        e = meta["expected"]
        ev = e["events"][0]
        ours = fv.encode_kv_batch(e["ts"], [fv.block_stored_event(
            [int(h) for h in ev["block_hashes"]], ev["parent_block_hash"], ev["token_ids"],
            ev["block_size"], ev["group_idx"], ev["kv_cache_spec_kind"])],
            e["data_parallel_rank"])
        self.assertEqual(ours, data)

    def test_block_removed_is_byte_identical_to_vllms_golden_payload(self):
        data, meta = self.golden("latest-d_removed.msgpack")
        e = meta["expected"]
        ev = e["events"][0]
        if ev.get("group_idx") is None:
            event = {"type": "BlockRemoved", "block_hashes": [int(h) for h in ev["block_hashes"]],
                     "medium": ev["medium"]}
        else:
            event = fv.block_removed_event([int(h) for h in ev["block_hashes"]], ev["group_idx"])
        self.assertEqual(fv.encode_kv_batch(e["ts"], [event], e["data_parallel_rank"]), data)

    def test_cache_publishes_stored_then_removed_on_eviction(self):
        class Sink:
            def __init__(self):
                self.batches = []

            def publish(self, events):
                self.batches.append(events)
        sink = Sink()
        kv = fv.KvCache(num_blocks=4, block_size=2, root_hash=fv.none_hash("1"), publisher=sink)
        a, _ = kv.allocate([1, 2, 3, 4, 5], 6)
        kv.prefill_done(a)
        (stored,) = sink.batches[0]
        want = fv.block_hashes([1, 2, 3, 4], 2, kv.root)
        self.assertEqual(stored["block_hashes"], [fv.external_hash(h) for h in want])
        self.assertIsNone(stored["parent_block_hash"])
        kv.release(a)
        b, hit = kv.allocate([1, 2, 9, 9], 4)  # shares the first block: a prefix-cache hit
        self.assertEqual(hit, 2)
        kv.prefill_done(b)
        self.assertEqual(sink.batches[1][0]["parent_block_hash"], fv.external_hash(want[0]))
        kv.release(b)
        c, _ = kv.allocate([7, 7, 7, 7, 7, 7, 7, 7], 8)  # needs all 4 blocks: evicts the cached
        removed = [e for batch in sink.batches for e in batch if e["type"] == "BlockRemoved"]
        self.assertEqual(sorted(h for e in removed for h in e["block_hashes"]),
                         sorted([fv.external_hash(want[0]), fv.external_hash(want[1]),
                                 sink.batches[1][0]["block_hashes"][0]]))
        self.assertEqual(kv.evictions, 3)
        self.assertIsNone(kv.allocate([5], 2))  # full: nothing more fits while c holds it
        kv.release(c)
        self.assertEqual(kv.usage(), 0.0)


if __name__ == "__main__":
    unittest.main()
