// shard_sum_cache: see shard_sum_cache.hpp.
#include "actors/router/shard_sum_cache.hpp"

#include <algorithm>

namespace eldr::router {

size_t shard_sum_cache::entry::bytes() const {
  // The vectors' payloads and a fixed share for the list node, the map node and the headers.
  return blocks.size() * sizeof(uint64_t) + index.size() * 2 * sizeof(uint32_t) + 128;
}

uint64_t shard_sum_cache::key_of(std::span<const uint64_t> blocks) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ blocks.size();
  for (uint64_t b : blocks) {
    h ^= b + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
  }
  return h;
}

void shard_sum_cache::follow(const spec_ptr& spec) {
  if (spec == spec_) return;
  // Another spec object: a set with other layers, transform or IDF was installed (the router
  // keeps the object when only the centroids change). Sums under the old one mean nothing now.
  lru_.clear();
  by_key_.clear();
  bytes_ = 0;
  spec_ = spec;
}

bool shard_sum_cache::add_to(const spec_ptr& spec, std::span<const uint64_t> blocks,
                             std::span<uint32_t> acc) {
  if (budget_ == 0 || !spec || blocks.empty()) return false;
  follow(spec);
  auto [first, last] = by_key_.equal_range(key_of(blocks));
  for (auto it = first; it != last; ++it) {
    const entry& e = *it->second;
    if (!std::equal(e.blocks.begin(), e.blocks.end(), blocks.begin(), blocks.end())) continue;
    if (acc.size() != spec->width()) return false;
    for (size_t i = 0; i < e.index.size(); ++i)
      acc[e.index[i]] += e.value[i];
    lru_.splice(lru_.begin(), lru_, it->second);
    ++hits_;
    return true;
  }
  ++misses_;
  return false;
}

void shard_sum_cache::put(const spec_ptr& spec, std::span<const uint64_t> blocks,
                          std::span<const uint32_t> sum) {
  if (budget_ == 0 || !spec || blocks.empty() || sum.size() != spec->width()) return;
  follow(spec);
  const uint64_t key = key_of(blocks);
  auto [first, last] = by_key_.equal_range(key);
  for (auto it = first; it != last; ++it)
    if (std::equal(it->second->blocks.begin(), it->second->blocks.end(), blocks.begin(),
                   blocks.end()))
      return;  // kept already (two requests asked for it before the first answer)
  entry e;
  e.key = key;
  e.blocks.assign(blocks.begin(), blocks.end());
  for (uint32_t i = 0; i < sum.size(); ++i)
    if (sum[i] != 0) {
      e.index.push_back(i);
      e.value.push_back(sum[i]);
    }
  const size_t need = e.bytes();
  if (need > budget_) return;
  evict_to(budget_ - need);
  bytes_ += need;
  lru_.push_front(std::move(e));
  by_key_.emplace(key, lru_.begin());
}

void shard_sum_cache::evict_to(size_t budget) {
  while (bytes_ > budget && !lru_.empty()) {
    auto last = std::prev(lru_.end());
    auto [first, end] = by_key_.equal_range(last->key);
    for (auto it = first; it != end; ++it)
      if (it->second == last) {
        by_key_.erase(it);
        break;
      }
    bytes_ -= last->bytes();
    lru_.erase(last);
  }
}

}  // namespace eldr::router
