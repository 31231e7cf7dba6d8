// cost_model: how long one decode step of a worker takes, the clock the simulator advances.
//
// ELDR's premise (eldr-method.md, section 8, Fig. 2 of the paper): a MoE decode step is
// memory-bound, its latency grows about linearly with the number of DISTINCT experts the batch
// activates in each layer, and it barely moves with batch size. The model is therefore linear:
//
//   step_ms = base_ms
//           + per_distinct_expert_ms   * (distinct experts, summed over the MoE layers)
//           + per_sequence_ms          * (running sequences)
//           + per_context_kilotoken_ms * (context tokens summed over the sequences) / 1000
//
// Calibration against measured TPOT belongs to the simulator; the defaults are only shaped by
// Fig. 2 (see decode_cost_params).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/geometry.hpp"
#include "core/status.hpp"

namespace eldr {

// Coefficients of the linear step model, all in milliseconds.
//
// Defaults describe a model shaped like Qwen3-30B-A3B (48 MoE layers x 128 experts, top-8):
// - Fig. 2: one layer costs about a + b * e for e distinct experts, 4.7x more at e = 128 than at
//   e = 8 (one token's top-8), so a = 24.4 b. With b = per_distinct_expert_ms = 0.0023, all
//   48 * 128 experts cost 14.1 ms and the 48 fixed per-layer parts (a = 0.056 ms) 2.7 ms.
// - base_ms = 4.0: those 2.7 ms plus about 1.3 ms of attention projections, norms and launches.
// - per_sequence_ms = 0.01: 32 -> 128 sequences adds about 1 ms to an 18 ms step, the "barely
//   moves with batch size" of Fig. 2.
// - per_context_kilotoken_ms = 0.004: attention reading the KV cache; 64 sequences of 1,000
//   tokens add 0.26 ms.
// A full step of 64 sequences over 5,000 distinct experts then takes about 16 ms, the order of the
// artifact's 13-27 ms median TPOT for this model.
struct decode_cost_params {
  double base_ms = 4.0;                     // fixed cost of a step
  double per_distinct_expert_ms = 0.0023;   // per distinct (layer, expert) pair in the step
  double per_sequence_ms = 0.01;            // per running sequence
  double per_context_kilotoken_ms = 0.004;  // per 1,000 context tokens summed over the batch

  // ok, or invalid_argument naming the first coefficient that is NaN, infinite or negative.
  status validate() const;
};

// What one decode step processes.
struct batch_stats {
  uint32_t sequences = 0;         // running sequences (batch size)
  uint64_t distinct_experts = 0;  // distinct (layer, expert) pairs, summed over the MoE layers
  uint64_t context_tokens = 0;    // prompt + generated tokens, summed over the sequences
};

// The validated, immutable model.
class decode_cost_model {
 public:
  // Errors: see decode_cost_params::validate.
  static result<decode_cost_model> make(const decode_cost_params& params);

  const decode_cost_params& params() const { return params_; }
  // Latency of one decode step in ms (>= base_ms). Monotonic non-decreasing in every field of
  // batch; total (the parameters are validated and the inputs are counts).
  double step_latency_ms(const batch_stats& batch) const;

 private:
  explicit decode_cost_model(const decode_cost_params& params) : params_(params) {}
  decode_cost_params params_;
};

// Distinct experts of one step's batch.
struct distinct_expert_stats {
  uint64_t total = 0;           // distinct (layer, expert) pairs, summed over layers
  double mean_per_layer = 0.0;  // total / layers
  uint32_t max_per_layer = 0;   // the busiest layer's count
};

// Counts the distinct experts per layer that a batch activates at one decode step. Owns its
// scratch (one 256-bit set per layer), so count() never allocates; use one counter per thread.
class distinct_expert_counter {
 public:
  // Errors: the geometry is invalid (model_geometry::validate; E <= 256 is what the bit sets hold).
  static result<distinct_expert_counter> make(const model_geometry& geometry);

  const model_geometry& geometry() const { return geometry_; }

  // expert_ids holds each running request's expert choices at this step, request-major: request
  // r, layer l, slot j at [(r * layers + l) * top_k + j]; an empty span is an empty batch.
  // per_layer, when not empty, must have `layers` slots and receives each layer's count.
  // Errors (invalid_argument): size not a multiple of layers * top_k; an id >= experts (the message
  // names request, layer and id); per_layer of the wrong size.
  result<distinct_expert_stats> count(std::span<const uint8_t> expert_ids,
                                      std::span<uint32_t> per_layer = {});

 private:
  explicit distinct_expert_counter(const model_geometry& geometry);

  model_geometry geometry_;
  std::vector<std::array<uint64_t, 4>> seen_;  // per layer: bit e set = expert e active
};

}  // namespace eldr
