// synthetic: a seeded generator of synthetic expert-routing traces, for tests, benchmarks and
// simulations at sizes and geometries the two recorded traces do not cover.
//
// The model behind it, coarse on purpose (the presets are calibrated against the paper's locality
// figures, see docs/evaluation.md):
// - Each domain (task or language) prefers its own experts at each layer: a random permutation of
//   the E experts weighted Zipf-like, weight(rank r) ~ 1 / (r + 1)^zipf_exponent, blended with a
//   global distribution shared by all domains (global_blend = 1 removes all locality).
// - Each request mixes its domain's distribution with one other domain's (weight drawn uniformly
//   in [0, secondary_weight_max]) and jitters every expert's weight by a log-normal factor
//   (sigma = request_noise), so two requests of one domain are alike but not identical.
// - Each token picks top_k DISTINCT experts per layer from its request's distribution, sampling
//   without replacement; with probability reuse_probability it keeps each of the previous token's
//   experts at that layer, as real routers do between neighbouring tokens.
// - Prompt and output tokens come from the same request distribution, so prefill predicts decode.
// Resolution: expert weights are sampled through alias tables with 24-bit coins, and the reuse
// probability with 16-bit coins; finer differences than that are not represented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"
#include "core/formats/trace.hpp"
#include "core/geometry.hpp"

namespace eldr {

struct synthetic_params {
  std::string preset = "custom";  // recorded in trace::source
  std::string model_name = "synthetic";
  model_geometry geometry{48, 128, 8};

  // One label per domain, distinct and non-empty; requests draw their domain uniformly.
  std::vector<std::string> domains{"code", "math", "medical", "legal"};
  double zipf_exponent = 1.0;         // >= 0; 0 = uniform within a domain
  double global_blend = 0.2;          // in [0, 1]: weight of the shared distribution
  double secondary_weight_max = 0.2;  // in [0, 1]: per-request weight of a second domain
  double request_noise = 0.4;         // in [0, 10]: sigma of the per-request log-normal jitter
  double reuse_probability = 0.3;     // in [0, 1]: keep each previous-token expert
  // Topics below the domains: each domain has this many sub-domain distributions (0..64), and a
  // request blends one of them (uniformly chosen) into its domain's with subdomain_weight in
  // [0, 1]. 0 (the presets) = no structure below the domain, where grouping by domain is the
  // best any routing can do; with topics, finer clusters than the domains pay off.
  uint32_t subdomains = 0;
  double subdomain_weight = 0.5;

  // Lengths are log-uniform integers in [min, max] (equal bounds give a fixed length).
  uint32_t prompt_min = 64;  // >= 1
  uint32_t prompt_max = 512;
  uint32_t output_min = 64;
  uint32_t output_max = 64;

