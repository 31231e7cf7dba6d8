#!/usr/bin/python3
"""Unit tests of eldr-proxy's pure logic (tools/eldr-proxy): the routed-experts -> counts
conversion against counts computed here, independently, from the REAL trace's expert ids; the
block hashes against vLLM's sha256_cbor chain written out byte by byte (RFC 8949) and against the
fake vLLM's own CBOR encoder; the command-line validation. No sockets, no processes.

usage: eldr_proxy_units_test.py     exit 0 when every test passes. The real-trace tests read
../shared/data (or $ELDR_SHARED_DATA) and say SKIP when it is missing; the others still run.
"""
import base64
import collections
import hashlib
import io
import os
import random
import struct
import sys

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools", "eldr-proxy"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "py"))
import eldr_testing  # noqa: E402
import eldr_proxy_hashes as block_hashes  # noqa: E402
import eldr_proxy  # noqa: E402
import eldr_trace  # noqa: E402
import eldr_proxy_counts as rex  # noqa: E402


check = eldr_testing.check
Skip = eldr_testing.Skip


def shared_data():
    return eldr_testing.shared_data(ROOT)


def read_trace(path):
    """(L, E, k, [(prompt_tokens, ids (P+O, L, k))]) read with eldr_trace."""
    t = eldr_trace.read_trace(path)
    g = t.geometry
    return g.layers, g.experts, g.top_k, [
        (r.prompt_tokens, r.ids().reshape(r.prompt_tokens + r.output_tokens, g.layers, g.top_k))
        for r in t.requests]


