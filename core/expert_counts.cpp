// expert_counts: dense per-request counts and sparse per-block counts.
#include "core/expert_counts.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <string>

namespace eldr {
namespace {

// block_counts::from_tokens reads a word's eight counts as one little-endian integer.
static_assert(std::endian::native == std::endian::little, "from_tokens assumes little-endian");

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
  const uint32_t n_experts = g.experts;
  const uint32_t k = g.top_k;
  const std::size_t stride = std::size_t{g.layers} * k;
  const uint32_t picks = tokens * k;
  const std::size_t most_per_layer = std::min(n_experts, picks);
  b.ids_.reserve(most_per_layer * g.layers);
  b.counts_.reserve(most_per_layer * g.layers);
  // One byte per expert, zeroed here and left zeroed after every layer. A byte may wrap when a
  // token repeats an expert in its top-k row (255 tokens x k picks can all name one expert), so
  // every layer's counts must sum to tokens * k as well as stay <= tokens: a wrapped count fails
  // the sum, an unwrapped repeat the bound.
  alignas(8) std::array<uint8_t, max_experts> per_expert{};
  const uint32_t words = (n_experts + 7) / 8;
  std::array<expert_id, max_experts> layer_ids;
  std::array<uint8_t, max_experts> layer_counts;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t t = begin; t < end; ++t) {
      const expert_id* ids = experts.data() + t * stride + std::size_t{l} * k;
      for (uint32_t r = 0; r < k; ++r) {
        const expert_id id = ids[r];
        if (id >= n_experts) return bad_id(g, t, l, id);
        ++per_expert[id];
      }
    }
    // The nonzero counts in ascending expert order, eight bytes at a time: a word's nonzero
    // bytes are found with one add (their high bits), then visited by their set bits, so the
    // unpicked experts cost nothing each (the proxy's hot path: 16 tokens x top-8 name about 80
    // of 128 experts).
    uint32_t n = 0;
    uint32_t sum = 0;
    uint32_t most = 0;
    for (uint32_t w = 0; w < words; ++w) {
      uint64_t v;
      std::memcpy(&v, per_expert.data() + 8 * w, sizeof v);
      if (v == 0) continue;
      constexpr uint64_t low7 = 0x7f7f7f7f7f7f7f7fULL;
      for (uint64_t nz = (((v & low7) + low7) | v) & ~low7; nz != 0; nz &= nz - 1) {
        const uint32_t byte = static_cast<uint32_t>(std::countr_zero(nz)) / 8;
        const uint32_t c = (v >> (8 * byte)) & 0xffu;
        layer_ids[n] = static_cast<expert_id>(8 * w + byte);
        layer_counts[n] = static_cast<uint8_t>(c);
        sum += c;
        most = std::max(most, c);
        ++n;
      }
      std::memset(per_expert.data() + 8 * w, 0, sizeof v);
    }
    if (sum != picks || most > tokens)  // a token picks an expert at most once per layer
      return status::invalid_argument(
          "layer " + std::to_string(l) + ": the block's " + std::to_string(tokens) +
          " tokens pick one expert more than once each (repeated ids in a token's top-k row)");
    b.ids_.insert(b.ids_.end(), layer_ids.begin(), layer_ids.begin() + n);
    b.counts_.insert(b.counts_.end(), layer_counts.begin(), layer_counts.begin() + n);
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
