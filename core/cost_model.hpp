// cost_model: how long one decode step of a worker takes, the clock the simulator advances.
//
// ELDR's premise (docs/method.md, section 8, Fig. 2 of the paper): a MoE decode step is
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

#include "core/base/status.hpp"
#include "core/geometry.hpp"

namespace eldr {

// Coefficients of the linear step model, all in milliseconds.
//
// Defaults: calibrated for a Qwen3-30B-A3B-shaped model (48 MoE layers x 128 experts, top-8) so
// that round-robin's simulated median TPOT versus request rate follows the paper artifact's
// measurements (eldr-artifact-tpot.csv, qwen/task: 15.3, 18.8, 26.8, 25.5, 25.1 ms at 20-100
// req/s). Fitted by least squares of step_ms against the mean distinct experts per layer that
// mixed batches of the calibrated qwen-task workload touch at the batch sizes Little's law gives
// at 20 and 40 req/s (10 and 24 sequences) and at the 64-sequence cap where the artifact's curve
// flattens; docs/evaluation.md has the numbers and the resulting curve.
// - per_distinct_expert_ms = 0.0035: all 48 * 128 experts cost 21.5 ms; a batch of 24 mixed
//   requests (75 distinct per layer) 12.6 ms.
// - base_ms = 6.5: the fixed per-layer parts, attention projections, norms and launches. Per
//   layer that is 0.135 ms against 0.0035 ms per expert: 128 experts cost 3.6x one token's 8,
//   the order of Fig. 2's 4.7x.
// - per_sequence_ms = 0.01: 32 -> 128 sequences adds about 1 ms, the "barely moves with batch
//   size" of Fig. 2.
// - per_context_kilotoken_ms = 0.004: attention reading the KV cache; 64 sequences of 1,000
//   tokens add 0.26 ms.
struct decode_cost_params {
  double base_ms = 6.5;                     // fixed cost of a step
  double per_distinct_expert_ms = 0.0035;   // per distinct (layer, expert) pair in the step
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
// scratch (one E-bit set per layer), so count() never allocates; use one counter per thread.
class distinct_expert_counter {
 public:
  // Errors: the geometry is invalid (model_geometry::validate).
  static result<distinct_expert_counter> make(const model_geometry& geometry);

  const model_geometry& geometry() const { return geometry_; }

  // expert_ids holds each running request's expert choices at this step, request-major: request
  // r, layer l, slot j at [(r * layers + l) * top_k + j]; an empty span is an empty batch.
  // per_layer, when not empty, must have `layers` slots and receives each layer's count.
  // Errors (invalid_argument): size not a multiple of layers * top_k; an id >= experts (the message
  // names request, layer and id); per_layer of the wrong size.
  result<distinct_expert_stats> count(std::span<const expert_id> expert_ids,
                                      std::span<uint32_t> per_layer = {});

 private:
  explicit distinct_expert_counter(const model_geometry& geometry);

  model_geometry geometry_;
  uint32_t words_ = 0;          // 64-bit words per layer: ceil(E / 64)
  std::vector<uint64_t> seen_;  // [l][word]: bit e set = expert e active at layer l
};

}  // namespace eldr
