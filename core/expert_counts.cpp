// expert_counts: dense per-request counts and sparse per-block counts.
#include "core/expert_counts.hpp"

#include <algorithm>
#include <array>
#include <string>

namespace eldr {
namespace {

status check_range(const model_geometry& g, std::span<const expert_id> experts, uint32_t begin,
                   uint32_t end) {
  if (begin > end)
    return status::invalid_argument("token range [" + std::to_string(begin) + ", " +
                                    std::to_string(end) + ") is reversed");
  const uint64_t per_token = uint64_t{g.layers} * g.top_k;
  if (uint64_t{end} * per_token > experts.size())
    return status::invalid_argument("token range ends at " + std::to_string(end) +
                                    " but the expert array holds " +
                                    std::to_string(experts.size() / per_token) + " tokens");
  return {};
}

status bad_id(const model_geometry& g, uint32_t token, uint32_t layer, uint32_t id) {
  return status::invalid_argument("expert id " + std::to_string(id) + " at token " +
                                  std::to_string(token) + ", layer " + std::to_string(layer) +
                                  " is >= experts (" + std::to_string(g.experts) + ")");
}

}  // namespace

status add_token_counts(const model_geometry& g, std::span<const expert_id> experts, uint32_t begin,
                        uint32_t end, std::span<uint32_t> counts) {
  if (status s = g.validate(); !s.ok()) return s;
  if (counts.size() != g.width())
    return status::invalid_argument(
        "counts array has " + std::to_string(counts.size()) +
        " entries, expected layers * experts = " + std::to_string(g.width()));
  if (status s = check_range(g, experts, begin, end); !s.ok()) return s;
  const expert_id* p = experts.data() + std::size_t{begin} * g.layers * g.top_k;
  for (uint32_t t = begin; t < end; ++t)
    for (uint32_t l = 0; l < g.layers; ++l) {
      uint32_t* row = counts.data() + std::size_t{l} * g.experts;
      for (uint32_t r = 0; r < g.top_k; ++r, ++p) {
        if (*p >= g.experts) return bad_id(g, t, l, *p);
        ++row[*p];
      }
    }
  return {};
}

result<block_counts> block_counts::from_tokens(const model_geometry& g,
                                               std::span<const expert_id> experts, uint32_t begin,
                                               uint32_t end) {
  if (status s = g.validate(); !s.ok()) return s;
  if (status s = check_range(g, experts, begin, end); !s.ok()) return s;
  const uint32_t tokens = end - begin;
  if (tokens < 1 || tokens > 255)
    return status::invalid_argument("a block holds 1..255 tokens, got " + std::to_string(tokens));
  block_counts b;
  b.tokens_ = tokens;
  b.layer_offsets_.reserve(g.layers + 1);
  b.layer_offsets_.push_back(0);
  const std::size_t stride = std::size_t{g.layers} * g.top_k;
  const std::size_t most_per_layer =
      std::min<std::size_t>(g.experts, std::size_t{tokens} * g.top_k);
  b.ids_.reserve(most_per_layer * g.layers);
  b.counts_.reserve(most_per_layer * g.layers);
  // Only the first E entries are used, zeroed here and left zeroed after every layer.
  std::array<uint8_t, max_experts> per_expert;
  std::fill_n(per_expert.begin(), g.experts, uint8_t{0});
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t t = begin; t < end; ++t) {
      const expert_id* ids = experts.data() + t * stride + std::size_t{l} * g.top_k;
      for (uint32_t r = 0; r < g.top_k; ++r) {
        if (ids[r] >= g.experts) return bad_id(g, t, l, ids[r]);
        ++per_expert[ids[r]];
      }
    }
    for (uint32_t e = 0; e < g.experts; ++e)
      if (per_expert[e] != 0) {
        b.ids_.push_back(static_cast<expert_id>(e));
        b.counts_.push_back(per_expert[e]);
        per_expert[e] = 0;
      }
    b.layer_offsets_.push_back(static_cast<uint32_t>(b.ids_.size()));
  }
  return b;
}

