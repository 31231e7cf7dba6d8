// prefill_emulator: block hashing, the LRU prefix cache, the vLLM KV-event encoder and the
// prefill clock.
#include "tools/eldr-loadgen/prefill_emulator.hpp"

#include <algorithm>

#include "core/base/msgpack.hpp"

namespace eldr::loadgen {
namespace {

// splitmix64's finaliser: a bijective 64-bit mix with good avalanche.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void prompt_tokens(uint64_t source, uint32_t count, std::vector<uint32_t>& out) {
  out.resize(count);
  const uint64_t base = mix(source ^ 0x70726f6d7074ULL);  // "prompt"
  for (uint32_t t = 0; t < count; ++t)
    out[t] = static_cast<uint32_t>(mix(base + t) >> 33);
}

uint64_t chain_block_hash(std::optional<uint64_t> parent, std::span<const uint32_t> tokens) {
  // The parent's presence is part of the hash, so a first block never equals a later one.
  uint64_t h = mix(parent ? *parent ^ 0x706172656e74ULL : 0x726f6f74ULL);  // "parent" / "root"
  h = mix(h ^ tokens.size());
  for (uint32_t t : tokens)
    h = mix(h ^ t);
  return h;
}

std::vector<uint64_t> block_hashes(std::span<const uint32_t> tokens, uint32_t block_size) {
  std::vector<uint64_t> out;
  if (block_size == 0) return out;
  out.reserve((tokens.size() + block_size - 1) / block_size);
  std::optional<uint64_t> parent;
  for (std::size_t b = 0; b < tokens.size(); b += block_size) {
    const std::size_t n = std::min<std::size_t>(block_size, tokens.size() - b);
    parent = chain_block_hash(parent, tokens.subspan(b, n));
    out.push_back(*parent);
  }
  return out;
}

prefix_cache::prefix_cache(uint32_t capacity_blocks, uint32_t block_size)
    : capacity_(std::max(1u, capacity_blocks)), block_size_(std::max(1u, block_size)) {}

prefill_outcome prefix_cache::prefill(std::span<const uint64_t> hashes,
                                      std::span<const uint32_t> tokens) {
  prefill_outcome out;
  const std::size_t full = std::min<std::size_t>(hashes.size(), tokens.size() / block_size_);
  // Leading hits, touched so that they are the most recently used.
  std::size_t hit = 0;
  while (hit < full) {
    auto it = index_.find(hashes[hit]);
    if (it == index_.end()) break;
    lru_.splice(lru_.begin(), lru_, it->second);
    ++hit;
  }
  out.hit_blocks = static_cast<uint32_t>(hit);
  // Blocks after the first miss are recomputed; the ones still cached (their prefix was evicted)
  // are only touched, the others need room.
  std::vector<std::size_t> fresh;
  for (std::size_t b = hit; b < full; ++b) {
    auto it = index_.find(hashes[b]);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      fresh.push_back(b);
    }
  }
  // This prompt's blocks are now the most recently used: evict from the back, never one of them.
  const std::size_t protected_blocks = full - fresh.size();
  const std::size_t evictable = index_.size() - std::min(index_.size(), protected_blocks);
  const std::size_t room = capacity_ - std::min<std::size_t>(capacity_, index_.size());
  std::size_t store = fresh.size();
  if (store > room + evictable) store = room + evictable;
  kv_event removed;
  removed.type = kv_event_type::block_removed;
  removed.medium = "GPU";
  while (index_.size() + store > capacity_) {
    const uint64_t victim = lru_.back();
    lru_.pop_back();
    index_.erase(victim);
    removed.block_hashes.push_back(victim);
  }
  if (!removed.block_hashes.empty()) out.events.push_back(std::move(removed));
  // One BlockStored per run of consecutive new blocks; each names its first block's parent.
  kv_event stored;
  auto flush = [&] {
    if (!stored.block_hashes.empty()) out.events.push_back(std::move(stored));
    stored = kv_event{};
  };
  std::size_t previous = SIZE_MAX;
  for (std::size_t j = 0; j < store; ++j) {
    const std::size_t b = fresh[j];
    if (b != previous + 1 || previous == SIZE_MAX) {
      flush();
      stored.type = kv_event_type::block_stored;
      if (b > 0) stored.parent_block_hash = hashes[b - 1];
      stored.block_size = block_size_;
      stored.medium = "GPU";
    }
    stored.block_hashes.push_back(hashes[b]);
    for (std::size_t t = b * block_size_; t < (b + 1) * block_size_; ++t)
      stored.token_ids.push_back(tokens[t]);
    lru_.push_front(hashes[b]);
    index_.emplace(hashes[b], lru_.begin());
    previous = b;
  }
  flush();
  return out;
}

void prefix_cache::clear() {
  lru_.clear();
  index_.clear();
}

std::vector<uint8_t> encode_kv_batch(const kv_batch& batch) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_array_header(3);
  w.write_float64(batch.ts);
  w.write_array_header(static_cast<uint32_t>(batch.events.size()));
  auto opt_str = [&](const std::optional<std::string>& s) {
    if (s) {
      w.write_str(*s);
    } else {
      w.write_nil();
    }
  };
  auto opt_int = [&](const std::optional<int64_t>& v) {
    if (v) {
      w.write_int(*v);
    } else {
      w.write_nil();
    }
  };
  auto hashes = [&](const std::vector<uint64_t>& h) {
    w.write_array_header(static_cast<uint32_t>(h.size()));
    for (uint64_t x : h)
      w.write_uint(x);
  };
  for (const kv_event& e : batch.events) {
    switch (e.type) {
      case kv_event_type::block_stored:
        w.write_array_header(12);
        w.write_str("BlockStored");
        hashes(e.block_hashes);
        if (e.parent_block_hash) {
          w.write_uint(*e.parent_block_hash);
        } else {
          w.write_nil();
        }
        w.write_array_header(static_cast<uint32_t>(e.token_ids.size()));
        for (int64_t t : e.token_ids)
          w.write_int(t);
        w.write_int(e.block_size.value_or(0));
        opt_int(e.lora_id);
        opt_str(e.medium);
        opt_str(e.lora_name);
        w.write_nil();  // extra_keys
        opt_int(e.group_idx);
        opt_str(e.kv_cache_spec_kind);
        opt_int(e.kv_cache_spec_sliding_window);
        break;
      case kv_event_type::block_removed:
        w.write_array_header(4);
        w.write_str("BlockRemoved");
        hashes(e.block_hashes);
        opt_str(e.medium);
        opt_int(e.group_idx);
        break;
      case kv_event_type::all_blocks_cleared:
        w.write_array_header(1);
        w.write_str("AllBlocksCleared");
        break;
    }
  }
  opt_int(batch.data_parallel_rank);
  return out;
}

std::array<uint8_t, 8> encode_sequence(uint64_t seq) {
  std::array<uint8_t, 8> out{};
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<uint8_t>(seq >> (56 - 8 * i));
  return out;
}

prefill_clock::prefill_clock(uint32_t workers, double base_ms, double per_token_ms)
    : base_ms_(base_ms), per_token_ms_(per_token_ms) {
  for (uint32_t i = 0; i < std::max(1u, workers); ++i)
    free_at_.push(0.0);
}

double prefill_clock::handoff(double arrival_s, uint32_t uncached_tokens) {
  const double start = std::max(arrival_s, free_at_.top());
  free_at_.pop();
  const double done = start + (base_ms_ + per_token_ms_ * uncached_tokens) / 1000.0;
  free_at_.push(done);
  return done;
}

}  // namespace eldr::loadgen
