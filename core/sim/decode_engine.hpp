// decode_engine: D decode workers running continuous batching -- the one decode model that
// eldr-sim (core/sim/simulator, simulated time) and eldr-loadgen's decode emulator (wall time) both
// drive.
//
// The model:
// - A request that reaches its worker (after its KV transfer) waits first come, first served.
// - Each worker runs up to max_batch sequences whose prompt + output tokens fit in
//   kv_capacity_tokens, reserved at admission so that a running request never stalls; a request
//   larger than the whole capacity runs alone rather than never.
// - A step produces one token for every running sequence and lasts
//   decode_cost_model::step_latency_ms of the batch's REAL distinct experts per layer at that step:
//   the ids of each running request's current output token, from the workload's decode stream.
//   New requests are admitted only between steps.
// - A request finishes with its last output token; one with no output tokens finishes on arrival.
// - TTFT = workload arrival to the first decode token; TPOT = (last token - first token) /
//   (output - 1), for requests of >= 2 output tokens (summarize_latency).
//
// Time belongs to the caller: the engine holds no clock and no event queue. arrive() and
// end_step() take the current time and return when the step they started ends; the caller
// schedules that instant in its own event order and calls end_step() then. So the simulator keeps
// its single insertion-ordered queue (routes, refits and step ends interleave deterministically)
// and the emulator its wall-clock loop, over the same batching and the same arithmetic.
//
// Thread safety: none; one owner drives it.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/base/status.hpp"
#include "core/cost_model.hpp"
#include "core/sim/workload.hpp"

namespace eldr {

struct decode_engine_config {
  uint32_t workers = 16;            // D
  uint32_t max_batch = 64;          // running sequences per worker
  uint64_t kv_capacity_tokens = 0;  // per worker; 0 = unlimited
  decode_cost_params cost;
};

// A request that emitted its last token.
struct decode_finish {
  uint32_t request = 0;  // index into workload::requests
  uint32_t worker = 0;
  double t = 0.0;  // the caller's time
};

// Per-request times in the caller's time; negative = not reached yet.
struct decode_times {
  double arrival = -1.0;  // when the request reached its decode worker
  double first_token = -1.0;
  double finish = -1.0;
};

// The spread of routing decisions over workers, as the cluster benchmark (eldr-loadgen) and
// eldr-sim report it: the population standard deviation of the requests routed to each worker over
// their mean; 0 when nothing was routed.
template <class Count>
double decision_cv(std::span<const Count> per_worker) {
  double sum = 0.0;
  for (Count n : per_worker)
    sum += static_cast<double>(n);
  if (per_worker.empty() || sum <= 0.0) return 0.0;
  const double mean = sum / static_cast<double>(per_worker.size());
  double var = 0.0;
  for (Count n : per_worker)
    var += (static_cast<double>(n) - mean) * (static_cast<double>(n) - mean);
  return std::sqrt(var / static_cast<double>(per_worker.size())) / mean;
}

class decode_engine {
 public:
  // The workload must outlive the engine. Errors (invalid_argument): workers or max_batch 0, a
  // bad cost model, an invalid geometry.
  static result<decode_engine> make(const workload& w, const decode_engine_config& config);

  // Request `request` (index into the workload) reaches decode worker `worker` at t and waits.
  // When the worker was idle it starts a step at t, and the step's end time is returned: the
  // caller must call end_step(worker, that time) then. A request with no output tokens finishes
  // at t instead (appended to `finished`). Preconditions: worker < workers, request < requests,
  // each request arrives once, t not before the worker's last step end.
  std::optional<double> arrive(uint32_t request, uint32_t worker, double t,
                               std::vector<decode_finish>& finished);

  // Ends `worker`'s running step at t (the time arrive() or end_step() returned): every running
  // sequence gets one token, those with their last token finish (appended to `finished`, in batch
  // order) and free their KV reservation; then waiting requests are admitted and the next step
  // starts. Returns its end time, or nullopt when the worker is left idle.
  std::optional<double> end_step(uint32_t worker, double t, std::vector<decode_finish>& finished);

  uint32_t workers() const { return static_cast<uint32_t>(workers_.size()); }
  uint32_t running(uint32_t worker) const {
    return static_cast<uint32_t>(workers_[worker].running.size());
  }
  uint32_t waiting(uint32_t worker) const {
    return static_cast<uint32_t>(workers_[worker].waiting.size());
  }
  const decode_times& times(uint32_t request) const { return times_[request]; }

