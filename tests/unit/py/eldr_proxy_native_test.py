#!/usr/bin/python3
"""Unit tests of eldr-proxy's compiled counts conversion (tools/eldr-proxy/counts_native.cpp,
loaded by eldr_proxy_native.py): its bytes equal msgpack.packb of eldr_client.counts_message with
a TopkIds (the numpy path) on random inputs of every id width and dtype and on the REAL recorded
traces; bad input gets a ValueError (a CountsError in the proxy) with a message, never a crash;
the route_request it goes into is the same bytes; the loader and the /metrics gauge say when the
library is missing. No sockets, no processes.

usage: ELDR_COUNTS_NATIVE=path/to/libeldr_counts_native.so eldr_proxy_native_test.py
    exit 0 when every test passes; 1 when one fails or the library does not load. The
    real-trace tests read ../shared/data (or $ELDR_SHARED_DATA) and say SKIP when it is missing.
"""
import ctypes
import os
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
import eldr_proxy_metrics  # noqa: E402
import eldr_proxy_native  # noqa: E402

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

    def call(id_bytes=1, tokens=1, hashes=h.ctypes.data, n_blocks=1, out_p=ctypes.byref(out)):
        return lib.eldr_counts_message(1, 4, 1, 16, ids.ctypes.data, id_bytes, tokens, hashes,
                                       h.ctypes.data, flag.ctypes.data, n_blocks, 0, 0,
                                       ctypes.byref(handle), out_p, ctypes.byref(n), err, 64)

    check(call() == 0 and n.value > 0 and handle.value and out.value, "a valid call")
    lib.eldr_counts_free(handle)
    for what, rc in [("id_bytes 3", call(id_bytes=3)), ("null hashes", call(hashes=None)),
                     ("null out", call(out_p=None)), ("blocks", call(n_blocks=2)),
                     ("huge tokens", call(tokens=1 << 40, n_blocks=1 << 36))]:
        check(rc == 1, "%s: code %d" % (what, rc))
        check(err.value, "%s: no message" % what)
    check(len(err.value) < 64, "the message is not truncated to the buffer")
    lib.eldr_counts_free(None)  # free(NULL) is a no-op


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
