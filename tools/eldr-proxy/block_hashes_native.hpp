// block_hashes_native: vLLM's prefix-caching block hashes (sha256_cbor chained as
// hash_block_tokens chains them) computed in eldr-proxy's compiled library (counts_native.cpp),
// the work eldr_proxy_hashes.BlockHasher does with cbor2 and hashlib, in less CPU time.
//
// Only the shapes BlockHasher hashes are encoded, exactly as cbor2.dumps(obj, canonical=True)
// encodes them (RFC 8949 deterministic encoding: shortest heads):
//   full block i:  (parent: 32 bytes, token ids: tuple of ints, extra: None or (cache_salt,))
//   partial tail:  (partial_tag: str, parent: 32 bytes, token ids: tuple of ints)
// Token ids are int64 here (cbor2 writes any Python int; eldr_proxy_native.py hands the library
// only lists of plain ints inside int64 and lets Python hash anything else). SHA-256 is
// OpenSSL's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/base/status.hpp"

namespace eldr::proxy {

struct block_hash_request {
  std::span<const uint8_t> none_hash;  // parent of block 0: 32 bytes
  std::span<const int64_t> token_ids;  // the prompt's
  uint32_t block_size = 0;             // >= 1
  bool has_salt = false;               // extra = (salt,) on block 0 when has_salt and non-empty
  std::string_view salt;               // UTF-8
  std::string_view partial_tag;        // UTF-8; the tail block's domain tag
};

// The hash of every block, 32 bytes each into out (ceil(tokens / block_size) of them): full
// blocks chained from none_hash, then the partial tail if any, chained to the last full block.
// Errors: invalid_argument for a none_hash that is not 32 bytes, block_size 0, out too small.
status vllm_block_hashes(const block_hash_request& q, std::span<uint8_t> out);

}  // namespace eldr::proxy