  uint64_t decode_steps() const { return steps_; }
  // Mean over steps of the distinct experts per layer (averaged over layers), and of the running
  // sequences; 0 before the first step.
  double distinct_experts_per_layer() const;
  double batch_size_mean() const;
  // Decode tokens per worker, max / mean (1 = even, and 1 before any token).
  double load_imbalance() const;
  // In-flight imbalance as the cluster benchmark reports it: the time average of the largest
  // worker's in-flight requests (running + waiting here) divided by the time average of their mean
  // over workers, from time 0 to the last arrive() or end_step() (1 = even, and 1 before any
  // request). Requests still in their KV transfer are not in flight at a worker yet. Exact when
  // the caller's calls come in time order over all workers, as the simulator's and the emulator's
  // event queues make them; a call earlier than the latest adds no time.
  double inflight_imbalance() const;
  // The time average of the mean in-flight requests per worker over the same span (0 before any).
  double inflight_mean() const;
  // Closes the in-flight integrals up to t with the current counts (arrive() and end_step() do
  // it themselves; a caller whose clock runs past the last event calls it to count the idle end).
  void account_to(double t);
  // The latency of the worker's last step in ms (0 before its first step).
  double last_step_ms(uint32_t worker) const { return workers_[worker].last_step_ms; }

 private:
  struct running_request {
    uint32_t request;
    uint32_t generated;
    std::unique_ptr<decode_stream> stream;
  };
  struct worker_state {
    std::deque<uint32_t> waiting;
    std::vector<running_request> running;
    uint64_t kv_used = 0;
    bool stepping = false;
    uint64_t tokens = 0;  // decode tokens produced
    double last_step_ms = 0.0;
  };

  decode_engine(const workload& w, const decode_engine_config& c, decode_cost_model cost,
                distinct_expert_counter counter);
  // Admits what fits and starts a step at t: its end time, or nullopt when nothing runs.
  std::optional<double> start_step(uint32_t worker, double t);

  const workload* w_;
  decode_engine_config c_;
  decode_cost_model cost_;
  distinct_expert_counter counter_;
  std::vector<worker_state> workers_;
  std::vector<decode_times> times_;
  uint64_t steps_ = 0;
  double distinct_sum_ = 0.0, batch_sum_ = 0.0;
  double accounted_t_ = 0.0, inflight_max_integral_ = 0.0, inflight_mean_integral_ = 0.0;
  std::vector<expert_id> step_ids_;  // one step's ids, request-major
};

// TPOT and TTFT (ms) over the given requests, as defined above; TTFT counts from the workload's
// arrival_s. Requests that have not finished are left out and counted as incomplete.
struct latency_summary {
  double tpot_p50_ms = 0, tpot_p95_ms = 0, tpot_p99_ms = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  uint32_t completed = 0;
  uint32_t incomplete = 0;
};
latency_summary summarize_latency(const workload& w, const decode_engine& engine,
                                  std::span<const uint32_t> requests);
// The same over every request of the workload.
latency_summary summarize_latency(const workload& w, const decode_engine& engine);

// Fills the figures every whole-run report takes from its engine -- TPOT and TTFT over all
// requests, decode steps, distinct experts per layer, mean batch -- into a report with those
// fields (eldr-sim's sim_metrics, eldr-loadgen's policy_result): one list, so that a figure
// added here reaches both. Returns the latency summary for the report's own extra fields.
template <class Report>
latency_summary report_run_figures(const workload& w, const decode_engine& engine, Report& r) {
  const latency_summary l = summarize_latency(w, engine);
  r.tpot_p50_ms = l.tpot_p50_ms;
  r.tpot_p95_ms = l.tpot_p95_ms;
  r.tpot_p99_ms = l.tpot_p99_ms;
  r.ttft_p50_ms = l.ttft_p50_ms;
  r.ttft_p99_ms = l.ttft_p99_ms;
  r.decode_steps = engine.decode_steps();
  r.distinct_experts_per_layer = engine.distinct_experts_per_layer();
  r.batch_size_mean = engine.batch_size_mean();
  return l;
}

// Linear-interpolated percentile (q in [0, 1]) of values, 0 when empty. Sorts values.
double percentile(std::vector<double>& values, double q);

}  // namespace eldr
