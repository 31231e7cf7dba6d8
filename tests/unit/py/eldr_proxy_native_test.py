#!/usr/bin/python3
"""Unit tests of eldr-proxy's compiled counts conversion (tools/eldr-proxy/counts_native.cpp,
loaded by eldr_proxy_native.py): its bytes equal msgpack.packb of eldr_client.counts_message with
a TopkIds (the numpy path) on random inputs of every id width and dtype, on views read in place
and on the REAL recorded traces; its decode of vLLM's base64 .npy gives eldr_routed_experts'
array, and whatever it refuses (thousands of corrupted strings among them) the numpy path
refuses with the same CountsError, or reads; bad input gets a ValueError (a CountsError in the
proxy) or a refusal with a message, never a crash; the route_request it goes into is the same
bytes; the loader and the /metrics gauge say when the library is missing. No sockets, no
processes.

usage: ELDR_COUNTS_NATIVE=path/to/libeldr_counts_native.so eldr_proxy_native_test.py
    exit 0 when every test passes; 1 when one fails or the library does not load. The
    real-trace tests read ../shared/data (or $ELDR_SHARED_DATA) and say SKIP when it is missing.
"""
import base64
import ctypes
import io
import os
import re
import sys

import msgpack
import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "cluster", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools", "eldr-proxy"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "py"))
import eldr_testing  # noqa: E402
import eldr_client as ec  # noqa: E402
import eldr_trace  # noqa: E402
import eldr_proxy_counts as rex  # noqa: E402
import eldr_proxy_hashes  # noqa: E402
import eldr_proxy_metrics  # noqa: E402
import eldr_proxy_native  # noqa: E402
import eldr_routed_experts  # noqa: E402

NATIVE = None  # set in main()


check = eldr_testing.check
Skip = eldr_testing.Skip


def shared_data():
    return eldr_testing.shared_data(ROOT)


def numpy_bytes(L, E, k, hashes, parents, ids, bs, seq=None):
    return msgpack.packb(ec.counts_message(L, E, k, ec.TopkIds(hashes, parents, ids, bs), seq),
                         use_bin_type=True)


def same_bytes(L, E, k, hashes, parents, ids, bs, seq=None, what=""):
    want = numpy_bytes(L, E, k, hashes, parents, ids, bs, seq)
    got = NATIVE.message(L, E, k, hashes, parents, ids, bs, seq)
    check(isinstance(got, ec.Packed), "%s: not a Packed" % what)
    got = got.data
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                  min(len(got), len(want)))
        raise AssertionError("%s: %d native bytes differ from %d numpy bytes at byte %d"
                             % (what, len(got), len(want), at))


def random_topk(rng, tokens, L, E, k, dtype):
    """Distinct top-k picks per token and layer, as a router makes them."""
    ids = np.argsort(rng.random((tokens, L, E), dtype=np.float32), axis=2)[:, :, :k]
    return ids.astype(dtype)


def chain(rng, n):
    """n block hashes of every kind normalize_hash takes, and their parents (the first None)."""
    kinds = [lambda: int(rng.integers(0, 1 << 63)) * 2 + 1,          # over 2^63
             lambda: -int(rng.integers(1, 1 << 62)),                  # negative int64
             lambda: rng.bytes(32),                                   # sha256 bytes
             lambda: int(rng.integers(0, 200)),                       # a fixint
             lambda: np.uint64(rng.integers(0, 1 << 62))]
    hashes = [kinds[i % len(kinds)]() for i in range(n)]
    return hashes, ([None] + hashes[:-1]) if n else []


# ---------------------------------------------------------------------------------------------
# Same bytes as the numpy path


