// workload: the requests a simulation serves, and where their expert ids come from
// (eldr-sim's two sources: replay of an eldr-trace file, or the synthetic model).
//
// A workload is built once and shared by every simulated policy, so each policy serves exactly the
// same requests, arriving at the same times, routing the same expert ids. Evaluated requests are
// drawn from the source's evaluation pool and calibration requests from a disjoint pool (a seeded
// split of a trace's requests; indices past the evaluated ones for the synthetic model).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.hpp"
#include "core/formats/trace.hpp"
#include "core/geometry.hpp"
#include "core/signature_quality.hpp"
#include "core/sim/synthetic.hpp"

namespace eldr {

// One request's decode tokens, one at a time (the cursor a decode worker advances every step).
class decode_stream {
 public:
  virtual ~decode_stream() = default;
  // Writes the next output token's L * k ids (layer-major) to out.
  virtual void next(expert_id* out) = 0;
};

// Where requests' expert ids come from. Indices are the source's own (a trace's request index, the
// synthetic model's request number). Implementations are immutable and thread-safe.
class request_source {
 public:
  virtual ~request_source() = default;
  virtual const model_geometry& geometry() const = 0;
  virtual uint32_t prompt_tokens(uint64_t i) const = 0;
  virtual uint32_t output_tokens(uint64_t i) const = 0;
  virtual const std::string& label(uint64_t i) const = 0;
  // Prompt ids, token-major as in eldr-trace (prompt_tokens * L * k ids); reuses out.
  virtual void prompt_experts(uint64_t i, std::vector<expert_id>& out) const = 0;
  virtual std::unique_ptr<decode_stream> open_decode(uint64_t i) const = 0;
  // Adds the counts of the request's decode tokens (its real decode-phase profile) to a dense
  // L * E array. For the synthetic model this draws the whole decode stream once.
  virtual void add_decode_counts(uint64_t i, std::span<uint32_t> counts) const = 0;
};

// A trace held in memory. Its requests must be valid for its geometry (read_trace_file ensures it).
std::unique_ptr<request_source> make_trace_source(std::shared_ptr<const trace> t);
// pool_tokens: see synthetic_model::open_decode (0 = every decode token drawn afresh).
std::unique_ptr<request_source> make_synthetic_source(std::shared_ptr<const synthetic_model> m,
                                                      uint32_t pool_tokens = 64);

// One evaluated request.
struct sim_request {
  uint64_t source = 0;  // index in the request source
  double arrival_s = 0.0;
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
  int32_t label = -1;      // index into workload::labels, -1 = unknown
  uint32_t prompt_id = 0;  // prefix caching: which pool prompt (equal ids share their blocks)
};

// How to draw the evaluated and calibration requests.
struct workload_options {
  uint32_t requests = 1000;     // evaluated requests
  uint32_t calibration = 1000;  // calibration requests (disjoint from the evaluated ones)
  // Poisson arrivals at this rate; 0 = the source's own arrival_s (traces only; then requests
  // are replayed in trace order without resampling, as many as asked for, at most the pool).
  double rate_rps = 40.0;
  uint64_t seed = 1;
  // Trace sources: fraction of the trace's requests set aside for calibration (seeded split).
  double calibration_fraction = 0.5;
  // Prefix caching: evaluated prompts are drawn with replacement from a pool of this many
  // distinct prompts; 0 = every request has its own prompt.
  uint32_t prompt_pool = 0;
  // A drifting workload, for the online refit to follow: with N > 1 the labels (in order of first
  // calibration use) are cut into N contiguous groups, and the evaluated requests come group
  // after group -- the first group's mix of domains, then the next's -- arrival times unchanged;
  // unlabelled requests go with the first group. 0 or 1: one stationary mix. Needs rate_rps > 0.
  uint32_t drift_phases = 0;
  uint32_t threads = 2;  // for counting prefill tokens
};

struct workload {
  std::shared_ptr<const request_source> source;
  std::vector<std::string> labels;    // label index -> name, in order of first calibration use
  std::vector<sim_request> requests;  // by arrival time
  std::vector<uint64_t> calibration;  // source indices of the calibration requests
  // Dense prefill counts (L * E) per distinct evaluated source index: prefill_row[k] is the row
  // of requests whose source is prefill_sources[k].
  std::vector<uint64_t> prefill_sources;
  std::vector<uint32_t> prefill_counts;
  std::vector<uint32_t> prefill_row_of_request;  // per evaluated request
  std::vector<uint64_t> domain_counts;           // calibration requests per label index

  const model_geometry& geometry() const { return source->geometry(); }
  std::span<const uint32_t> prefill_of(std::size_t request) const;
};

// Draws the workload: evaluated requests (resampled with replacement from the evaluation pool of
// a trace, or synthetic requests 0..N-1), their arrival times and prefill counts, and the
// calibration requests. Errors: a trace with fewer than 2 requests, an empty evaluation or
// calibration pool, rate_rps < 0, rate 0 with a trace lacking arrival_s or with drift_phases > 1.
result<workload> make_workload(std::shared_ptr<const request_source> source, uint64_t source_size,
                               const workload_options& options);

// Prefill and decode counts of the calibration requests, for the offline fit (rho needs decode).
calibration_counts count_calibration(const workload& w, uint32_t threads = 2);

}  // namespace eldr
