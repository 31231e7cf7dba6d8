// Random expert choices in eldr-trace's token-major layout, for tests of counts and signatures.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "core/base/random.hpp"
#include "core/geometry.hpp"

namespace eldr::testing {

// Token-major ids for `tokens` tokens: each token picks k distinct experts per layer, uniformly.
inline std::vector<expert_id> random_ids(const model_geometry& g, uint32_t tokens, uint64_t seed) {
  rng_engine rng(seed);
  std::vector<expert_id> ids;
  std::vector<expert_id> pool(g.experts);
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t l = 0; l < g.layers; ++l) {
      std::iota(pool.begin(), pool.end(), expert_id{0});
      for (uint32_t r = 0; r < g.top_k; ++r) {  // partial Fisher-Yates: k distinct ids
        std::swap(pool[r], pool[r + uniform_index(rng, g.experts - r)]);
        ids.push_back(pool[r]);
      }
    }
  return ids;
}

}  // namespace eldr::testing