def test_random_inputs_give_the_numpy_bytes():
    rng = np.random.default_rng(13)
    cases = [  # (L, E, k, block size, tokens, dtype)
        (48, 128, 8, 16, 4096, np.uint8),      # the benchmark geometry
        (48, 128, 8, 16, 1000, np.uint16),     # uint16 ids of a narrow model, a partial block
        (26, 64, 6, 16, 333, np.int32),        # dtypes vLLM's .npy may hold, converted first
        (4, 16, 2, 1, 40, np.int64),           # blocks of one token
        (3, 16, 8, 255, 600, np.uint8),        # 255-token blocks: rows of 2,040 picks
        (5, 256, 8, 16, 100, np.uint16),       # E = 256: still one byte per id (version 1)
        (5, 256, 8, 16, 100, np.uint8),
        (6, 384, 8, 16, 170, np.uint16),       # wide: version 2, uint16 little-endian ids
        (2, 512, 4, 7, 50, np.int32),
        (1, 4096, 1, 3, 10, np.uint16),        # the widest expert range
        (2, 8, 8, 4, 9, np.uint8),             # k = E: every expert every token
        (3, 32, 2, 16, 0, np.uint8),           # no tokens: a message of no blocks
    ]
    for L, E, k, bs, T, dtype in cases:
        ids = random_topk(rng, T, L, E, k, dtype)
        n = -(-T // bs)
        hashes, parents = chain(rng, n)
        what = "L=%d E=%d k=%d bs=%d T=%d %s" % (L, E, k, bs, T, np.dtype(dtype).name)
        same_bytes(L, E, k, hashes, parents, ids, bs, what=what)
        same_bytes(L, E, k, hashes, parents, ids, bs, seq=int(rng.integers(0, 1 << 40)),
                   what=what + " with seq")
    # Parents absent in the middle of a chain, and a view that is not C-contiguous.
    ids = random_topk(rng, 64, 6, 32, 4, np.uint8)
    view = np.transpose(np.ascontiguousarray(np.transpose(ids, (1, 0, 2))), (1, 0, 2))
    check(not view.flags.c_contiguous, "the view is contiguous")
    same_bytes(6, 32, 4, [1, 2, 3, 4], [None, 1, None, 3], view, 16, what="strided, parents")


def test_a_message_is_the_librarys_buffer_freed_with_its_last_view():
    """The message is not copied out of the library: a view that stays readable after its Packed
    is gone and while other messages are made and freed, and is freed, once, when it goes."""
    rng = np.random.default_rng(29)
    L, E, k, bs = 4, 64, 6, 16
    ids = random_topk(rng, 64, L, E, k, np.uint8)
    hashes, parents = chain(rng, 4)
    want = numpy_bytes(L, E, k, hashes, parents, ids, bs)
    freed = []
    real_free = NATIVE._lib.eldr_counts_free
    NATIVE._lib.eldr_counts_free = lambda handle: (freed.append(handle), real_free(handle))
    try:
        view = NATIVE.message(L, E, k, hashes, parents, ids, bs).data
        check(isinstance(view, memoryview) and view.format == "B" and view.contiguous,
              "the message is a contiguous byte view, got %r" % type(view))
        check(freed == [], "freed while its view lives")
        for _ in range(20):  # each made and dropped at once, its memory free for the next
            NATIVE.message(L, E, k, hashes, parents, random_topk(rng, 64, L, E, k, np.uint8), bs)
        check(len(freed) == 20, "20 dropped messages, %d freed" % len(freed))
        check(view == want, "the kept message changed while others were made")
        check(ec.encode("route_request", {"counts": ec.Packed(view)})
              == msgpack.packb({"version": ec.PROTOCOL_VERSION, "type": "route_request",
                                "counts": msgpack.unpackb(want)}, use_bin_type=True),
              "the view does not go into a message as its bytes")
        del view
        check(len(freed) == 21, "the last view gone, %d of 21 freed" % len(freed))
    finally:
        NATIVE._lib.eldr_counts_free = real_free


def trace_prompts(name):
    t = eldr_trace.read_trace(os.path.join(shared_data(), name))
    g = t.geometry
    for r in t.requests:
        ids = r.ids().reshape(r.prompt_tokens + r.output_tokens, g.layers, g.top_k)
        yield g, ids[:r.prompt_tokens]


def check_trace(name, geometry, most):
    """The first `most` prompts of a trace (at least one)."""
    rng = np.random.default_rng(len(name))
    done = 0
    for g, ids in trace_prompts(name):
        check((g.layers, g.experts, g.top_k) == geometry, "%s geometry %r" % (name, g))
        for bs in (16, 255):
            n = -(-ids.shape[0] // bs)
            hashes, parents = chain(rng, n)
            for dtype in (np.uint8, np.uint16):  # vLLM's .npy of a narrow model: uint8 or more
                same_bytes(g.layers, g.experts, g.top_k, hashes, parents, ids.astype(dtype), bs,
                           what="%s request %d bs %d %s" % (name, done, bs,
                                                            np.dtype(dtype).name))
        done += 1
        if done == most:
            break
    check(done > 0, "%s: no requests" % name)


def test_real_esft_trace_gives_the_numpy_bytes():
    check_trace("esft-deepseek-v2-lite.eldrtrace", (26, 64, 6), 60)


def test_real_granite_trace_gives_the_numpy_bytes():
    check_trace("granite-3.0-1b-a400m.eldrtrace", (24, 32, 8), 60)


def test_the_proxy_builder_with_the_library_makes_the_same_route_request():
    """CountsBuilder.message with and without the library, through route_request: the bytes
    eldr receives are the same."""
    g, ids = next(iter(trace_prompts("esft-deepseek-v2-lite.eldrtrace")))
    spec = "0-%d" % (g.layers - 1)
    b_np = rex.CountsBuilder(g.layers, g.experts, g.top_k, spec, 16)
    b_nat = rex.CountsBuilder(g.layers, g.experts, g.top_k, spec, 16, native=NATIVE)
    n = -(-ids.shape[0] // 16)
    hashes = [os.urandom(32) for _ in range(n)]
    m_np, m_nat = b_np.message(ids, hashes), b_nat.message(ids, hashes)
    check(isinstance(m_np, dict) and isinstance(m_nat, ec.Packed), "message types")
    blocks = [ec.normalize_hash(h) for h in hashes]
    for label in (None, 3):
        a = ec.route_request("r1", "m", blocks, m_np, label, explain=label is not None)
        b = ec.route_request("r1", "m", blocks, m_nat, label, explain=label is not None)
        check(a == b, "route_request bytes differ (label %r)" % label)
    check(msgpack.unpackb(b, raw=False)["counts"] == msgpack.unpackb(a, raw=False)["counts"],
          "counts decode differently")


def test_block_keys_once_give_the_same_route_request():
    """What eldr-proxy sends since it makes each block's uint64 key once per request
    (eldr_proxy_counts.block_keys: one numpy array for the counts and the route request's
    blocks) is byte for byte what it sent with a normalize_hash per block and per use, with and
    without the library; other hash shapes (ints, short bytes) go through normalize_hash."""
    g, ids = next(iter(trace_prompts("esft-deepseek-v2-lite.eldrtrace")))
    spec = "0-%d" % (g.layers - 1)
    n = -(-ids.shape[0] // 16)
    for hashes in ([os.urandom(32) for _ in range(n)], [b"\xff" * 9] + list(range(n - 1)),
                   [os.urandom(32) for _ in range(1)], []):
        keys = rex.block_keys(hashes)
        want_keys = [ec.normalize_hash(h) for h in hashes]
        check(keys.dtype == np.uint64 and keys.tolist() == want_keys, "keys differ")
        for native in (None, NATIVE):
            b = rex.CountsBuilder(g.layers, g.experts, g.top_k, spec, 16, native=native)
            sel = ids[:16 * len(hashes)]
            if not hashes:
                check(ec.route_request("r", "m", keys) == ec.route_request("r", "m", []),
                      "no blocks")
                continue
            old = b.message(sel, hashes)
            new = b.message(sel, keys)
            a = ec.route_request("r1", "m", want_keys, old, cached_blocks=1)
            c = ec.route_request("r1", "m", keys, new, cached_blocks=1)
            check(a == c, "route_request bytes differ (native %s)" % (native is not None))
    # The library's message with keys and the chain (parents None) is its message with lists.
    h = [os.urandom(32) for _ in range(n)]
    want = NATIVE.message(g.layers, g.experts, g.top_k, h, [None] + h[:-1], ids, 16)
    got = NATIVE.message(g.layers, g.experts, g.top_k, rex.block_keys(h), None, ids, 16)
    check(want.data == got.data, "keys and parents None: other bytes")
    got = NATIVE.message(g.layers, g.experts, g.top_k, rex.block_keys(h), [None] + h[:-1], ids,
                         16)
    check(want.data == got.data, "keys with explicit parents: other bytes")


# ---------------------------------------------------------------------------------------------
# Bad input: a clean error


def expect_value_error(fn, *words):
    try:
        fn()
    except ValueError as e:
        for w in words:
            check(w in str(e), "message %r lacks %r" % (str(e), w))
        return str(e)
    raise AssertionError("no ValueError")


def test_bad_input_is_refused_with_a_message():
    rng = np.random.default_rng(5)
    ids = random_topk(rng, 20, 3, 16, 2, np.uint8)
    h, p = [1, 2], [None, 1]
    m = NATIVE.message
    bad = ids.copy()
    bad[7, 1, 0] = 16
    expect_value_error(lambda: m(3, 16, 2, h, p, bad, 16), "16")
    wide = ids.astype(np.uint16)
    wide[19, 2, 1] = 4000
    expect_value_error(lambda: m(3, 16, 2, h, p, wide, 16), "4000")
    neg = ids.astype(np.int64)
    neg[0, 0, 0] = -1
    expect_value_error(lambda: m(3, 16, 2, h, p, neg, 16), "-1")
    big = ids.astype(np.int64)
    big[0, 0, 0] = 70000  # would wrap to a valid uint16 id were it narrowed unchecked
    expect_value_error(lambda: m(3, 16, 2, h, p, big, 16), "70000")
    expect_value_error(lambda: m(3, 16, 2, h, p, ids.reshape(20, 6), 16), "shape")
    expect_value_error(lambda: m(4, 16, 2, h, p, ids, 16), "shape")
    expect_value_error(lambda: m(3, 16, 3, h, p, ids, 16), "shape")
    expect_value_error(lambda: m(3, 16, 2, h, p, ids.astype(np.float32), 16), "dtype")
    expect_value_error(lambda: m(3, 16, 2, [1], [None], ids, 16), "blocks")
    expect_value_error(lambda: m(3, 16, 2, h, [None], ids, 16), "parents")
    expect_value_error(lambda: m(3, 16, 2, [1], [None], ids, 0), "block")
    expect_value_error(lambda: m(3, 16, 2, [], [], ids, 256), "block")
    expect_value_error(lambda: m(3, 16, 17, h, p, np.zeros((20, 3, 17), np.uint8), 16), "top_k")
    expect_value_error(lambda: m(3, 5000, 2, h, p, ids, 16), "experts")
    rep = np.zeros((255, 1, 8), dtype=np.uint8)
    expect_value_error(lambda: m(1, 16, 8, [1], [None], rep, 255), "repeated")
    one = np.zeros((5000, 1, 1), dtype=np.uint8)
    expect_value_error(lambda: m(1, 4, 1, list(range(5000)), [None] * 5000, one, 1), "4096")
    # Through the proxy's builder: a CountsError with the "invalid" metric label.
    b = rex.CountsBuilder(3, 16, 2, "0-2", 16, native=NATIVE)
    try:
        b.message(bad, [b"x" * 32, b"y" * 32])
        raise AssertionError("CountsBuilder took an id out of range")
    except rex.CountsError as e:
        check(e.reason == "invalid", "reason %r" % e.reason)


def test_the_c_function_checks_its_own_arguments():
    """What ctypes callers other than NativeCounts might pass: errors, not crashes."""
    lib = NATIVE._lib
    handle = ctypes.c_void_p()
    out = ctypes.c_void_p()
    n = ctypes.c_size_t(0)
    err = ctypes.create_string_buffer(64)
    ids = np.zeros((1, 1, 1), dtype=np.uint8)
    h = np.zeros(1, dtype=np.uint64)
    flag = np.zeros(1, dtype=np.uint8)

    def call(id_bytes=1, tokens=1, stride=0, hashes=h.ctypes.data, n_blocks=1,
             out_p=ctypes.byref(out)):
        return lib.eldr_counts_message(1, 4, 1, 16, ids.ctypes.data, id_bytes, tokens, stride,
                                       hashes, h.ctypes.data, flag.ctypes.data, n_blocks, 0, 0,
                                       ctypes.byref(handle), out_p, ctypes.byref(n), err, 64)

    check(call() == 0 and n.value > 0 and handle.value and out.value, "a valid call")
    lib.eldr_counts_free(handle)
    check(call(stride=5) == 0, "a stride past a single token's row is never read")
    lib.eldr_counts_free(handle)
    for what, rc in [("id_bytes 3", call(id_bytes=3)), ("null hashes", call(hashes=None)),
                     ("null out", call(out_p=None)), ("blocks", call(n_blocks=2)),
                     ("huge tokens", call(tokens=1 << 40, n_blocks=1 << 36)),
                     ("huge stride", call(tokens=2, stride=1 << 62)),
                     ("huge stride, many tokens", call(tokens=4096, stride=1 << 40,
                                                       n_blocks=256))]:
        check(rc == 1, "%s: code %d" % (what, rc))
        check(err.value, "%s: no message" % what)
    check(len(err.value) < 64, "the message is not truncated to the buffer")
    lib.eldr_counts_free(None)  # free(NULL) is a no-op


def test_views_of_a_wider_array_are_read_in_place():
    """Tokens as rows of vLLM's array with its dense layers (the layer selection's view), and
    views numpy cannot describe by a token stride (reversed, a step over tokens or ranks): the
    same bytes as the numpy path, whichever way the library is handed them."""
    rng = np.random.default_rng(17)
    for dtype in (np.uint8, np.uint16):
        moe = random_topk(rng, 70, 5, 32, 4, dtype)
        full = np.zeros((70, 7, 4), dtype=dtype)
        full[:, 1:6, :] = moe
        views = {"dense layers around": full[:, 1:6, :], "reversed tokens": moe[::-1],
                 "every other token": moe[::2], "ranks reversed": moe[:, :, ::-1],
                 "one token of a wider array": full[3:4, 1:6, :], "no tokens": full[:0, 1:6, :]}
        for what, view in views.items():
            n = -(-view.shape[0] // 16)
            hashes, parents = chain(rng, n)
            same_bytes(5, 32, 4, hashes, parents, view, 16, what="%s %s" % (what, dtype))
    # The proxy's own path: decode, select the MoE layers (a view), count.
    ids = random_topk(rng, 333, 26, 64, 6, np.uint8)
    routed = npy_b64(with_dense(ids, 1))
    b_nat = rex.CountsBuilder(26, 64, 6, "1-26", 16, native=NATIVE)
    b_np = rex.CountsBuilder(26, 64, 6, "1-26", 16)
    sel = b_nat.prompt_ids(b_nat.decode(routed), 333)
    check(not sel.flags.c_contiguous, "the selected layers are a view")
    hashes = [os.urandom(32) for _ in range(-(-333 // 16))]
    want = msgpack.packb(b_np.message(b_np.prompt_ids(b_np.decode(routed), 333), hashes),
                         use_bin_type=True)
    check(b_nat.message(sel, hashes).data == want, "the proxy's native path differs")


# ---------------------------------------------------------------------------------------------
# Decoding vLLM's routed experts


def npy_b64(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def with_dense(ids, dense):
    full = np.zeros((ids.shape[0], dense + ids.shape[1], ids.shape[2]), dtype=ids.dtype)
    full[:, dense:, :] = ids
    return full


def same_array(value, what):
    """The library's array of value is eldr_routed_experts.decode's: dtype, shape, elements."""
    got = NATIVE.decode(value)
    check(got is not None, "%s: the library refused it" % what)
    want = eldr_routed_experts.decode(value)
    check(got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want),
          "%s: %s %s differs from numpy's %s %s" % (what, got.dtype, got.shape, want.dtype,
                                                    want.shape))
    check(not got.flags.writeable, "%s: writeable" % what)


def test_decode_gives_the_numpy_array():
    rng = np.random.default_rng(23)
    for dtype in (np.uint8, np.dtype("<u2"), np.dtype("<i4"), np.dtype("<u4"),
                  np.dtype("<i8")):
        for tokens in (0, 1, 2, 3, 17, 1000):  # every base64 padding: 0, 1 and 2 '='
            ids = random_topk(rng, tokens, 4, 64, 6, dtype)
            for version in (None, (1, 0), (2, 0), (3, 0)):
                same_array(npy_b64(with_dense(ids, 1), version),
                           "%s x %d, .npy %s" % (np.dtype(dtype), tokens, version))
    # The geometry and DeepSeek-V2-Lite's, as the benchmark makes them.
    same_array(npy_b64(with_dense(random_topk(rng, 4096, 48, 128, 8, np.uint8), 1)), "48x128")
    same_array(npy_b64(with_dense(random_topk(rng, 512, 26, 64, 6, np.uint8), 1)), "26x64")
    wide = random_topk(rng, 50, 3, 512, 8, np.uint16)
    same_array(npy_b64(wide), "E = 512, uint16")


def refused(text, *words, out_len=None):
    """The C function's answer to text: code 1 and a message holding words."""
    raw = text if isinstance(text, bytes) else text.encode("latin-1")
    rc, message = decode_raw(raw, out_len)
    check(rc == 1, "%r: code %d (%s)" % (raw[:40], rc, message))
    for w in words:
        check(w in message, "message %r lacks %r" % (message, w))
    return message


def npy_bytes_b64(header, data=b"", version=1):
    """A .npy of a given header text (padded as numpy pads it) and data, base64."""
    h = header.encode("latin-1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    size = len(h).to_bytes(2 if version == 1 else 4, "little")
    return base64.b64encode(b"\x93NUMPY" + bytes([version, 0]) + size + h + data).decode()


def test_decode_refuses_bad_input_with_a_message():
    good = npy_b64(np.zeros((2, 3, 2), dtype=np.uint8))
    refused(good[:-1], "multiple of 4")
    refused(good[:5] + "!" + good[6:], "character 33 at offset 5")
    refused(good[:8] + "=" + good[9:], "offset 8", "padding")
    refused(" " + good[:-1], "character 32 at offset 0")
    refused(good[:-4] + "\n\n\n\n", "character 10")
    refused(good[:-4] + "   =", "character 32")
    refused(good[:4] + "\xe9" + good[5:], "character 233")
    refused(good[:4] + "\x00" + good[5:], "character 0")
    refused("QQ==", "no \\x93NUMPY magic")
    refused("====", "offset 0")
    refused("", "magic")
    refused(good, "too small", out_len=3)
    refused(base64.b64encode(b"\x93NUMPY\x04\x00" + b"x" * 30).decode(), "unknown version 4")
    refused(base64.b64encode(b"\x93NUMPY\x01\x00\xff\xff{}").decode(), "a header of 65535")
    refused(base64.b64encode(b"\x93NUMPY\x02\x00\x00\x00\x02\x00").decode(), "header of")
    d = "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }"
    refused(npy_bytes_b64(d, b"\0" * 5), "5 data bytes")
    refused(npy_bytes_b64(d, b"\0" * 7), "7 data bytes")
    for header, words in [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", ("'<f4'",)),
            ("{'descr': '>u2', 'fortran_order': False, 'shape': (1, 2, 3), }", ("'>u2'",)),
            ("{'descr': '|u1', 'fortran_order': True, 'shape': (1, 2, 3), }", ("Fortran",)),
            ("{'descr': '|u1', 'fortran_order': 0, 'shape': (1, 2, 3), }", ("True or False",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (6, ), }", ("3 dimensions",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3, 1), }",
             ("3 dimensions",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, -2, 3), }", ("integers",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': [1, 2, 3], }", ("tuple",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999, 2, 3), }",
             ("2^40",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1099511627776, 1099511627776, "
             "1099511627776), }", ("data bytes",)),
            ("{'descr': '|u1', 'fortran_order': False}", ("not all present",)),
            ("{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3)}",
             ("repeated key",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), 'x': 1}",
             ("unexpected",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3)} x", ("after",)),
            ("{'descr': '|u1' 'fortran_order': False, 'shape': (1, 2, 3)}", ("','",)),
            ("{'descr: '|u1', 'fortran_order': False, 'shape': (1, 2, 3)}", ("':'",)),
            ("['descr', '|u1']", ("'{'",)),
            ("", ("'{'",)),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3)", ("','",))]:
        refused(npy_bytes_b64(header, b"\0" * 6), *words)
    neg32 = np.zeros((2, 2, 2), dtype="<i4")
    neg32[1, 1, 1] = -5
    refused(npy_b64(neg32), "negative")
    neg64 = np.zeros((2, 2, 2), dtype="<i8")
    neg64[0, 0, 0] = -(1 << 40)
    refused(npy_b64(neg64), "negative")
    # Null pointers: a message, not a crash.
    lib = NATIVE._lib
    err = ctypes.create_string_buffer(100)
    shape = (ctypes.c_uint64 * 3)()
    check(lib.eldr_routed_experts_decode(None, 4, None, 0, None, shape, None, err, 100) == 1,
          "null pointers accepted")
    check(b"null" in err.value, err.value)


def decode_raw(raw, out_len=None):
    """The C function's (code, decoded .npy data) of raw bytes, its message on a refusal.
    out_len: the output buffer's size (default: what the text's quanta hold)."""
    lib = NATIVE._lib
    out = np.zeros(len(raw) // 4 * 3 if out_len is None else out_len, dtype=np.uint8)
    dtype = ctypes.c_uint32(7)
    shape = (ctypes.c_uint64 * 3)()
    offset = ctypes.c_uint64(0)
    err = ctypes.create_string_buffer(200)
    rc = lib.eldr_routed_experts_decode(raw, len(raw), out.ctypes.data, out.size,
                                        ctypes.byref(dtype), shape, ctypes.byref(offset), err, 200)
    if rc != 0:
        return rc, err.value.decode()
    n = shape[0] * shape[1] * shape[2]
    return rc, out[offset.value:offset.value + n].tobytes()


def test_every_byte_at_every_place_of_a_line():
    """The library decodes base64 32 characters at a time (AVX2), then 16 (SSSE3), up to the first
    line with anything but the 64 alphabet characters, and leaves the rest to OpenSSL: each of
    the 256 byte values at each place of a 32-character line early in the text (AVX2 where the
    CPU has it), of the 16-character line 48 characters before the end (SSSE3) and of the last
    16 characters (OpenSSL), is refused iff it is not of the alphabet (naming it), and every
    accepted text decodes to Python's bytes."""
    alphabet = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, %d), }"
    data = bytes(range(256)) * 3 + b"eldr"  # with the 128-byte header, 75 whole lines
    text = npy_bytes_b64(header % len(data), data).encode()
    check(len(text) % 16 == 0 and b"=" not in text, "the text is whole lines: %d" % len(text))
    for line, places in ((len(text) // 2 // 32 * 32, 32), (len(text) - 48, 16),
                         (len(text) - 16, 16)):
        for place in range(places):
            at = line + place
            for byte in range(256):
                raw = text[:at] + bytes([byte]) + text[at + 1:]
                rc, got = decode_raw(raw)
                if byte in alphabet:
                    want = base64.b64decode(raw, validate=True)
                    check(rc == 0, "%d at %d refused: %s" % (byte, at, got))
                    check(got == want[len(want) - len(data):], "%d at %d: other bytes"
                          % (byte, at))
                elif byte == ord("=") and at == len(text) - 1:
                    check(rc == 1 and "771 data bytes" in got, "padding: %r" % got)
                else:
                    check(rc == 1 and "character %d at offset %d" % (byte, at) in got,
                          "%d at %d: %r" % (byte, at, got))
    # Every length of data: the split between the two decoders at every place.
    rng = np.random.default_rng(37)
    for n in range(0, 200):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        rc, got = decode_raw(npy_bytes_b64(header % n, data).encode())
        check(rc == 0 and got == data, "%d data bytes: %r" % (n, got[:40]))


def test_every_refusal_is_the_numpy_paths_and_every_answer_its_array():
    """Thousands of corruptions of real-shaped strings (characters replaced, removed, cut off,
    header bytes changed): whatever the library reads is numpy's array; whatever it refuses, the
    proxy's decode (which then asks numpy) answers as the numpy path does."""
    rng = np.random.default_rng(29)
    b_nat = rex.CountsBuilder(6, 32, 4, "auto", 16, native=NATIVE)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/= \n!\xe9"

    def outcome(fn, value):
        try:
            return fn(value)
        except rex.CountsError as e:  # ast's messages name objects by address
            return (e.reason, re.sub(r" at 0x[0-9a-f]+", "", str(e)))

    read = refused_n = 0
    for i in range(3000):
        dtype = (np.uint8, np.dtype("<u2"), np.dtype("<i4"))[i % 3]
        good = npy_b64(with_dense(random_topk(rng, int(rng.integers(0, 40)), 6, 32, 4, dtype), 1))
        s = list(good)
        kind = i % 5
        at = int(rng.integers(0, len(s)))
        at_header = int(rng.integers(0, min(len(s), 120)))
        if kind == 0:
            s[at] = alphabet[int(rng.integers(0, len(alphabet)))]
        elif kind == 1:
            s[at_header] = alphabet[int(rng.integers(0, 64))]  # still base64: a bad header
        elif kind == 2:
            del s[at:at + int(rng.integers(1, 5))]
        elif kind == 3:
            s = s[:at - at % 4]  # whole quanta: a cut .npy
        else:
            raw = bytearray(base64.b64decode(good))
            raw[int(rng.integers(0, min(len(raw), 128)))] = int(rng.integers(0, 256))
            s = list(base64.b64encode(bytes(raw)).decode())
        value = "".join(s)
        got = NATIVE.decode(value)
        want = outcome(rex.CountsBuilder.decode_numpy, value)
        if got is None:
            refused_n += 1
            check(outcome(b_nat.decode, value) is not None, "no outcome")
            through = outcome(b_nat.decode, value)
            if isinstance(want, tuple):
                check(through == want, "%d: %r != %r" % (i, through, want))
            else:
                check(np.array_equal(through, want), "%d: the fallback's array differs" % i)
        else:
            read += 1
            check(not isinstance(want, tuple), "%d: the library read what numpy refuses (%s)"
                  % (i, want))
            check(got.dtype == want.dtype and got.shape == want.shape
                  and np.array_equal(got, want), "%d: the arrays differ" % i)
    check(read > 100 and refused_n > 1000, "read %d, refused %d" % (read, refused_n))


def test_the_proxy_builder_decodes_with_the_library():
    """CountsBuilder.decode with and without the library: the same arrays, the same
    CountsErrors (reason and message) for what vLLM or a broken upstream might send."""
    rng = np.random.default_rng(31)
    b_nat = rex.CountsBuilder(26, 64, 6, "1-26", 16, native=NATIVE)
    b_np = rex.CountsBuilder(26, 64, 6, "1-26", 16)
    ids = with_dense(random_topk(rng, 100, 26, 64, 6, np.uint8), 1)
    fortran = io.BytesIO()
    np.save(fortran, np.asfortranarray(ids))
    values = [npy_b64(ids), base64.b64encode(fortran.getvalue()).decode(), ids.tolist(),
              None, 7, "not base64!", "QUJD", npy_b64(ids)[:-4], npy_b64(ids.astype("<f4")),
              "\u00e9" * 8]
    for v in values:
        results = []
        for b in (b_nat, b_np):
            try:
                results.append(b.decode(v))
            except rex.CountsError as e:
                results.append((e.reason, str(e)))
        a, w = results
        if isinstance(w, tuple):
            check(a == w, "%r: %r != %r" % (str(v)[:20], a, w))
        else:
            check(np.array_equal(a, w) and a.dtype == w.dtype, "%r: arrays" % str(v)[:20])


# ---------------------------------------------------------------------------------------------
# vLLM's block hashes


EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, -1, -24,
         -25, -256, -257, -65536, -65537, -(1 << 32), -(1 << 32) - 1, -(1 << 63)]


def random_token_ids(rng, n):
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return [int(x) for x in rng.integers(0, 152064, size=n)]  # a real vocabulary
    if kind == 1:
        return [EDGES[int(i)] for i in rng.integers(0, len(EDGES), size=n)]
    if kind == 2:  # every head length, both signs
        bits = rng.integers(0, 63, size=n)
        return [int(rng.integers(0, 1 << int(b))) * (1 if rng.random() < 0.7 else -1)
                for b in bits]
    return [int(x) for x in rng.integers(-(1 << 63), (1 << 63) - 1, size=n, dtype=np.int64)]


def test_block_hashes_are_cbor2s_on_random_inputs():
    """The library's chain against BlockHasher's own (cbor2 canonical, hashlib) for both
    sources, prompts of 0 to 700 tokens, blocks of 1 to 300 tokens, token ids of every CBOR
    head length and sign (int64 bounds included), salts absent, empty, ASCII, non-ASCII and
    longer than 255 and 65535 bytes."""
    rng = np.random.default_rng(37)
    salts = [None, "", "s", "salt-1234", "\u00e9\u6f22\u5b57\U0001f642", "x" * 23, "y" * 24,
             "z" * 300, "w" * 70000]
    done = 0
    for source, seed in (("vllm", "0"), ("vllm", "12345"), ("proxy", "p")):
        py = eldr_proxy_hashes.BlockHasher(source, seed)
        nat = eldr_proxy_hashes.BlockHasher(source, seed, native=NATIVE)
        for i in range(400):
            n = int(rng.integers(0, 700)) if i % 10 else int(rng.integers(0, 3))
            bs = (1, 2, 16, 17, 23, 24, 255, 256, 300)[i % 9]
            ids = random_token_ids(rng, n)
            salt = salts[i % len(salts)]
            want = py.hashes(ids, bs, cache_salt=salt)
            direct = NATIVE.block_hashes(py.none_hash, ids, bs, salt, "eldr-proxy:partial")
            check(direct is not None, "the library refused %d ids" % n)
            check(direct == want, "%s seed %s: %d tokens, block %d, salt %r: hashes differ"
                  % (source, seed, n, bs, salt and salt[:10]))
            check(nat.hashes(ids, bs, cache_salt=salt) == want, "through BlockHasher")
            done += 1
    check(done == 1200, "%d cases" % done)


def test_block_hashes_hand_back_what_the_library_does_not_take():
    """Ints outside int64, bools, numpy ints, other sequences and salts: the library answers
    None and BlockHasher hashes them itself (the same digests as without the library)."""
    py = eldr_proxy_hashes.BlockHasher("vllm", "0")
    nat = eldr_proxy_hashes.BlockHasher("vllm", "0", native=NATIVE)
    tag = "eldr-proxy:partial"
    cases = [([1, 2, 1 << 63], 2, None), ([1, -(1 << 63) - 1], 2, None), ([1, True, 3], 2, None),
             ([1, np.int64(2)], 2, None), ((1, 2, 3), 2, None), ([1, 2, 3], 2, b"bytes"),
             ([1, 2, 3], 2, "\ud800"), ([1, 2, 3], 1 << 32, None), ([1, 2], 0, None)]
    for ids, bs, salt in cases:
        got = NATIVE.block_hashes(py.none_hash, ids, bs, salt, tag)
        if isinstance(ids, tuple) and bs == 2 and salt is None:
            check(got == py.hashes(list(ids), 2), "a tuple of ints is taken")
            continue
        check(got is None, "%r, %r, %r taken" % (ids, bs, salt))
        outcomes = []
        for hasher in (nat, py):  # digests, or what cbor2 raises (a numpy int, a lone surrogate)
            try:
                outcomes.append(hasher.hashes(ids, bs, cache_salt=salt))
            except Exception as e:  # noqa: BLE001 -- whatever the Python path raises
                outcomes.append((type(e), str(e)))
        check(outcomes[0] == outcomes[1], "%r, %r, %r: %r != %r"
              % (ids, bs, salt, outcomes[0], outcomes[1]))
    # The C function's own checks.
    lib = NATIVE._lib
    err = ctypes.create_string_buffer(100)
    ids = np.arange(5, dtype=np.int64)
    out = ctypes.create_string_buffer(96)
    h = b"\0" * 32
    check(lib.eldr_block_hashes(h, ids.ctypes.data, 5, 2, 0, b"", 0, b"t", 1, out, 96, err,
                                100) == 0, "a valid call")
    for what, args in [("null none_hash", (None, ids.ctypes.data, 5, 2)),
                       ("null ids", (h, None, 5, 2)), ("block 0", (h, ids.ctypes.data, 5, 0)),
                       ("out too small", (h, ids.ctypes.data, 7, 2))]:
        rc = lib.eldr_block_hashes(*args, 0, b"", 0, b"t", 1, out, 96, err, 100)
        check(rc == 1 and err.value, "%s: code %d" % (what, rc))


# ---------------------------------------------------------------------------------------------
# Found, not found, said


def test_the_loader_says_when_it_falls_back_to_numpy():
    saved = os.environ.get(eldr_proxy_native.ENV)
    try:
        os.environ[eldr_proxy_native.ENV] = "off"
        native, note = eldr_proxy_native.load()
        check(native is None and "numpy" in note, note)
        os.environ[eldr_proxy_native.ENV] = os.path.join(HERE, "no-such-library.so")
        native, note = eldr_proxy_native.load()
        check(native is None and "numpy" in note and "no-such-library" in note, note)
        os.environ[eldr_proxy_native.ENV] = NATIVE.path
        native, note = eldr_proxy_native.load()
        check(native is not None and NATIVE.path in note, note)
    finally:
        if saved is None:
            os.environ.pop(eldr_proxy_native.ENV, None)
        else:
            os.environ[eldr_proxy_native.ENV] = saved
    for value in (0, 1):
        text = eldr_proxy_metrics.ProxyMetrics(lambda: 0, lambda: {}, lambda: value).render()
        check("\neldr_proxy_counts_native %d\n" % value in text, text)


def test_the_proxy_logs_which_conversion_it_runs():
    """eldr-proxy --help needs no library; a config parsed without it keeps numpy and its note
    names the fallback (serve() logs it as a warning at start)."""
    import eldr_proxy
    argv = ["--listen", "127.0.0.1:0", "--eldr", "tcp://127.0.0.1:1", "--eldr-worker",
            "tcp://127.0.0.1:2", "--model", "m", "--prefill", "http://127.0.0.1:3",
            "--decode", "http://127.0.0.1:4", "--layers", "26", "--experts", "64", "--top-k",
            "6", "--first-moe-layer", "1"]
    saved = os.environ.get(eldr_proxy_native.ENV)
    try:
        os.environ[eldr_proxy_native.ENV] = "off"
        config = eldr_proxy.parse_config(argv)
        check(config.counts.native is None and "numpy" in config.counts_note,
              config.counts_note)
        os.environ[eldr_proxy_native.ENV] = NATIVE.path
        config = eldr_proxy.parse_config(argv)
        check(config.counts.native is not None, config.counts_note)
    finally:
        if saved is None:
            os.environ.pop(eldr_proxy_native.ENV, None)
        else:
            os.environ[eldr_proxy_native.ENV] = saved


def main():
    global NATIVE
    native, note = eldr_proxy_native.load()
    print(note)
    if native is None:
        print("FAIL: the library did not load; set %s to libeldr_counts_native.so"
              % eldr_proxy_native.ENV)
        return 1
    NATIVE = native
    return eldr_testing.run_test_functions(globals())


if __name__ == "__main__":
    sys.exit(main())
