// decode_emulator: D emulated decode workers for the live loop (decode_loop): core's decode_engine
// -- the continuous batching eldr-sim runs -- driven by a discrete-event queue over an injected
// clock (model seconds), so that the live loop drives it against the wall clock and tests drive it
// by hand. What it adds to the engine is the live side's view: requests still in KV transfer,
// each worker's load as its load_report says it, and the time-averaged in-flight balance.
//
// Fed the same decode arrivals and workers, it produces the simulator's first-token and finish
// times (the same engine, the same arithmetic).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <vector>

#include "core/base/status.hpp"
#include "core/sim/decode_engine.hpp"
#include "core/sim/workload.hpp"

namespace eldr::loadgen {

// workers (D), max_batch, kv_capacity_tokens, cost: the engine's own.
using decode_emulator_config = decode_engine_config;

// A worker's own view of its load (what its load_report says).
struct decode_worker_load {
  uint32_t running = 0;
  uint32_t waiting = 0;  // queued, or still in KV transfer (arrival scheduled, not yet reached)
  uint32_t in_flight() const { return running + waiting; }
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
  const decode_engine& engine() const { return engine_; }
  const decode_times& times(uint32_t request) const { return engine_.times(request); }
  uint64_t decode_steps() const { return engine_.decode_steps(); }
  double distinct_experts_per_layer() const { return engine_.distinct_experts_per_layer(); }
  double batch_size_mean() const { return engine_.batch_size_mean(); }
  double load_imbalance() const { return engine_.load_imbalance(); }
  // In-flight requests per worker (from the request's arrival at the worker, after its KV
  // transfer, to its last token: waiting or running), as integrals over model time: the
  // time-averaged max over workers divided by the time-averaged mean over workers (1 = even; 1
  // when nothing was ever in flight), and the time-averaged mean per worker from time 0 to the
  // last time advanced to. The engine's figures (decode_engine), one implementation with
  // eldr-sim's.
  double inflight_imbalance() const { return engine_.inflight_imbalance(); }
  double inflight_mean() const { return engine_.inflight_mean(); }
  // The last step's latency of a worker in ms (0 before its first step), for tests.
  double last_step_ms(uint32_t worker) const { return engine_.last_step_ms(worker); }

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

  explicit decode_emulator(decode_engine engine);
  void push(double t, kind k, uint32_t id, uint32_t worker);
  void push_step(std::optional<double> end, uint32_t worker);

  decode_engine engine_;
  std::vector<uint32_t> in_transfer_;  // per worker: arrivals scheduled, not yet reached
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  double now_ = 0.0;
};

// TPOT and TTFT over the given requests (core's summarize_latency on the emulator's engine).
latency_summary summarize_latency(const workload& w, const decode_emulator& d,
                                  const std::vector<uint32_t>& requests);

}  // namespace eldr::loadgen
