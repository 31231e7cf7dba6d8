// shard_sum_cache: a router's memory of what the signature-cache shards answered, so that a
// prefix asked again (a shared system prompt, a conversation's earlier turns, a retried prompt)
// costs no shard request -- in a cluster, usually a message to another node (issue 14: "no
// per-request remote lookup on the hot path").
//
// An entry is the masked sum over exactly one list of block hashes (the blocks a request asked
// of the shards, in prompt order) under one signature spec, kept only when the shards covered
// every block of the list. It stays exact: a block hash names the block's tokens and all before
// them (vLLM's chained prefix hash), so its counts never change; a block evicted from a KV cache
// is computed again when it is used, and its counts then travel with the request. A new spec (a
// set with other layers, transform or IDF) empties the cache.
//
// The entries are the signature cache's own remembered prefix sums (storage/memory_caches.hpp's
// prefix_memo: keyed by the list's last hash, length and fingerprint; byte-bounded LRU). This
// class adds the spec they were summed under and the hit counts. Plain class; one per model, on
// the router's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "actors/messages.hpp"
#include "actors/router/spec_keyed_cache.hpp"
#include "storage/memory_caches.hpp"

namespace eldr::router {

// entries(), bytes(), budget_bytes(), hits(), misses(): spec_keyed_cache.hpp.
class shard_sum_cache : public spec_keyed_cache<prefix_memo> {
 public:
  // budget_bytes 0: off (every lookup misses, nothing is kept).
  explicit shard_sum_cache(size_t budget_bytes = 0)
      : spec_keyed_cache(budget_bytes, prefix_memo(budget_bytes)) {}

  // Adds the kept sum over exactly `blocks` under `spec` to `acc` (spec->width() entries) and
  // returns true; false (nothing added) when it is not kept.
  bool add_to(const spec_ptr& spec, std::span<const uint64_t> blocks, std::span<uint32_t> acc);

  // Keeps `sum` (spec->width() entries), the shards' complete answer for `blocks` under `spec`.
  // An entry larger than the whole budget is not kept.
  void put(const spec_ptr& spec, std::span<const uint64_t> blocks, std::span<const uint32_t> sum);
};

}  // namespace eldr::router
