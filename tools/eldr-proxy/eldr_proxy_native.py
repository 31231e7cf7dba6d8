"""eldr-proxy's compiled routed-experts-to-counts conversion, loaded with ctypes.

libeldr_counts_native.so (tools/eldr-proxy/counts_native.cpp, built by CMake, installed next to
this module by `cmake --install --component python`) decodes vLLM's base64 .npy routed experts
(as eldr_routed_experts.decode does), computes vLLM's sha256_cbor block hashes (as
eldr_proxy_hashes.BlockHasher does) and makes the bytes eldr_client.counts_message with a TopkIds
makes once packed, with eldr's own C++ counting and encoder, in less CPU time (BENCHMARKS.md,
"Routed experts to counts"). Where it is looked for:
    $ELDR_COUNTS_NATIVE   the library's path ("off": do not load it, use numpy)
    else                  libeldr_counts_native.so beside this module (an install)
Not found, the proxy converts with numpy: eldr-proxy logs that once at start and reports it on
its /metrics (eldr_proxy_counts_native 0).
"""
import ctypes
import os
import struct
import weakref

import numpy as np

from eldr_client import Packed, normalize_hash

ENV = "ELDR_COUNTS_NATIVE"
LIBRARY = "libeldr_counts_native.so"
ABI_VERSION = 3  # counts_native.cpp's abi_version
_INVALID = 1
_ERROR_BYTES = 512
# eldr_routed_experts_decode's dtype codes, in eldr_routed_experts' order.
_DTYPES = (np.dtype("u1"), np.dtype("<u2"), np.dtype("<i4"), np.dtype("<u4"), np.dtype("<i8"))

# The UTF-8 bytes of a str without a copy: for an ASCII str (what base64 is), CPython's own
# buffer. The caller holds the str for as long as the pointer is used.
_utf8_of = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_utf8_of.restype = ctypes.c_void_p
_utf8_of.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)]


