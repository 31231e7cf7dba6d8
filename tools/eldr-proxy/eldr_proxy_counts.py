"""From vLLM's routed experts of a prompt to the eldr counts message of its KV blocks.

vLLM started with --enable-return-routed-experts returns, per choice, the router's top-k expert
ids of every token it has run through the model (`routed_experts`): a base64 string of a numpy
.npy file of shape (tokens, num_hidden_layers, top_k), dtype uint8, uint16 or int32 (current
vLLM; earlier builds sent the same array as nested JSON lists, also read here). The layer axis
holds every decoder layer, so a model whose first layers are dense (DeepSeek's
first_k_dense_replace) has rows of zeros there: MoeLayers says which of vLLM's layer indices are
the MoE layers of eldr's geometry, in order.

The conversion itself (grouping tokens into blocks and counting each block's experts per layer)
is eldr_client.counts_message with a TopkIds: one encoder, whole-array numpy operations.
"""
import ast
import binascii

import numpy as np

from eldr_client import TopkIds, counts_message

_DTYPES = (np.dtype("u1"), np.dtype("<u2"), np.dtype("<i4"), np.dtype("<i8"), np.dtype("<u4"))


def keep_large_allocations():
    """Asks glibc's malloc to serve the conversion's large temporaries (megabytes for a long
    prompt) from the heap and keep them mapped (M_MMAP_THRESHOLD 256 MiB, M_TRIM_THRESHOLD
    512 MiB): freshly mmapped arrays cost a page fault per 4 KiB on every request, which doubled
    the conversion's CPU time in bench_conversion.py. Returns whether it applied (not on a
    libc without mallopt)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 256 << 20)) and bool(libc.mallopt(-1, 512 << 20))
    except (OSError, AttributeError):
        return False


class CountsError(Exception):
    """The routed experts could not become counts; `reason` is a short metric label."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


class MoeLayers:
    """Which of vLLM's layer indices are eldr's MoE layers 0..L-1, in order.

    spec: "F" alone is not accepted here (see parse); indices is a list of ints."""

    def __init__(self, indices):
        indices = [int(i) for i in indices]
        if not indices:
            raise ValueError("no MoE layer")
        if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
            raise ValueError("layer indices must be distinct and >= 0")
        if indices != sorted(indices):
            raise ValueError("layer indices must be increasing (eldr's layer l is the l-th MoE "
                             "layer)")
        self.indices = indices
        first, last = indices[0], indices[-1]
        # A contiguous range is a view of the array, not a copy.
        self._select = (slice(first, last + 1) if last - first + 1 == len(indices)
                        else np.asarray(indices, dtype=np.intp))

    @classmethod
    def parse(cls, text, layers=None):
        """"1-26" or "1,3,5-9" (inclusive ranges, comma separated); with `layers` (L) also "all"
        (vLLM layers 0..L-1) and "auto" (per response, the layers not all zero: dense layers are
        rows vLLM never writes; needs top_k >= 2), as eldr-record's --moe-layers takes them."""
        if text == "all" and layers is not None:
            return cls(range(layers))
        if text == "auto" and layers is not None:
            return AutoMoeLayers(layers)
        out = []
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                raise ValueError("empty element in %r" % text)
            if "-" in part:
                a, b = part.split("-", 1)
                a, b = int(a), int(b)
                if b < a:
                    raise ValueError("range %s goes backwards" % part)
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        return cls(out)

    def __len__(self):
        return len(self.indices)

    def select(self, ids):
        """ids (tokens, vLLM layers, k) -> (tokens, MoE layers, k)."""
        if ids.shape[1] <= self.indices[-1]:
            raise CountsError("layers", "routed experts hold %d layers; MoE layer index %d is "
                              "outside (check --moe-layers / --first-moe-layer)"
                              % (ids.shape[1], self.indices[-1]))
        return ids[:, self._select, :]


class AutoMoeLayers:
    """The MoE layers of each response found in it: the layers whose ids are not all zero (a
    layer with a router picks top_k >= 2 distinct ids per token, so never only zeros). One pass
    over the array per response."""

    def __init__(self, layers):
        self.layers = layers

    def __len__(self):
        return self.layers

    def select(self, ids):
        if ids.shape[1] == self.layers:
            return ids
        routed = np.flatnonzero(ids.any(axis=(0, 2)))
        if len(routed) != self.layers:
            raise CountsError("layers", "routed experts hold %d layers, %d of them not all "
                              "zero; the geometry has %d MoE layers (--moe-layers auto)"
                              % (ids.shape[1], len(routed), self.layers))
        return MoeLayers(routed.tolist()).select(ids)


_NPY_MAGIC = b"\x93NUMPY"


