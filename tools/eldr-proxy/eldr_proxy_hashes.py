"""The KV-block hashes eldr-proxy sends to eldr with a request's blocks and counts.

eldr's signature cache keys per-block expert counts by block hash. When the proxy's hashes equal
the ones vLLM publishes in its KV events (BlockStored / BlockRemoved), the cache knows which
decode or prefill instance holds each block and keeps its counts as long as one does; any other
hash is an *orphan* there: it signs this request, and later requests with the same prefix for
signature_cache.orphan_counts_grace_ms (30 s by default), then it is dropped (see
docs/eldr-proxy.md, "Block hashes").

Three sources, best first:

  vllm     vLLM's own prefix-caching hash, reproduced: sha256_cbor (vllm/utils/hashing.py:
           sha256 over cbor2.dumps(obj, canonical=True)) chained as hash_block_tokens does
           (vllm/v1/core/kv_cache_utils.py): block i = H((parent, tuple(block's token ids),
           extra_keys)), parent of block 0 = NONE_HASH = H(PYTHONHASHSEED) (init_none_hash).
           KV events carry the digest's low 64 bits (maybe_convert_block_hash), which is what
           eldr_client.normalize_hash makes of the digest bytes. Needs the prompt's token ids,
           the instances' PYTHONHASHSEED and `--prefix-caching-hash-algo sha256_cbor`; only
           full blocks are hashed by vLLM. extra_keys: the request's cache_salt on block 0;
           LoRA adapters and multimodal inputs add keys the proxy does not reproduce.
  proxy    the same chain with the proxy's own seed: consistent across requests and proxies that
           share the seed, never equal to vLLM's (orphans in the cache).
  request  no token ids: hashes unique to the request (its id and the block index), so no
           prefix is ever shared through the cache.

The partial last block (fewer than block_size tokens) is never hashed by vLLM; the proxy gives it
a proxy-side hash chained to the last full block, so short prompts still carry their counts.
"""
import hashlib
import struct

try:  # python3-cbor2, the library vLLM's sha256_cbor uses; only the vllm and proxy sources need it
    import cbor2
except ImportError:  # reported by BlockHasher when a source that needs it is asked for
    cbor2 = None

SOURCES = ("vllm", "proxy", "request")

# Domain tags keep the proxy's own hashes apart from vLLM's even for equal inputs.
_PARTIAL_TAG = "eldr-proxy:partial"
_PROXY_SEED_TAG = "eldr-proxy:seed"


def sha256_cbor(obj):
    """vLLM's sha256_cbor: SHA-256 of the canonical CBOR encoding of obj."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


class BlockHasher:
    """Chained block hashes of token-id sequences, for one hash source.

    hash_seed: for "vllm", the PYTHONHASHSEED the vLLM instances run with (a str, as vLLM reads
    it from the environment); for "proxy", any seed shared by the proxies; unused by "request".
    native: an eldr_proxy_native.NativeCounts whose block_hashes computes the same chain in C++
    (the same bytes, tested against cbor2), or None; it hands back the token ids and salts it
    does not take (ints outside int64, other types), which are hashed here.
    """

    def __init__(self, source, hash_seed=None, native=None):
        if source not in SOURCES:
            raise ValueError("block hash source %r: one of %s" % (source, ", ".join(SOURCES)))
        if source != "request" and cbor2 is None:
            raise RuntimeError("block hashes %r need python3-cbor2 (apt-get install "
                               "python3-cbor2)" % source)
        if source == "vllm" and hash_seed is None:
            raise ValueError("vLLM's block hashes need the instances' PYTHONHASHSEED")
        self.source = source
        self.native = native
        if source == "vllm":
            self.none_hash = sha256_cbor(str(hash_seed))
        elif source == "proxy":
            self.none_hash = sha256_cbor((_PROXY_SEED_TAG, str(hash_seed or "")))
        else:
            self.none_hash = None

    def hashes(self, token_ids, block_size, n_tokens=None, cache_salt=None, request_id=""):
        """The hash (32 bytes) of every block of the prompt, full blocks first, then the partial
        tail if any: ceil(n_tokens / block_size) hashes. token_ids: the prompt's token ids (a
        sequence of int; None for the "request" source); n_tokens: the prompt length when
        token_ids is None."""
        n = len(token_ids) if token_ids is not None else int(n_tokens)
        full = n // block_size
        out = []
        if self.source == "request" or token_ids is None:
            base = hashlib.sha256(("eldr-proxy:request:" + str(request_id)).encode()).digest()
            for i in range(-(-n // block_size)):
                out.append(hashlib.sha256(base + struct.pack(">Q", i)).digest())
            return out
        if self.native is not None:
            got = self.native.block_hashes(self.none_hash, token_ids, block_size, cache_salt,
                                           _PARTIAL_TAG)
            if got is not None:
                return got
        parent = self.none_hash
        dumps = cbor2.dumps
        sha = hashlib.sha256
        for i in range(full):
            extra = (cache_salt,) if i == 0 and cache_salt else None
            tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
            parent = sha(dumps((parent, tokens, extra), canonical=True)).digest()
            out.append(parent)
        if n > full * block_size:
            tokens = tuple(token_ids[full * block_size:n])
            out.append(sha(dumps((_PARTIAL_TAG, parent, tokens), canonical=True)).digest())
        return out
