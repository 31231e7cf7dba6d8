// decode_emulator: D emulated decode workers running continuous batching, as a discrete-event
// engine over an injected clock (model seconds), so that the live loop drives it against the wall
// clock and tests drive it by hand.
//
// Its semantics are core/simulator's decode model, step for step: up to max_batch running
// sequences whose prompt + output tokens fit in kv_capacity_tokens (reserved at admission),
// others waiting first come, first served; a step produces one token for every running sequence
// and lasts decode_cost_model::step_latency_ms of the batch's real distinct experts per layer
// (each running request's current output token, drawn from the workload's decode stream); a
// request finishes with its last output token. TTFT = arrival to first decode token; TPOT =
// (last token - first token) / (output - 1). Fed the same decode arrivals and workers, it
// produces the simulator's first-token and finish times.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <queue>
#include <vector>

#include "core/cost_model.hpp"
#include "core/status.hpp"
#include "core/workload.hpp"

namespace eldr::loadgen {

struct decode_emulator_config {
  uint32_t workers = 16;            // D
  uint32_t max_batch = 64;          // running sequences per worker (core::sim_config's default)
  uint64_t kv_capacity_tokens = 0;  // per worker; 0 = unlimited
  decode_cost_params cost;
};

// A request that emitted its last token.
struct decode_finish {
  uint32_t request = 0;  // index into workload::requests
  uint32_t worker = 0;
  double t = 0.0;  // model seconds
};

// A worker's own view of its load (what its load_report says).
struct decode_worker_load {
  uint32_t running = 0;
  uint32_t waiting = 0;  // queued, or still in KV transfer (arrival scheduled, not yet reached)
  uint32_t in_flight() const { return running + waiting; }
};

// Per-request times (model seconds); negative = not reached yet.
struct decode_times {
  double arrival = -1.0;  // when the request reached its decode worker
  double first_token = -1.0;
  double finish = -1.0;
};

class decode_emulator {
 public:
  // The workload must outlive the emulator. Errors: workers or max_batch 0, a bad cost model.
  static result<std::unique_ptr<decode_emulator>> make(const workload& w,
                                                       const decode_emulator_config& config);

  // Request `request` (index into the workload) reaches decode worker `worker` at model time t
  // (after its KV transfer). A t earlier than the last time advanced to is taken as that time.
  // Precondition: worker < workers, request < requests, each request arrives at most once.
  void arrive(uint32_t request, uint32_t worker, double t);

  // Processes every event (arrivals, step ends) at or before t, in time order (ties: arrivals
  // first, then in the order they were scheduled), appending finished requests to `finished`.
  void advance_to(double t, std::vector<decode_finish>& finished);

  // The next event's time, +infinity when nothing is scheduled.
  double next_event_time() const;
  // No request arrived-but-unfinished, nothing scheduled.
  bool idle() const { return events_.empty(); }
  double now() const { return now_; }

  decode_worker_load load(uint32_t worker) const;
  const decode_times& times(uint32_t request) const { return times_[request]; }
  uint64_t decode_steps() const { return steps_; }
  // Mean over steps of the distinct experts per layer, and of the running sequences.
  double distinct_experts_per_layer() const;
  double batch_size_mean() const;
  // Decode tokens per worker, max / mean (1 = even).
  double load_imbalance() const;
  // In-flight requests per worker (from the request's arrival at the worker, after its KV
  // transfer, to its last token: waiting or running), as integrals over model time: the
  // time-averaged max over workers divided by the time-averaged mean over workers (1 = even; 1
  // when nothing was ever in flight), and the time-averaged mean per worker from time 0 to the
  // last time advanced to.
  double inflight_imbalance() const;
  double inflight_mean() const;
  // The last step's latency of a worker in ms (0 before its first step), for tests.
  double last_step_ms(uint32_t worker) const { return workers_[worker].last_step_ms; }

 private:
  enum class kind : uint8_t { arrival, step_end };
  struct event {
    double t;
    uint8_t rank;  // arrivals before step ends at one instant
    uint64_t seq;
    kind k;
    uint32_t id;      // request (arrival) or worker (step_end)
    uint32_t worker;  // arrival's worker
    bool operator>(const event& o) const {
      if (t != o.t) return t > o.t;
      if (rank != o.rank) return rank > o.rank;
      return seq > o.seq;
    }
  };
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
    uint32_t in_transfer = 0;
    uint64_t tokens = 0;
    double last_step_ms = 0.0;
    uint32_t assigned = 0;  // arrived (after the KV transfer) and not finished
  };

  decode_emulator(const workload& w, const decode_emulator_config& c, decode_cost_model cost,
                  distinct_expert_counter counter);
  void push(double t, kind k, uint32_t id, uint32_t worker);
  // Adds the in-flight integrals' piece from the last accounted time to t.
  void account(double t);
  void start_step(uint32_t worker, double t);
  void end_step(uint32_t worker, double t, std::vector<decode_finish>& finished);

  const workload* w_;
  decode_emulator_config c_;
  decode_cost_model cost_;
  distinct_expert_counter counter_;
  std::vector<worker_state> workers_;
  std::vector<decode_times> times_;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  double now_ = 0.0;
  uint64_t steps_ = 0;
  double distinct_sum_ = 0.0, batch_sum_ = 0.0;
  double accounted_t_ = 0.0, inflight_max_integral_ = 0.0, inflight_mean_integral_ = 0.0;
  std::vector<expert_id> step_ids_;
};

// TPOT and TTFT over the given requests, defined as core/simulator defines them: TTFT = first
// token - arrival_s (the workload's arrival), TPOT = (finish - first token) / (output - 1) for
// requests of >= 2 output tokens. Requests that have not finished are left out and counted.
struct latency_summary {
  double tpot_p50_ms = 0, tpot_p95_ms = 0, tpot_p99_ms = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  uint32_t completed = 0;
  uint32_t incomplete = 0;
};
latency_summary summarize_latency(const workload& w, const decode_emulator& d,
                                  const std::vector<uint32_t>& requests);

}  // namespace eldr::loadgen