  uint32_t requests = 1000;
  // Poisson arrivals at this rate (requests per second) when > 0; arrival_s absent when 0.
  double arrival_rate = 0.0;
  uint64_t seed = 1;
  // Worker threads for generate_synthetic, in 1..256. The trace does not depend on it: request i
  // is drawn from its own stream seeded by (seed, i).
  uint32_t threads = 1;
};

// ok, or invalid_argument naming the first parameter out of its documented range. Also rejects
// parameters whose largest possible trace would exceed 2^34 bytes of expert ids (out_of_range):
// a typo in `requests` should fail, not exhaust memory.
status validate_synthetic_params(const synthetic_params& p);

// The named presets, with the paper's geometries:
//   qwen-task      Qwen3-30B-A3B shape (48 x 128, top-8), 4 task domains, strong locality
//   qwen-language  same shape, 6 language domains, weaker locality
//   gpt-oss-task   GPT-OSS-120B shape (36 x 128, top-4), 4 task domains, strong locality
//   no-locality    qwen-task shape and labels, but every domain shares one distribution
//   kimi-k2-task   Kimi K2 shape (60 x 384, top-8), qwen-task's locality (not calibrated)
//   qwen3-next-task  Qwen3-Next shape (48 x 512, top-10), qwen-task's locality (not calibrated)
// Override any field (requests, lengths, seed...) on the returned value. An unknown name returns
// invalid_argument listing the valid ones.
result<synthetic_params> synthetic_preset(std::string_view name);
std::vector<std::string_view> synthetic_preset_names();
// The same names, comma-separated, for help texts and errors.
std::string synthetic_preset_list();

// Generates the trace. The same params (seed included, threads excluded) give the same trace on
// every run, and on every platform with the same floating-point library: all randomness comes from
// std::mt19937_64 through core/base/random.hpp and this file's own distributions, never the
// standard library's (whose outputs differ between implementations). Request i depends only on the
// params and i (its arrival time also on the requests before it), so a longer run extends a shorter
// one. The result passes validate_trace; ids are "syn-<index>", labels the domain names. Cost:
// about 12-15 ns per expert id per thread (qwen-task, 2,000 requests = 216 M ids). Errors: those of
// validate_synthetic_params.
result<trace> generate_synthetic(const synthetic_params& p);

// What request i of a synthetic workload is, before any token is routed.
struct synthetic_request_info {
  uint32_t domain = 0;  // index into synthetic_params::domains
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
};

class synthetic_decode_sampler;

// The generator's model without the trace: for consumers that cannot hold every token in memory
// (the simulator: 7,200 requests x 512 output tokens x 48 layers x 8 ids would be 1.4 GB). Request
// i is the same request as generate_synthetic's request i (same domain, lengths and distribution,
// same prompt tokens); its decode tokens are drawn lazily, from the same distribution with the
// same reuse rule, through a faster stream of their own (so they are a different draw than the
// output tokens a written trace holds). i may exceed params().requests: a longer workload extends
// a shorter one, which is how a simulation takes calibration requests disjoint from its evaluated
// ones. Immutable and thread-safe after make().
class synthetic_model {
 public:
  // Errors: those of validate_synthetic_params.
  static result<synthetic_model> make(const synthetic_params& p);

  const synthetic_params& params() const { return params_; }
  const model_geometry& geometry() const { return params_.geometry; }
  synthetic_request_info info(uint64_t i) const;
  // Request i's prompt expert ids, token-major as in eldr-trace (prompt_tokens * L * k ids),
  // identical to generate_synthetic's request i. Reuses out's capacity.
  void prompt_experts(uint64_t i, std::vector<expert_id>& out) const;
  // A sampler of request i's decode tokens, positioned at its first output token. Costs one
  // rebuild of the request's distribution (L * E normals, about 0.1 ms for 48 x 128).
  //
  // pool_tokens = 0: every token is drawn afresh (about 7 ns per id). pool_tokens = T > 0: T
  // consecutive tokens are drawn once, and each next() returns one of them chosen uniformly,
  // about 50 ns per token. Every token is still an exact draw from the request's profile, and
  // the tokens of different requests stay independent, which is all that the distinct experts of
  // a batch at one step depend on; what is lost is the correlation between a request's own
  // consecutive tokens (reuse_probability). The simulator uses T = 64 by default, which makes
  // a 7,200-request run of 512-token outputs several times faster.
  synthetic_decode_sampler open_decode(uint64_t i, uint32_t pool_tokens = 0) const;

 private:
  synthetic_params params_;
  std::shared_ptr<const std::vector<double>> domain_weights_;  // [d][l][e]
};

// Draws one request's decode tokens, one at a time, deterministically from (seed, request). Any
// number of tokens may be drawn (the request's output_tokens is not enforced). Move-only; not
// thread-safe (one sampler per running request).
class synthetic_decode_sampler {
 public:
  synthetic_decode_sampler();
  synthetic_decode_sampler(synthetic_decode_sampler&&) noexcept;
  synthetic_decode_sampler& operator=(synthetic_decode_sampler&&) noexcept;
  ~synthetic_decode_sampler();

  // Writes the next token's L * k ids (layer-major, k distinct ids per layer) to out.
  void next(expert_id* out);

 private:
  friend class synthetic_model;
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace eldr