result<block_counts> block_counts::from_parts(const model_geometry& g, uint32_t tokens,
                                              std::vector<uint32_t> layer_offsets,
                                              std::vector<expert_id> ids,
                                              std::vector<uint8_t> counts) {
  if (status s = g.validate(); !s.ok()) return s;
  if (tokens < 1 || tokens > 255)
    return status::invalid_argument("a block holds 1..255 tokens, got " + std::to_string(tokens));
  if (layer_offsets.size() != std::size_t{g.layers} + 1)
    return status::invalid_argument(
        "block counts: " + std::to_string(layer_offsets.size()) +
        " layer offsets, expected layers + 1 = " + std::to_string(g.layers + 1));
  if (ids.size() != counts.size())
    return status::invalid_argument("block counts: " + std::to_string(ids.size()) + " ids but " +
                                    std::to_string(counts.size()) + " counts");
  if (layer_offsets.front() != 0 || layer_offsets.back() != ids.size())
    return status::invalid_argument("block counts: layer offsets must start at 0 and end at " +
                                    std::to_string(ids.size()));
  // Every block of every route request from a prefill whose cache missed comes through here, on
  // the node's frontend thread: check each layer with one branch-free pass (which the compiler
  // vectorises), and walk the layers element by element only to name what is wrong.
  auto layer_valid = [&](uint32_t l) {
    const uint32_t b = layer_offsets[l], e = layer_offsets[l + 1];
    if (b > e || e > ids.size()) return false;
    const expert_id* id = ids.data() + b;
    const uint8_t* count = counts.data() + b;
    const uint32_t n = e - b;
    uint32_t bad = 0, sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>(id[i] >= g.experts);
      bad |= static_cast<uint32_t>(static_cast<uint8_t>(count[i] - 1) >= tokens);  // 1..tokens
      sum += count[i];
    }
    for (uint32_t i = 1; i < n; ++i)
      bad |= static_cast<uint32_t>(id[i] <= id[i - 1]);
    return bad == 0 && sum == tokens * g.top_k;
  };
  bool valid = true;
  for (uint32_t l = 0; l < g.layers && valid; ++l)
    valid = layer_valid(l);
  for (uint32_t l = 0; l < g.layers && !valid; ++l) {
    const uint32_t b = layer_offsets[l], e = layer_offsets[l + 1];
    if (b > e || e > ids.size())
      return status::invalid_argument(
          "block counts: layer offsets decrease or pass the end at layer " + std::to_string(l));
    uint32_t sum = 0;
    for (uint32_t i = b; i < e; ++i) {
      if (ids[i] >= g.experts) return bad_id(g, 0, l, ids[i]);
      if (i > b && ids[i] <= ids[i - 1])
        return status::invalid_argument("block counts: expert ids of layer " + std::to_string(l) +
                                        " are not strictly increasing");
      if (counts[i] < 1 || counts[i] > tokens)
        return status::invalid_argument("block counts: count " + std::to_string(counts[i]) +
                                        " at layer " + std::to_string(l) + " is not in 1.." +
                                        std::to_string(tokens));
      sum += counts[i];
    }
    // Every token picks exactly top_k distinct experts per layer.
    if (sum != tokens * g.top_k)
      return status::invalid_argument(
          "block counts: layer " + std::to_string(l) + " sums to " + std::to_string(sum) +
          ", expected tokens * top_k = " + std::to_string(tokens * g.top_k));
  }
  block_counts out;
  out.tokens_ = tokens;
  out.layer_offsets_ = std::move(layer_offsets);
  out.ids_ = std::move(ids);
  out.counts_ = std::move(counts);
  return out;
}

void block_counts::add_to(const model_geometry& g, std::span<uint32_t> dense) const {
  for (uint32_t l = 0; l + 1 < layer_offsets_.size(); ++l) {
    uint32_t* row = dense.data() + std::size_t{l} * g.experts;
    for (uint32_t i = layer_offsets_[l]; i < layer_offsets_[l + 1]; ++i)
      row[ids_[i]] += counts_[i];
  }
}

result<std::vector<block_counts>> count_blocks(const model_geometry& g,
                                               std::span<const expert_id> experts, uint32_t begin,
                                               uint32_t end, uint32_t block_size) {
  if (block_size < 1 || block_size > 255)
    return status::invalid_argument("block size must be in 1..255, got " +
                                    std::to_string(block_size));
  if (status s = check_range(g, experts, begin, end); !s.ok()) return s;
  std::vector<block_counts> blocks;
  blocks.reserve((end - begin + block_size - 1) / block_size);
  for (uint32_t b = begin; b < end; b += block_size) {
    auto block = block_counts::from_tokens(g, experts, b, std::min(end, b + block_size));
    if (!block.ok()) return block.error();
    blocks.push_back(std::move(block).value());
  }
  return blocks;
}

}  // namespace eldr
