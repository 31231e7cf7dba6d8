// seen_blocks: a router's memory of the blocks whose counts requests brought it, so that a later
// prefix hit on them is summed here instead of asked of a signature-cache shard -- in a cluster,
// usually a message to another node (issue 14: "no per-request remote lookup on the hot path").
//
// It pays where a router sees the blocks it will later be asked about: when clients keep each
// prefill instance's requests at one router (docs/cluster.md, "Prefill-affine routers"), a
// prefix hit is a block that instance computed earlier, so one this router was sent. It is a
// cache in front of the shards, not a copy of them: the shards still store every block (R
// copies, KV events), and a block not held here is asked of them as before.
//
// An entry is one block's counts over the spec's layer mask, as (position in the masked sum,
// count) pairs packed in 32 bits (what add_masked_counts adds; about 1.8 KB a block at 48 x 128,
// top-8, with a 12-of-48 mask: bench/seen_blocks_bench.cpp). It stays exact: a block hash names
// its tokens and all before them, so its counts never change. A new spec object (a set with other
// layers, transform or IDF) empties it. Byte-bounded LRU (storage/memory_caches.hpp's
// counts_lru). Plain class; one per model, on the router's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "actors/messages.hpp"
#include "actors/router/spec_keyed_cache.hpp"
#include "core/expert_counts.hpp"
#include "storage/memory_caches.hpp"

namespace eldr::router {

// entries(), bytes(), budget_bytes(), hits(), misses(): spec_keyed_cache.hpp.
class seen_blocks : public spec_keyed_cache<counts_lru> {
 public:
  // budget_bytes 0: off (every lookup misses, nothing is kept).
  // The budget counts each entry's bookkeeping too (entry_overhead).
  explicit seen_blocks(size_t budget_bytes = 0)
      : spec_keyed_cache(budget_bytes, counts_lru(budget_bytes, entry_overhead)) {}

  // An entry's LRU list node, hash-table node (key, string, list position, cached hash) and
  // their allocations on a 64-bit glibc build: what its bytes() adds to the counts'. Measured
  // 141 bytes (bench/seen_blocks_bench.cpp, seen_memory: the heap an entry takes less its
  // counts), rounded up to malloc's 16-byte step.
  static constexpr size_t entry_overhead = 144;

  // Keeps block `hash`'s counts over `spec`'s mask. Not kept: the cache is off, `counts` has
  // another geometry, or the spec is wider than 2^24 positions (not a model eldr serves).
  void keep(const spec_ptr& spec, uint64_t hash, const block_counts& counts);

  // Adds block `hash`'s kept counts to `acc` (spec->width() entries) and returns true; false,
  // nothing added, when it is not kept under `spec`.
  bool add_to(const spec_ptr& spec, uint64_t hash, std::span<uint32_t> acc);
};

}  // namespace eldr::router