class NativeCounts:
    """One loaded library. message() is thread-safe (the library holds no state)."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.eldr_counts_abi_version.restype = ctypes.c_uint32
        lib.eldr_counts_abi_version.argtypes = []
        abi = lib.eldr_counts_abi_version()
        if abi != ABI_VERSION:
            raise OSError("%s: ABI version %d, this module speaks %d" % (path, abi, ABI_VERSION))
        u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
        f = lib.eldr_counts_message
        f.restype = ctypes.c_int
        f.argtypes = [u32, u32, u32, u32, ptr, u32, u64, u64, ptr, ptr, ptr, u64, ctypes.c_int,
                      u64, ctypes.POINTER(ptr), ctypes.POINTER(ptr),
                      ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        d = lib.eldr_routed_experts_decode
        d.restype = ctypes.c_int
        d.argtypes = [ptr, ctypes.c_size_t, ptr, ctypes.c_size_t, ctypes.POINTER(u32),
                      ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.c_char_p, ctypes.c_size_t]
        lib.eldr_counts_free.restype = None
        lib.eldr_counts_free.argtypes = [ctypes.c_void_p]
        hb = lib.eldr_block_hashes
        hb.restype = ctypes.c_int
        hb.argtypes = [ctypes.c_char_p, ptr, u64, u32, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ptr, ctypes.c_size_t,
                       ctypes.c_char_p, ctypes.c_size_t]
        self._lib = lib
        self.path = path

    def block_hashes(self, none_hash, token_ids, block_size, cache_salt, partial_tag):
        """eldr_proxy_hashes.BlockHasher's chain for the "vllm" and "proxy" sources: the 32-byte
        hash of every block of token_ids, the same bytes as cbor2 and hashlib make. None when
        the library does not take the input (token ids other than a list or tuple of plain ints
        within int64, a salt other than None or a str that UTF-8 encodes, a block size outside
        1..2^32-1): the caller hashes it in Python. Raises MemoryError when the library fails."""
        if not isinstance(token_ids, (list, tuple)) or not set(map(type, token_ids)) <= {int}:
            return None
        if not (isinstance(block_size, int) and 1 <= block_size < 1 << 32):
            return None
        if cache_salt is not None and not isinstance(cache_salt, str):
            return None
        n = len(token_ids)
        try:
            # struct packs a list of ints in a third of numpy's time and refuses one outside int64.
            ids = struct.pack("=%dq" % n, *token_ids)
            salt = b"" if cache_salt is None else cache_salt.encode("utf-8")
            tag = partial_tag.encode("utf-8")
        except (struct.error, UnicodeEncodeError):
            return None
        blocks = -(-n // block_size)
        out = ctypes.create_string_buffer(32 * blocks)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        rc = self._lib.eldr_block_hashes(bytes(none_hash), ids, n, block_size,
                                         cache_salt is not None, salt, len(salt), tag, len(tag),
                                         out, len(out), err, _ERROR_BYTES)
        if rc != 0:
            message = "eldr_block_hashes: %s" % err.value.decode("utf-8", "replace")
            raise ValueError(message) if rc == _INVALID else MemoryError(message)
        raw = out.raw
        return [raw[i:i + 32] for i in range(0, 32 * blocks, 32)]

    def decode(self, value):
        """vLLM's base64 .npy routed_experts string as a read-only integer array (tokens,
        layers, k), as eldr_routed_experts.decode makes it; None when the library refuses it or
        value is not an ASCII str, for the numpy path to decide (its message, or an array from
        a .npy the library does not read: Fortran order, another spelling of a dtype). Raises
        MemoryError when the library runs out."""
        if not isinstance(value, str) or not value.isascii():
            return None
        size = ctypes.c_ssize_t(0)
        text = _utf8_of(value, ctypes.byref(size))
        out = np.empty(size.value // 4 * 3, dtype=np.uint8)
        dtype = ctypes.c_uint32(0)
        shape = (ctypes.c_uint64 * 3)()
        offset = ctypes.c_uint64(0)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        rc = self._lib.eldr_routed_experts_decode(text, size.value, out.ctypes.data, out.size,
                                                  ctypes.byref(dtype), shape,
                                                  ctypes.byref(offset), err, _ERROR_BYTES)
        if rc == _INVALID:
            return None
        if rc != 0:
            raise MemoryError("eldr_routed_experts_decode: %s"
                              % err.value.decode("utf-8", "replace"))
        dt = _DTYPES[dtype.value]
        n = shape[0] * shape[1] * shape[2]
        arr = np.frombuffer(out, dtype=dt, count=n, offset=offset.value).reshape(tuple(shape))
        arr.flags.writeable = False
        return arr

    def message(self, layers, experts, top_k, hashes, parents, ids, block_size, seq=None):
        """The packed counts message (an eldr_client.Packed) of ids (tokens, layers, top_k),
        numpy, any integer dtype, cut into blocks of block_size tokens, with one hash and parent
        (None: no parent) per block, or parents None for the chain (block i's parent is block
        i - 1's hash, block 0 has none); hashes may be their uint64 keys as a numpy array (made
        once by eldr_proxy_counts.block_keys): its data is msgpack.packb(eldr_client.counts_message(
        layers, experts, top_k, TopkIds(hashes, parents, ids, block_size), seq)). Raises
        ValueError on what counts_message refuses (geometry, shapes, ids >= experts, repeated
        ids in a token's top-k row, more than 4096 blocks); MemoryError when the library runs
        out. A view whose tokens are rows of a wider array (vLLM's with its dense layers, as
        eldr_routed_experts' layer selection leaves it) is read in place, not copied."""
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
        # Token t's L x k ids at element t * stride, each token's own ids contiguous.
        item, stride = ids.itemsize, 0
        if ids.shape[0] > 1:
            s0 = ids.strides[0]
            stride = s0 // item
            if not (ids[0].flags.c_contiguous and s0 % item == 0 and stride >= layers * top_k):
                ids, stride = np.ascontiguousarray(ids), 0
        elif ids.shape[0] == 1 and not ids[0].flags.c_contiguous:
            ids = np.ascontiguousarray(ids)
        n = len(hashes)
        if parents is not None and len(parents) != n:
            raise ValueError("%d hashes, %d parents" % (n, len(parents)))
        if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64 and hashes.ndim == 1:
            h = np.ascontiguousarray(hashes)  # already the keys (eldr_proxy_counts.block_keys)
        else:
            h = np.fromiter((normalize_hash(x) for x in hashes), dtype=np.uint64, count=n)
        chain = n > 0 and (parents is None or (not isinstance(hashes, np.ndarray) and
                                               parents[0] is None and
                                               parents[1:] == hashes[:-1]))
        if chain:  # the usual chain
            p = np.empty(n, dtype=np.uint64)
            p[0] = 0
            p[1:] = h[:-1]
            has_p = np.ones(n, dtype=np.uint8)
            has_p[0] = 0
        else:
            parents = () if parents is None else parents  # None with no block: nothing
            p = np.fromiter((0 if x is None else normalize_hash(x) for x in parents),
                            dtype=np.uint64, count=n)
            has_p = np.fromiter((x is not None for x in parents), dtype=np.uint8, count=n)
        handle = ctypes.c_void_p()
        out = ctypes.c_void_p()
        out_len = ctypes.c_size_t(0)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        rc = self._lib.eldr_counts_message(
            layers, experts, top_k, block_size, ids.ctypes.data, ids.itemsize, ids.shape[0],
            stride, h.ctypes.data, p.ctypes.data, has_p.ctypes.data, n, seq is not None,
            0 if seq is None else int(seq), ctypes.byref(handle), ctypes.byref(out),
            ctypes.byref(out_len), err, _ERROR_BYTES)
        if rc != 0:
            message = err.value.decode("utf-8", "replace")
            if rc == _INVALID:
                raise ValueError(message)
            raise MemoryError("eldr_counts_message: %s" % message)
        # The message stays in the library's buffer, freed when the last view of it goes: no
        # copy of megabytes here (eldr_client.encode joins the view into the route request).
        buffer = (ctypes.c_ubyte * out_len.value).from_address(out.value)
        weakref.finalize(buffer, self._lib.eldr_counts_free, handle)
        return Packed(memoryview(buffer).cast("B"))


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
