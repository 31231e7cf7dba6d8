// Random expert choices in eldr-trace's token-major layout, for tests of counts and signatures.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "core/base/random.hpp"
#include "core/expert_counts.hpp"
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

// The counts (layers x experts) of the first `tokens` tokens of token-major `ids`. A failure to
// count fails the calling test and returns no counts, so the caller's size checks fail too.
inline std::vector<uint32_t> prompt_counts(const model_geometry& g,
                                           const std::vector<expert_id>& ids, uint32_t tokens) {
  std::vector<uint32_t> counts(g.width(), 0);
  if (const status s = add_token_counts(g, ids, 0, tokens, counts); !s.ok()) {
    ADD_FAILURE() << "prompt_counts: " << s.to_string();
    return {};
  }
  return counts;
}

// A random prompt: its token-major ids and their counts over the whole prompt.
struct random_prompt {
  std::vector<expert_id> ids;
  std::vector<uint32_t> counts;  // layers x experts; empty (and the test failed) if not counted
};
inline random_prompt make_random_prompt(const model_geometry& g, uint32_t tokens, uint64_t seed) {
  random_prompt p{random_ids(g, tokens, seed), {}};
  p.counts = prompt_counts(g, p.ids, tokens);
  return p;
}

}  // namespace eldr::testing
