"""eldr-proxy's compiled routed-experts-to-counts conversion, loaded with ctypes.

libeldr_counts_native.so (tools/eldr-proxy/counts_native.cpp, built by CMake, installed next to
this module by `cmake --install --component python`) makes the bytes eldr_client.counts_message
with a TopkIds makes once packed, with eldr's own C++ counting and encoder, in less CPU time
(BENCHMARKS.md, "Routed experts to counts": 1.4-2x). Where it is looked for:
    $ELDR_COUNTS_NATIVE   the library's path ("off": do not load it, use numpy)
    else                  libeldr_counts_native.so beside this module (an install)
Not found, the proxy converts with numpy: eldr-proxy logs that once at start and reports it on
its /metrics (eldr_proxy_counts_native 0).
"""
import ctypes
import os

import numpy as np

from eldr_client import Packed, normalize_hash

ENV = "ELDR_COUNTS_NATIVE"
LIBRARY = "libeldr_counts_native.so"
ABI_VERSION = 2  # counts_native.cpp's abi_version
_INVALID = 1
_ERROR_BYTES = 512


class NativeCounts:
    """One loaded library. message() is thread-safe (the library holds no state)."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.eldr_counts_abi_version.restype = ctypes.c_uint32
        lib.eldr_counts_abi_version.argtypes = []
        abi = lib.eldr_counts_abi_version()
        if abi != ABI_VERSION:
            raise OSError("%s: ABI version %d, this module speaks %d" % (path, abi, ABI_VERSION))
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        f = lib.eldr_counts_message
        f.restype = ctypes.c_int
        f.argtypes = [u32, u32, u32, u32, ctypes.c_void_p, u32, u64, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_void_p, u64, ctypes.c_int, u64,
                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                      ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        lib.eldr_counts_free.restype = None
        lib.eldr_counts_free.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self.path = path

    def message(self, layers, experts, top_k, hashes, parents, ids, block_size, seq=None):
        """The packed counts message (an eldr_client.Packed) of ids (tokens, layers, top_k),
        numpy, any integer dtype, cut into blocks of block_size tokens, with one hash and parent
        (None: no parent) per block: its data is msgpack.packb(eldr_client.counts_message(
        layers, experts, top_k, TopkIds(hashes, parents, ids, block_size), seq)). Raises
        ValueError on what counts_message refuses (geometry, shapes, ids >= experts, repeated
        ids in a token's top-k row, more than 4096 blocks); MemoryError when the library runs
        out."""
        ids = np.asarray(ids)
        if ids.ndim != 3 or ids.shape[1:] != (layers, top_k):
            raise ValueError("ids: shape %s, expected (tokens, %d, %d)"
                             % (ids.shape, layers, top_k))
        if ids.dtype.kind not in "iu":
            raise ValueError("ids: integer expert ids expected, got dtype %s" % ids.dtype)
        if ids.dtype not in (np.dtype("u1"), np.dtype("=u2")):
            if ids.size:  # the library reads uint8 or uint16: range-check before narrowing
                lo, hi = int(ids.min()), int(ids.max())
                if lo < 0 or hi >= experts:
                    raise ValueError("ids: expert id %d is not in 0..%d"
                                     % (lo if lo < 0 else hi, experts - 1))
            ids = ids.astype(np.uint8 if experts <= 256 else np.uint16)
        ids = np.ascontiguousarray(ids)
        n = len(hashes)
        if len(parents) != n:
            raise ValueError("%d hashes, %d parents" % (n, len(parents)))
        h = np.fromiter((normalize_hash(x) for x in hashes), dtype=np.uint64, count=n)
        p = np.fromiter((0 if x is None else normalize_hash(x) for x in parents), dtype=np.uint64,
                        count=n)
        has_p = np.fromiter((x is not None for x in parents), dtype=np.uint8, count=n)
        handle = ctypes.c_void_p()
        out = ctypes.c_void_p()
        out_len = ctypes.c_size_t(0)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        rc = self._lib.eldr_counts_message(
            layers, experts, top_k, block_size, ids.ctypes.data, ids.itemsize, ids.shape[0],
            h.ctypes.data, p.ctypes.data, has_p.ctypes.data, n, seq is not None,
            0 if seq is None else int(seq), ctypes.byref(handle), ctypes.byref(out),
            ctypes.byref(out_len), err, _ERROR_BYTES)
        if rc != 0:
            message = err.value.decode("utf-8", "replace")
            if rc == _INVALID:
                raise ValueError(message)
            raise MemoryError("eldr_counts_message: %s" % message)
        try:
            return Packed(ctypes.string_at(out.value, out_len.value))
        finally:
            self._lib.eldr_counts_free(handle)


def library_path():
    """Where the library is looked for: $ELDR_COUNTS_NATIVE, else beside this module; None when
    switched off ("off")."""
    env = os.environ.get(ENV)
    if env:
        return None if env == "off" else env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)


def load():
    """(NativeCounts or None, a sentence for the log saying which conversion runs and why)."""
    path = library_path()
    if path is None:
        return None, "%s=off: routed experts are converted with numpy" % ENV
    try:
        native = NativeCounts(path)
    except (OSError, AttributeError) as e:
        return None, ("compiled counts conversion not loaded (%s): routed experts are converted "
                      "with numpy, slower; build the eldr_counts_native target "
                      "and set %s to its path, or install the python component" % (e, ENV))
    return native, "compiled counts conversion loaded from %s" % path