def _npy_array(raw):
    """The array of a .npy file's bytes, as a view of them (no copy): version 1.0, 2.0 or 3.0
    header, a dict literal read with ast.literal_eval (never pickle), an integer dtype of
    _DTYPES, C or Fortran order, exactly as many bytes as the shape needs. (np.load does the
    same, but copies the data and runs its header through Python's tokenizer: a measurable
    part of a request in bench_conversion.py.)"""
    def bad(why):
        return CountsError("encoding", "routed_experts is not a .npy array: %s" % why)
    if len(raw) < 10 or raw[:6] != _NPY_MAGIC:
        raise bad("no .npy magic")
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif major in (2, 3):
        if len(raw) < 12:
            raise bad("truncated header")
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        raise bad("format version %d" % major)
    if start + hlen > len(raw) or hlen > 65536:
        raise bad("header of %d bytes" % hlen)
    try:
        header = ast.literal_eval(raw[start:start + hlen].decode("latin-1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(int(n) for n in header["shape"])
        fortran = header["fortran_order"]
    except Exception as e:  # a literal of the wrong shape raises anything
        raise bad("header %r: %s" % (raw[start:start + 80], e)) from None
    if dtype not in _DTYPES:
        raise CountsError("encoding", "routed_experts array of dtype %s, expected an integer "
                          "type" % dtype)
    if any(n < 0 for n in shape) or fortran not in (True, False):
        raise bad("shape %s" % (shape,))
    count = 1
    for n in shape:
        count *= n
    offset = start + hlen
    if len(raw) - offset != count * dtype.itemsize:
        raise bad("%d data bytes for shape %s of %s" % (len(raw) - offset, shape, dtype))
    flat = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C")


def decode_routed_experts(value):
    """The routed experts of one choice as an integer array (tokens, layers, top_k).

    value: the response's `routed_experts` (base64 .npy str, or nested lists). Raises
    CountsError on anything else, never a crash: the value comes from outside."""
    if value is None:
        raise CountsError("absent", "the prefill response carries no routed_experts (start "
                          "vLLM with --enable-return-routed-experts)")
    if isinstance(value, str):
        try:
            raw = binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError) as e:
            raise CountsError("encoding", "routed_experts is not base64: %s" % e) from None
        ids = _npy_array(raw)
    elif isinstance(value, list):
        try:
            ids = np.asarray(value, dtype=np.int64)
        except (ValueError, TypeError, OverflowError) as e:
            raise CountsError("encoding", "routed_experts lists are not a regular integer "
                              "array: %s" % e) from None
    else:
        raise CountsError("encoding", "routed_experts is a %s" % type(value).__name__)
    if ids.ndim != 3:
        raise CountsError("shape", "routed_experts has shape %s, expected (tokens, layers, "
                          "top_k)" % (ids.shape,))
    return ids


class CountsBuilder:
    """The proxy's fixed conversion settings: eldr's geometry, vLLM's MoE layers, block size."""

    def __init__(self, layers, experts, top_k, moe_layers, block_size, max_blocks=4096):
        if len(moe_layers) != layers:
            raise ValueError("%d MoE layer indices for a geometry of %d layers"
                             % (len(moe_layers), layers))
        counts_message(layers, experts, top_k, [])  # the encoder's own geometry rules
        if not 1 <= block_size <= 255:
            raise ValueError("block size %d: an eldr block holds 1..255 tokens" % block_size)
        self.layers, self.experts, self.top_k = layers, experts, top_k
        self.moe_layers = moe_layers
        self.block_size = block_size
        self.max_blocks = max_blocks

    def prompt_ids(self, ids, n_prompt):
        """The MoE-layer ids of the prompt's tokens: (n_prompt, L, k). vLLM returns
        num_tokens - 1 rows (the last sampled token never ran), so with max_tokens=1 exactly the
        prompt; more rows are output tokens and are cut off, fewer is an error."""
        if ids.shape[2] != self.top_k:
            raise CountsError("top_k", "routed experts pick %d experts per token, the geometry "
                              "says top_k = %d" % (ids.shape[2], self.top_k))
        if n_prompt is None:
            n_prompt = ids.shape[0]
        if ids.shape[0] < n_prompt:
            raise CountsError("tokens", "routed experts cover %d tokens, the prompt has %d"
                              % (ids.shape[0], n_prompt))
        return self.moe_layers.select(ids[:n_prompt])

    def message(self, ids, hashes):
        """The counts message of the prompt's blocks. ids: (tokens, L, k) of the MoE layers;
        hashes: one per block (ceil(tokens / block_size)), from BlockHasher.hashes. At most
        max_blocks blocks (the route protocol's limit): a longer prompt is signed by its first
        max_blocks blocks. Raises CountsError."""
        n_blocks = min(len(hashes), self.max_blocks)
        ids = ids[:n_blocks * self.block_size]
        hashes = hashes[:n_blocks]
        parents = [None] + hashes[:-1]
        try:
            return counts_message(self.layers, self.experts, self.top_k,
                                  TopkIds(hashes, parents, ids, self.block_size))
        except ValueError as e:
            raise CountsError("invalid", "routed experts refused: %s" % e) from None
