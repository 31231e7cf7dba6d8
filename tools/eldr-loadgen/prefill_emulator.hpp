// prefill_emulator: what an emulated prefill worker does before it asks the node for a decode
// worker, without sockets: it names its prompt's KV blocks (chained block hashes), looks them up
// in its own LRU prefix cache, computes the blocks that missed (their per-block expert counts go
// into the route request), and reports the cache's changes as vLLM KV events (BlockStored for
// newly computed blocks, BlockRemoved for evicted ones), encoded byte for byte as vLLM's msgspec
// encoder writes them (the tagged-array form, ../shared/reference/vllm-kv-events.md).
//
// The workload's prompts carry expert ids but no token ids, so every prompt gets synthetic token
// ids derived from its source request: requests replaying one source (a prompt pool) share all
// their blocks, and different sources share none.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <queue>
#include <span>
#include <unordered_map>
#include <vector>

#include "cluster/wire/kv_events.hpp"

namespace eldr::loadgen {

// Synthetic token ids of a source request's prompt, positions [0, count). Deterministic; < 2^31.
void prompt_tokens(uint64_t source, uint32_t count, std::vector<uint32_t>& out);

// The hash of one KV block: covers its parent's hash (nullopt for a prompt's first block), its
// token count and its token ids, like vLLM's chained block hash. Deterministic on every platform.
uint64_t chain_block_hash(std::optional<uint64_t> parent, std::span<const uint32_t> tokens);

// A prompt's KV blocks: ceil(tokens / block_size) hashes, each chained to the previous one; the
// last block may be partial (fewer tokens), as a KV cache's last block is. Two prompts that share
// their first n * block_size tokens share their first n hashes. block_size >= 1.
std::vector<uint64_t> block_hashes(std::span<const uint32_t> tokens, uint32_t block_size);

// What one prefill did to the prefix cache.
struct prefill_outcome {
  uint32_t hit_blocks = 0;  // leading full blocks served from the cache (not computed)
  // BlockRemoved (evictions, first) then BlockStored (newly cached blocks) events, in the order
  // vLLM would publish them; empty when the cache did not change.
  std::vector<kv_event> events;
};

// One prefill worker's prefix cache: a set of full KV blocks with least-recently-used eviction.
// Only full blocks are cached (a partial last block never is), and only a leading run of cached
// blocks is a hit: after the first miss every block is recomputed. Not thread-safe.
class prefix_cache {
 public:
  // capacity_blocks >= 1: blocks held at most.
  prefix_cache(uint32_t capacity_blocks, uint32_t block_size);

  // Prefills one prompt of `tokens` tokens whose blocks are `hashes` (block_hashes of its
  // tokens). Touches the hit blocks, caches the newly computed full blocks (evicting the least
  // recently used blocks of other prompts to make room; blocks that cannot fit are computed but
  // not cached) and returns the events. BlockStored carries the blocks' token ids.
  prefill_outcome prefill(std::span<const uint64_t> hashes, std::span<const uint32_t> tokens);

  // Drops every block (returns nothing: the caller publishes AllBlocksCleared).
  void clear();
  bool contains(uint64_t hash) const { return index_.count(hash) != 0; }
  std::size_t size() const { return index_.size(); }
  uint32_t block_size() const { return block_size_; }

 private:
  uint32_t capacity_;
  uint32_t block_size_;
  std::list<uint64_t> lru_;  // front = most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

// The payload of one vLLM KV-event batch, [ts, events, data_parallel_rank], every event in the
// tagged-array form with every declared field written (BlockStored 12 elements, BlockRemoved 4,
// AllBlocksCleared 1). Fields of kv_event that vLLM does not declare are not written.
std::vector<uint8_t> encode_kv_batch(const kv_batch& batch);

// The 8-byte big-endian sequence frame of a live message.
std::array<uint8_t, 8> encode_sequence(uint64_t seq);

// When emulated prefills hand their requests over, mirroring core/sim/simulator's prefill model:
// `workers` prefill workers serve requests first come, first served, and a prefill takes
// base_ms + per_token_ms * (uncached prompt tokens). Feed requests in arrival order.
class prefill_clock {
 public:
  prefill_clock(uint32_t workers, double base_ms, double per_token_ms);
  // The handoff time (seconds) of a request arriving at arrival_s with uncached_tokens to compute.
  double handoff(double arrival_s, uint32_t uncached_tokens);

 private:
  double base_ms_, per_token_ms_;
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at_;
};

}  // namespace eldr::loadgen
