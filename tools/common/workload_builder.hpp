// workload_builder: the workload options eldr-sim, eldr-loadgen and eldr-fit share, and the one
// place that turns them into what core/ takes -- the request source, the drawn workload, a whole
// trace, the policy factory's options. The same spec gives the same requests in every tool, which
// is what lets eldr-loadgen print the eldr-sim command line that replays its run offline.
//
// No command line here (tools/common/cli_options.hpp registers the shared options) and no
// printing: every function returns its error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/base/status.hpp"
#include "core/formats/trace.hpp"
#include "core/signature_quality.hpp"
#include "core/sim/sim_policies.hpp"
#include "core/sim/synthetic.hpp"
#include "core/sim/workload.hpp"

namespace eldr::tools {

// A synthetic workload's requests as eldr-sim and eldr-loadgen shape them (the paper's testbed:
// prompts of 4-1024 tokens, log-uniform, and 512 output tokens).
struct synthetic_shape {
  uint32_t prompt_min = 4, prompt_max = 1024;
  uint32_t output_tokens = 512;
  uint32_t decode_pool = 64;  // synthetic_model::open_decode's pool_tokens
  uint32_t subdomains = 0;    // synthetic_params::subdomains and subdomain_weight
  double subdomain_weight = 0.5;
};

// What a tool's command line says about its workload. The defaults are the tools' defaults.
struct workload_spec {
  // Exactly one: an eldr-trace file (v1 or v2), or a synthetic preset (synthetic_preset_names()).
  std::string trace_path;
  std::string synthetic;
  // The synthetic requests' lengths; nullopt keeps the preset's own (eldr-fit's).
  std::optional<synthetic_shape> shape = synthetic_shape{};
  uint64_t seed = 1;                   // synthetic requests, the draw, the fits
  uint32_t calibration = 1000;         // calibration requests, disjoint from the evaluated ones
  double calibration_fraction = 0.5;   // traces: the share of their requests kept for calibration
  uint32_t prompt_pool = 0;            // workload_options::prompt_pool (0 = each its own prompt)
  uint32_t drift_phases = 0;           // workload_options::drift_phases (a drifting workload)
  uint32_t threads = 2;                // workload preparation and fits
  uint32_t pairs = default_rho_pairs;  // random pairs for rho in the calibration fit
};

// The checks a command line does not make: exactly one of trace_path and synthetic, and
// prompt_min <= prompt_max. Errors: invalid_argument, naming the options as the tools spell them.
// The preset's name is checked where the source is made.
status check_workload_spec(const workload_spec& spec);

// The source's name in reports and centroid provenance: the trace's path, or "synthetic:NAME".
std::string source_name(const workload_spec& spec);

// The spec's preset with its shape, seed and threads, for `requests` requests. Errors: an
// unknown preset (invalid_argument, listing the valid ones).
result<synthetic_params> synthetic_params_for(const workload_spec& spec, uint32_t requests);

// A request source the workload draws from, and what the tools say about it.
struct workload_source {
  std::shared_ptr<const request_source> source;
  uint64_t size = 0;       // a trace's requests; 0 for the synthetic model (unbounded)
  std::string name;        // source_name(spec)
  std::string model_name;  // the trace's model description, or the preset's
};

// The trace, read into memory, or the synthetic model, drawn lazily. `requests` is how many the
// workload will take from it (evaluated + calibration); the lazy model draws request i from
// (seed, i) alone, so its size bound (validate_synthetic_params' 2^34 bytes, which only a written
// trace needs) is capped to what the validation accepts: a long route benchmark is not refused.
// Errors: the trace file's, and the synthetic ones prefixed "--synthetic: ".
result<workload_source> open_source(const workload_spec& spec, uint64_t requests);

// Draws `requests` evaluated requests with Poisson arrivals at rate_rps (0: a trace's own
// arrival_s) and the spec's calibration requests from the source (make_workload).
result<workload> draw_workload(const workload_source& source, const workload_spec& spec,
                               uint32_t requests, double rate_rps);

// The whole trace, for a fit or a file: read, or generated from the preset with `requests`
// requests (0: the preset's own count). Errors: the trace file's, and the synthetic ones prefixed
// "--synthetic: ".
result<trace> load_trace(const workload_spec& spec, uint32_t requests);

// The policy factory's options for `workers` decode workers: the spec's seed (also the online
// refit's), threads and pairs. The rest (tau, load slack, the refit sample and interval, centroids)
// is the caller's.
policy_factory_options policy_options(const workload_spec& spec, uint32_t workers);

}  // namespace eldr::tools
