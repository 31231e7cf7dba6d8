// shard_sum_cache: see shard_sum_cache.hpp.
#include "actors/router/shard_sum_cache.hpp"

#include <vector>

namespace eldr::router {
namespace {

uint64_t fingerprint(std::span<const uint64_t> blocks) {
  uint64_t f = 0;
  for (uint64_t h : blocks)
    f = list_fingerprint(f, h);
  return f;
}

}  // namespace

bool shard_sum_cache::add_to(const spec_ptr& spec, std::span<const uint64_t> blocks,
                             std::span<uint32_t> acc) {
  if (budget_ == 0 || !spec || blocks.empty()) return false;
  follow(spec);
  const auto* sum = store_.find(blocks.back(), blocks.size(), fingerprint(blocks));
  if (!sum || sum->size() != acc.size()) {
    ++misses_;
    return false;
  }
  for (size_t i = 0; i < acc.size(); ++i)
    acc[i] += (*sum)[i];
  ++hits_;
  return true;
}

void shard_sum_cache::put(const spec_ptr& spec, std::span<const uint64_t> blocks,
                          std::span<const uint32_t> sum) {
  if (budget_ == 0 || !spec || blocks.empty() || sum.size() != spec->width()) return;
  follow(spec);
  store_.put(blocks.back(), std::vector<uint32_t>(sum.begin(), sum.end()), blocks.size(),
             fingerprint(blocks));
}

}  // namespace eldr::router
