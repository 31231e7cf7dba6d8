// cost_model: parameter validation, the step latency, and distinct-expert counting.
#include "core/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

namespace eldr {
namespace {

status check_coefficient(const char* name, double value) {
  if (!std::isfinite(value) || value < 0.0)
    return status::invalid_argument(std::string("decode cost model: ") + name +
                                    " must be finite and >= 0, got " + std::to_string(value));
  return {};
}

}  // namespace

status decode_cost_params::validate() const {
  if (status s = check_coefficient("base_ms", base_ms); !s.ok()) return s;
  if (status s = check_coefficient("per_distinct_expert_ms", per_distinct_expert_ms); !s.ok())
    return s;
  if (status s = check_coefficient("per_sequence_ms", per_sequence_ms); !s.ok()) return s;
  return check_coefficient("per_context_kilotoken_ms", per_context_kilotoken_ms);
}

result<decode_cost_model> decode_cost_model::make(const decode_cost_params& params) {
  if (status s = params.validate(); !s.ok()) return s;
  return decode_cost_model(params);
}

double decode_cost_model::step_latency_ms(const batch_stats& batch) const {
  return params_.base_ms +
         params_.per_distinct_expert_ms * static_cast<double>(batch.distinct_experts) +
         params_.per_sequence_ms * static_cast<double>(batch.sequences) +
         params_.per_context_kilotoken_ms * (static_cast<double>(batch.context_tokens) / 1000.0);
}

distinct_expert_counter::distinct_expert_counter(const model_geometry& geometry)
    : geometry_(geometry),
      words_((geometry.experts + 63) / 64),
      seen_(size_t{geometry.layers} * words_) {}

result<distinct_expert_counter> distinct_expert_counter::make(const model_geometry& geometry) {
  if (status s = geometry.validate(); !s.ok()) return s;
  return distinct_expert_counter(geometry);
}

result<distinct_expert_stats> distinct_expert_counter::count(std::span<const expert_id> expert_ids,
                                                             std::span<uint32_t> per_layer) {
  const uint32_t layers = geometry_.layers;
  const uint32_t top_k = geometry_.top_k;
  const std::size_t per_request = static_cast<std::size_t>(layers) * top_k;
  if (expert_ids.size() % per_request != 0)
    return status::invalid_argument(
        "distinct experts: " + std::to_string(expert_ids.size()) +
        " expert ids is not a whole number of requests (layers * top_k = " +
        std::to_string(per_request) + " each)");
  if (!per_layer.empty() && per_layer.size() != layers)
    return status::invalid_argument("distinct experts: per-layer output has " +
                                    std::to_string(per_layer.size()) + " slots, expected " +
                                    std::to_string(layers) + " layers");

  std::fill(seen_.begin(), seen_.end(), uint64_t{0});
  const std::size_t requests = expert_ids.size() / per_request;
  for (std::size_t r = 0; r < requests; ++r) {
    const expert_id* ids = expert_ids.data() + r * per_request;
    for (uint32_t l = 0; l < layers; ++l) {
      uint64_t* bits = seen_.data() + std::size_t{l} * words_;
      for (uint32_t j = 0; j < top_k; ++j) {
        const expert_id e = ids[static_cast<std::size_t>(l) * top_k + j];
        if (e >= geometry_.experts)
          return status::invalid_argument("distinct experts: request " + std::to_string(r) +
                                          ", layer " + std::to_string(l) + " names expert " +
                                          std::to_string(e) + " but the model has " +
                                          std::to_string(geometry_.experts));
        bits[e >> 6] |= uint64_t{1} << (e & 63u);
      }
    }
  }

  distinct_expert_stats stats;
  for (uint32_t l = 0; l < layers; ++l) {
    uint32_t n = 0;
    const uint64_t* bits = seen_.data() + std::size_t{l} * words_;
    for (uint32_t w = 0; w < words_; ++w)
      n += static_cast<uint32_t>(std::popcount(bits[w]));
    if (!per_layer.empty()) per_layer[l] = n;
    stats.total += n;
    stats.max_per_layer = std::max(stats.max_per_layer, n);
  }
  stats.mean_per_layer = static_cast<double>(stats.total) / layers;
  return stats;
}

}  // namespace eldr