def vllm_routed_experts(rows, dense_layers, dtype=np.uint8):
    """What vLLM returns: base64 of a .npy (tokens, dense + L, k), dense layers zero."""
    rows = np.asarray(rows)
    pad = np.zeros((rows.shape[0], dense_layers, rows.shape[2]), dtype=rows.dtype)
    buf = io.BytesIO()
    np.save(buf, np.concatenate([pad, rows], axis=1).astype(dtype), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def expected_blocks(ids, block_size):
    """Per block: (tokens, per layer {expert: count}), counted with plain Python loops."""
    out = []
    for start in range(0, len(ids), block_size):
        rows = ids[start:start + block_size]
        per_layer = []
        for l in range(ids.shape[1]):
            per_layer.append(collections.Counter(int(e) for t in rows for e in t[l]))
        out.append((len(rows), per_layer))
    return out


def decoded_blocks(msg, layers):
    """The counts message's blocks back as (hash, parent, tokens, per layer {expert: count})."""
    out = []
    for h, parent, tokens, sizes, ids, counts in msg["blocks"]:
        if msg["v"] == 2:  # little-endian uint16 ids (docs/protocol.md section 2)
            check(len(ids) % 2 == 0, "version 2 ids: an odd number of bytes")
            ids = struct.unpack("<%dH" % (len(ids) // 2), ids)
        check(len(sizes) == layers, "layer sizes: %r" % sizes)
        per_layer, pos = [], 0
        for n in sizes:
            layer_ids = list(ids[pos:pos + n])
            check(layer_ids == sorted(set(layer_ids)), "ids not strictly increasing")
            per_layer.append(dict(zip(layer_ids, counts[pos:pos + n])))
            pos += n
        check(pos == len(ids) == len(counts), "sizes do not cover the ids")
        out.append((h, parent, tokens, per_layer))
    return out


def builder(L, E, k, moe_first, bs):
    return rex.CountsBuilder(L, E, k, "%d-%d" % (moe_first, moe_first + L - 1), bs)


decode = rex.CountsBuilder.decode_numpy


def check_conversion(ids_moe, dense, E, k, bs, dtype=np.uint8):
    """Runs the proxy's conversion on vLLM's encoding of ids_moe and compares every block."""
    L = ids_moe.shape[1]
    b = builder(L, E, k, dense, bs)
    arr = decode(vllm_routed_experts(ids_moe, dense, dtype))
    got_ids = b.prompt_ids(arr, ids_moe.shape[0])
    n_blocks = -(-ids_moe.shape[0] // bs)
    hashes = [hashlib.sha256(b"%d" % i).digest() for i in range(n_blocks)]
    msg = b.message(got_ids, hashes)
    check(msg["v"] == (1 if E <= 256 else 2) and msg["model"] == [L, E, k],
          "header: v %r, model %r" % (msg["v"], msg["model"]))
    want = expected_blocks(ids_moe, bs)
    got = decoded_blocks(msg, L)
    check(len(got) == len(want), "%d blocks, expected %d" % (len(got), len(want)))
    for i, ((h, parent, tokens, per_layer), (w_tokens, w_layers)) in enumerate(zip(got, want)):
        check(h == int.from_bytes(hashes[i][-8:], "big"), "block %d hash" % i)
        check(parent == (None if i == 0 else int.from_bytes(hashes[i - 1][-8:], "big")),
              "block %d parent" % i)
        check(tokens == w_tokens, "block %d: %d tokens, expected %d" % (i, tokens, w_tokens))
        for l in range(L):
            check(per_layer[l] == dict(w_layers[l]), "block %d layer %d: %r != %r"
                  % (i, l, per_layer[l], dict(w_layers[l])))
            check(sum(per_layer[l].values()) == tokens * k, "block %d layer %d sum" % (i, l))


# ---------------------------------------------------------------------------------------------
# Conversion


def test_conversion_matches_the_real_esft_trace():
    L, E, k, reqs = read_trace(os.path.join(shared_data(), "esft-deepseek-v2-lite.eldrtrace"))
    check((L, E, k) == (26, 64, 6), "ESFT geometry: %r" % ((L, E, k),))
    for P, ids in reqs[:12] + reqs[-4:]:
        # DeepSeek-V2-Lite: vLLM layer 0 is dense, the 26 MoE layers are vLLM layers 1..26.
        check_conversion(ids[:P], dense=1, E=E, k=k, bs=16)


def test_conversion_matches_the_real_granite_trace():
    L, E, k, reqs = read_trace(os.path.join(shared_data(), "granite-3.0-1b-a400m.eldrtrace"))
    for P, ids in reqs:
        for bs in (16, 7, 1):
            check_conversion(ids[:P], dense=0, E=E, k=k, bs=bs)


def random_ids(rng, T, L, E, k):
    return np.argsort(rng.random((T, L, E)), axis=2)[:, :, :k].astype(np.int64)


def test_conversion_edges():
    rng = np.random.default_rng(7)
    for T, L, E, k, bs, dense in ((1, 1, 1, 1, 16, 0), (16, 3, 8, 8, 16, 2), (17, 2, 256, 3, 16, 0),
                                  (255, 2, 32, 4, 255, 1), (300, 4, 64, 6, 255, 0),
                                  (40, 5, 16, 2, 1, 3)):
        ids = random_ids(rng, T, L, E, k)
        check_conversion(ids, dense, E, k, bs)
    ids = random_ids(rng, 50, 3, 200, 4)
    for dtype in (np.uint16, np.int32):  # vLLM's other dtypes
        check_conversion(ids, 1, 200, 4, 16, dtype)


def test_conversion_of_wide_models():
    """Kimi K2 (384 experts) and Qwen3-Next (512): vLLM sends uint16 ids, eldr gets version 2
    (two bytes per id); a block's slice of the ids must cover whole ids, not bytes."""
    rng = np.random.default_rng(11)
    for T, L, E, k, bs, dense in ((40, 3, 384, 8, 16, 1), (33, 4, 512, 10, 16, 0),
                                  (5, 2, 4096, 2, 2, 0)):
        ids = random_ids(rng, T, L, E, k)
        check_conversion(ids, dense, E, k, bs, np.uint16)


def test_older_json_lists_are_read():
    rng = np.random.default_rng(8)
    ids = random_ids(rng, 20, 3, 16, 2)
    as_lists = decode(ids.tolist())
    check(np.array_equal(as_lists, ids), "nested lists decode to the same array")


def expect_counts_error(reason, fn):
    try:
        fn()
    except rex.CountsError as e:
        check(e.reason == reason, "reason %r, expected %r (%s)" % (e.reason, reason, e))
        return str(e)
    raise AssertionError("no CountsError(%s)" % reason)


def test_bad_routed_experts_are_refused_with_a_reason():
    rng = np.random.default_rng(9)
    ids = random_ids(rng, 20, 3, 16, 2)
    b = builder(3, 16, 2, 1, 16)
    expect_counts_error("absent", lambda: decode(None))
    expect_counts_error("encoding", lambda: decode("not base64!"))
    expect_counts_error("encoding", lambda: decode(
        base64.b64encode(b"\x93NUMPY garbage").decode()))
    expect_counts_error("encoding", lambda: decode(7))
    expect_counts_error("encoding", lambda: decode([[1, 2], [3]]))
    # A pickled object array never reaches pickle.
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    expect_counts_error("encoding", lambda: decode(
        base64.b64encode(buf.getvalue()).decode()))
    floats = io.BytesIO()
    np.save(floats, np.zeros((2, 3, 2), dtype=np.float32))
    expect_counts_error("encoding", lambda: decode(
        base64.b64encode(floats.getvalue()).decode()))
    expect_counts_error("encoding", lambda: decode([[1, 2], [3, 4]]))
    arr = decode(vllm_routed_experts(ids, 1))
    expect_counts_error("tokens", lambda: b.prompt_ids(arr, 21))
    expect_counts_error("top_k", lambda: builder(3, 16, 3, 1, 16).prompt_ids(arr, 20))
    expect_counts_error("layers", lambda: builder(3, 16, 2, 2, 16).prompt_ids(arr, 20))
    # A dense layer taken for a MoE layer (and a MoE layer for a dense one): the layer map sees
    # routed experts where it expects zeros.
    msg = expect_counts_error("layers", lambda: builder(3, 16, 2, 0, 16).prompt_ids(arr, 20))
    check("taken as dense" in msg, "message: %s" % msg)
    # Were the map told the dense layer is all there is, its zeros repeat expert 0 in every row.
    zeros = np.zeros((20, 3, 2), dtype=np.uint8)
    msg = expect_counts_error("invalid", lambda: b.message(zeros, [b"x" * 32, b"y" * 32]))
    check("repeated ids" in msg, "message: %s" % msg)
    # Blocks of 255 tokens (rows of 2,040 picks): a repeated id is caught, not wrapped around.
    repeated = np.zeros((255, 1, 8), dtype=np.uint8)
    msg = expect_counts_error("invalid", lambda: rex.CountsBuilder(
        1, 16, 8, "0", 255).message(repeated, [b"z" * 32]))
    check("2040 times" in msg, "message: %s" % msg)
    too_big = np.array(ids)
    too_big[3, 1, 0] = 16
    expect_counts_error("invalid", lambda: b.message(too_big, [b"x" * 32, b"y" * 32]))
    # More rows than the prompt (output tokens) are cut off.
    check(b.prompt_ids(arr, 15).shape == (15, 3, 2), "rows beyond the prompt are not cut")


def test_long_prompts_are_signed_by_their_first_4096_blocks():
    rng = np.random.default_rng(10)
    b = rex.CountsBuilder(1, 4, 1, "0", 1, max_blocks=4096)
    ids = rng.integers(0, 4, size=(5000, 1, 1))
    msg = b.message(ids, [struct.pack(">Q", i) for i in range(5000)])
    check(len(msg["blocks"]) == 4096, "%d blocks" % len(msg["blocks"]))


def test_moe_layer_specs():
    rng = np.random.default_rng(12)
    ids = random_ids(rng, 30, 4, 16, 2)
    vllm = decode(vllm_routed_experts(ids, 2))  # 2 dense layers in front, 4 MoE layers
    for spec in ("2-5", "auto", "2,3,4-5"):
        b = rex.CountsBuilder(4, 16, 2, spec, 16)
        check(np.array_equal(b.prompt_ids(vllm, 30), ids), "spec %s" % spec)
        check(np.array_equal(b.prompt_ids(vllm, 30), ids), "spec %s, second response" % spec)
    check(rex.CountsBuilder(6, 16, 2, "all", 16).prompt_ids(vllm, 30).shape == (30, 6, 2), "all")
    expect_counts_error("layers", lambda: rex.CountsBuilder(5, 16, 2, "auto", 16).prompt_ids(
        vllm, 30))
    expect_counts_error("layers", lambda: rex.CountsBuilder(4, 16, 2, "all", 16).prompt_ids(
        vllm, 30))
    for spec, layers, k in (("1-25", 26, 6), ("3-1", 3, 2), ("a", 1, 2), ("1,,2", 2, 2),
                            ("auto", 4, 1)):
        try:
            rex.moe_layer_spec(spec, layers, k)
            check(False, "%r accepted" % spec)
        except ValueError:
            pass


# ---------------------------------------------------------------------------------------------
# Block hashes


def cbor_uint(n):
    """RFC 8949 major type 0, shortest form (written out here, not taken from a library)."""
    if n < 24:
        return bytes([n])
    if n < 256:
        return bytes([24, n])
    if n < 65536:
        return b"\x19" + struct.pack(">H", n)
    if n < 1 << 32:
        return b"\x1a" + struct.pack(">I", n)
    return b"\x1b" + struct.pack(">Q", n)


def test_vllm_hashes_written_out_by_hand():
    """sha256 over the canonical CBOR of (parent: bstr 32, tokens: array of uint, extra)."""
    seed = "1234"
    none_hash = hashlib.sha256(b"\x64" + seed.encode()).digest()  # text string of 4 bytes
    tokens = [5, 23, 24, 255, 256, 70000, 2**31 - 1, 0]
    bs = 4
    parent, want = none_hash, []
    for i in range(2):
        block = tokens[i * bs:(i + 1) * bs]
        enc = (b"\x83" + b"\x58\x20" + parent + bytes([0x80 | len(block)]) +
               b"".join(cbor_uint(t) for t in block) + b"\xf6")
        parent = hashlib.sha256(enc).digest()
        want.append(parent)
    got = block_hashes.BlockHasher("vllm", seed).hashes(tokens, bs)
    check(got == want, "vllm hashes differ from the hand-written CBOR")
    # With a cache_salt, block 0's extra keys are (salt,): a 1-element array of text.
    salt = "s"
    enc0 = (b"\x83\x58\x20" + none_hash + b"\x84" + b"".join(cbor_uint(t) for t in tokens[:4]) +
            b"\x81\x61s")
    salted = block_hashes.BlockHasher("vllm", seed).hashes(tokens, bs, cache_salt=salt)
    check(salted[0] == hashlib.sha256(enc0).digest(), "salted block 0")
    check(salted[1] != want[1], "the salt changes the whole chain")


def test_vllm_hashes_equal_the_fake_vllm_encoder():
    import fake_vllm  # its own CBOR encoder (no cbor2): an independent implementation
    rng = random.Random(11)
    for seed in ("0", "42", "a long seed"):
        h = block_hashes.BlockHasher("vllm", seed)
        for n in (0, 15, 16, 17, 64, 100):
            tokens = [rng.randrange(0, 2**31) for _ in range(n)]
            full = fake_vllm.block_hashes(tokens, 16, fake_vllm.none_hash(seed))
            got = h.hashes(tokens, 16)
            check(got[:len(full)] == full, "seed %r, %d tokens" % (seed, n))
            check(len(got) == -(-n // 16), "one hash per block, partial tail included")
            check([int.from_bytes(d[-8:], "big") for d in full] ==
                  [fake_vllm.external_hash(d) for d in full], "the published low 64 bits")


def test_partial_tail_and_other_sources():
    tokens = list(range(40))
    v = block_hashes.BlockHasher("vllm", "7").hashes(tokens, 16)
    v2 = block_hashes.BlockHasher("vllm", "7").hashes(tokens[:38], 16)
    check(len(v) == 3 and v[:2] == v2[:2] and v[2] != v2[2], "the tail depends on its tokens")
    p = block_hashes.BlockHasher("proxy", "7").hashes(tokens, 16)
    check(len(p) == 3 and not set(p) & set(v), "proxy hashes are never vLLM's")
    check(block_hashes.BlockHasher("proxy", "7").hashes(tokens[:32] + [9] * 8, 16)[:2] == p[:2],
          "proxy hashes share prefixes across requests")
    r1 = block_hashes.BlockHasher("request").hashes(None, 16, n_tokens=40, request_id="a")
    r2 = block_hashes.BlockHasher("request").hashes(None, 16, n_tokens=40, request_id="b")
    check(len(r1) == 3 and not set(r1) & set(r2), "request hashes are per request")
    try:
        block_hashes.BlockHasher("vllm")
        check(False, "vllm hashes without a seed")
    except ValueError:
        pass


# ---------------------------------------------------------------------------------------------
# Flags


GOOD = ["--listen", "127.0.0.1:0", "--eldr", "tcp://127.0.0.1:5700",
        "--eldr-worker", "tcp://127.0.0.1:5701", "--model", "m",
        "--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200",
        "--decode", "http://127.0.0.1:8201/", "--layers", "26", "--experts", "64",
        "--top-k", "6", "--first-moe-layer", "1"]


def with_flag(flag, value, base=GOOD):
    out = list(base)
    if flag in out:
        i = out.index(flag)
        if value is None:
            del out[i:i + 2]
        else:
            out[i + 1] = value
    elif value is not None:
        out += [flag, value]
    return out


def expect_usage(argv, flag, fragment=""):
    try:
        eldr_proxy.parse_config(argv)
    except eldr_proxy.UsageError as e:
        check(e.flag == flag, "error names %r, expected %r: %s" % (e.flag, flag, e))
        check(fragment in str(e), "%r not in %s" % (fragment, e))
        return
    raise AssertionError("accepted: %s" % " ".join(argv))


def test_good_flags():
    c = eldr_proxy.parse_config(GOOD)
    check(c.decode == ["http://127.0.0.1:8200", "http://127.0.0.1:8201"], "decode: %r" % c.decode)
    check(c.counts.moe_spec == "1-26", "moe layers: %r" % c.counts.moe_spec)
    check(c.hasher.source == "proxy", "default hash source without a seed")
    c = eldr_proxy.parse_config(GOOD + ["--hash-seed", "0", "--block-size", "32"])
    check(c.hasher.source == "vllm" and c.block_size == 32, "vllm hashes with a seed")
    c = eldr_proxy.parse_config(with_flag("--first-moe-layer", None) + ["--moe-layers", "1-26"])
    check(c.counts.moe_spec == "1-26", "--moe-layers")
    c = eldr_proxy.parse_config(with_flag("--experts", "384"))  # Kimi K2: 16-bit ids
    check(c.counts.experts == 384, "--experts 384")


def test_bad_flags_name_the_flag():
    expect_usage(with_flag("--listen", "nohost"), "--listen", "HOST:PORT")
    expect_usage(with_flag("--listen", "127.0.0.1:70000"), "--listen", "65535")
    expect_usage(with_flag("--eldr", "http://x:1"), "--eldr", "tcp://")
    expect_usage(with_flag("--eldr", "tcp://x:port"), "--eldr")
    expect_usage(with_flag("--eldr-worker", "tcp://a b:1"), "--eldr-worker")
    expect_usage(with_flag("--prefill", "ftp://x:1"), "--prefill", "http")
    expect_usage(with_flag("--prefill", "http://x:1/v1"), "--prefill", "without /v1")
    expect_usage(with_flag("--prefill", "http://x:99999"), "--prefill")
    expect_usage(with_flag("--prefill", "http://x:1?a=b"), "--prefill", "query")
    expect_usage(GOOD + ["--decode", "http://127.0.0.1:8200"], "--decode", "twice")
    expect_usage(GOOD + ["--decode", "https://127.0.0.1:8202"], "--decode", "http:// only")
    expect_usage(with_flag("--model", ""), "--model")
    expect_usage(with_flag("--model", "m" * 257), "--model")
    expect_usage(with_flag("--layers", "0"), "--layers")
    expect_usage(with_flag("--experts", "5000"), "--experts", "E <= 4096")
    expect_usage(with_flag("--top-k", "65"), "--top-k")
    expect_usage(with_flag("--top-k", "six"), "usage", "--top-k")
    expect_usage(with_flag("--first-moe-layer", "-1"), "--first-moe-layer")
    expect_usage(with_flag("--first-moe-layer", None) + ["--moe-layers", "1-25"], "--moe-layers",
                 "25 layers")
    expect_usage(with_flag("--first-moe-layer", None) + ["--moe-layers", "3-1"], "--moe-layers")
    expect_usage(GOOD + ["--moe-layers", "1-26"], "usage", "not allowed with")
    expect_usage(with_flag("--first-moe-layer", None) + ["--moe-layers", "auto", "--top-k", "1"],
                 "--moe-layers", "auto needs")
    expect_usage(GOOD + ["--block-size", "256"], "--block-size")
    expect_usage(GOOD + ["--block-hash", "vllm"], "--hash-seed", "PYTHONHASHSEED")
    expect_usage(GOOD + ["--block-hash", "md5"], "usage", "--block-hash")
    expect_usage(GOOD + ["--eldr-timeout-ms", "0"], "--eldr-timeout-ms")
    expect_usage(GOOD + ["--max-concurrent", "0"], "--max-concurrent")
    expect_usage(GOOD + ["--upstream-timeout-s", "nan"], "--upstream-timeout-s")
    expect_usage(GOOD + ["--curve-server-key", "short"], "--curve-server-key")
    expect_usage(GOOD + ["--curve-secret-key-file", "/nonexistent"], "--curve-secret-key-file")
    expect_usage(with_flag("--decode", None, with_flag("--decode", None)), "usage", "--decode")


def main():
    return eldr_testing.run_test_functions(globals())


if __name__ == "__main__":
    sys.exit(main())
