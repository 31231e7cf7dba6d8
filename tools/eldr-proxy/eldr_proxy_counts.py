"""From vLLM's routed experts of a prompt to the eldr counts message of its KV blocks.

vLLM started with --enable-return-routed-experts returns, per choice, the router's top-k expert
ids of every token it has run through the model (`routed_experts`, docs/vllm.md (a)). Decoding it
and telling vLLM's layer indices of the MoE layers from the dense ones (rows of zeros, e.g.
DeepSeek's first_k_dense_replace) is eldr_routed_experts' job, shared with eldr-record, so both
tools take the same --moe-layers values ("1-26", "0,2,4-9", "all", "auto"); with the compiled
library loaded, the base64 and the .npy header are read by it instead (the same array). The
conversion itself (grouping tokens into blocks and counting each block's experts per layer) is
eldr_client.counts_message with a TopkIds: one encoder, whole-array numpy operations; or, when
the compiled library is loaded (eldr_proxy_native), eldr's C++ counting and encoder, which make
the same bytes in less CPU time (BENCHMARKS.md). This module holds the proxy's fixed settings
and turns every failure into a CountsError with a metric label.
"""
import numpy as np

import eldr_routed_experts as rex
from eldr_client import TopkIds, counts_message, normalize_hash

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


def block_keys(hashes):
    """The uint64 keys eldr knows blocks by (eldr_client.normalize_hash: a digest's last 8 bytes,
    big-endian) of a list of block hashes, as one numpy uint64 array: for the 32-byte digests
    BlockHasher makes, one frombuffer over their join instead of a Python call per block, and
    made once per request for both the counts and the route request's blocks."""
    n = len(hashes)
    # Checked by map (no Python frame per block): all bytes, all 32 long.
    if n and set(map(type, hashes)) == {bytes} and set(map(len, hashes)) == {32}:
        return np.frombuffer(b"".join(hashes), dtype=">u8")[3::4].astype(np.uint64)
    return np.fromiter((normalize_hash(h) for h in hashes), dtype=np.uint64, count=n)


class CountsError(Exception):
    """The routed experts could not become counts; `reason` is a short metric label."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def moe_layer_spec(spec, layers, top_k):
    """The --moe-layers value checked without a response: "all", "auto" (needs top_k >= 2) or a
    list of exactly `layers` vLLM layer indices. Raises ValueError."""
    if spec == "all":
        return spec
    if spec == "auto":
        if top_k < 2:
            raise ValueError("auto needs --top-k >= 2 (a top-1 router may pick expert 0 for "
                             "every token, like a dense layer's zeros)")
        return spec
    n = len(rex.parse_layer_list(spec, 1 << 20))
    if n != layers:
        raise ValueError("%d layers listed, --layers is %d" % (n, layers))
    return spec


class CountsBuilder:
    """The proxy's fixed conversion settings: eldr's geometry, vLLM's MoE layers (a
    --moe-layers spec; the layer map is made from the first response, as eldr-record does, and
    every later response is checked against it), block size. native: an
    eldr_proxy_native.NativeCounts to convert with, or None for numpy."""

    def __init__(self, layers, experts, top_k, moe_spec, block_size, max_blocks=4096,
                 native=None):
        counts_message(layers, experts, top_k, [])  # the encoder's own geometry rules
        if not 1 <= block_size <= 255:
            raise ValueError("block size %d: an eldr block holds 1..255 tokens" % block_size)
        self.layers, self.experts, self.top_k = layers, experts, top_k
        self.moe_spec = moe_layer_spec(moe_spec, layers, top_k)
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.layer_map = None
        self.native = native

    def decode(self, value):
        """vLLM's routed_experts field as an integer array (tokens, vLLM layers, k): decoded
        by the compiled library when it is loaded and reads it, else (and for every refusal, so
        that the error and its metric label are the numpy path's) by decode_numpy."""
        if self.native is not None:
            arr = self.native.decode(value)
            if arr is not None:
                return arr
        return self.decode_numpy(value)

    @staticmethod
    def decode_numpy(value):
        """decode with eldr_routed_experts (binascii and numpy) only."""
        try:
            return rex.decode(value)
        except rex.RoutedExpertsError as e:
            raise CountsError("absent" if value is None else "encoding", str(e)) from None

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
        ids = ids[:n_prompt]
        try:
            if self.layer_map is None:
                m = rex.MoeLayerMap.from_spec(self.moe_spec, ids)
                if len(m.moe_layers) != self.layers:
                    raise rex.RoutedExpertsError(
                        "--moe-layers %s finds %d MoE layers among the %d of the response, the "
                        "geometry has %d" % (self.moe_spec, len(m.moe_layers), ids.shape[1],
                                             self.layers))
                self.layer_map = m
            return self.layer_map.select(ids)
        except rex.RoutedExpertsError as e:
            raise CountsError("layers", str(e)) from None

    def message(self, ids, hashes):
        """The counts message of the prompt's blocks. ids: (tokens, L, k) of the MoE layers;
        hashes: one per block (ceil(tokens / block_size)), from BlockHasher.hashes, or their
        block_keys (a uint64 array), each block's parent the block before it. At most
        max_blocks blocks (the route protocol's limit): a longer prompt is signed by its first
        max_blocks blocks. With numpy, counts_message's dict; with the compiled library, the
        same message packed (eldr_client.Packed: route() places its bytes as they are). Raises
        CountsError."""
        n_blocks = min(len(hashes), self.max_blocks)
        ids = ids[:n_blocks * self.block_size]
        keys = hashes[:n_blocks]
        try:
            if not isinstance(keys, np.ndarray):
                keys = block_keys(keys)
            if self.native is not None:
                return self.native.message(self.layers, self.experts, self.top_k, keys, None,
                                           ids, self.block_size)
            keys = keys.tolist()
            return counts_message(self.layers, self.experts, self.top_k,
                                  TopkIds(keys, [None] + keys[:-1], ids, self.block_size))
        except ValueError as e:
            raise CountsError("invalid", "routed experts refused: %s" % e) from None
