// loadgen: plays a workload through a running eldr node over real sockets, with emulated prefill
// workers (route requests with per-block counts, vLLM KV events on their own PUB sockets) and
// emulated decode workers (continuous batching in real time, optionally time-scaled, with load
// reports and finished requests), and measures route round trips, TPOT and TTFT per policy, so
// that eldr-sim's numbers can be checked end to end against the node.
//
// Threads: one thread prepares every request ahead of the timed phase (prefill emulation, KV-event
// batches and route requests encoded to bytes); the caller's thread runs the generator (publishes,
// sends route requests pipelined on one socket, stamps replies); one more thread drives every
// decode worker as a discrete-event loop against the wall clock; with --swap-at, one more imports
// the second centroid set. The generator never spins: while replies are outstanding it sleeps in
// ppoll(2) on the route socket's ZMQ_FD with a nanosecond timeout up to the next send, otherwise
// in sleep_until. The preparation and decode threads wait on condition variables with timeouts;
// the swap thread sleeps in slices of at most 20 ms until its time.
//
// The parts: session.hpp (what the runs share), setup.hpp, run_policy.hpp (one policy's run:
// prepare_pipeline.hpp, generator.hpp over route_socket.hpp and route_book.hpp, decode_loop.hpp,
// hot_swap.hpp), report.hpp, node_restore.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/status.hpp"
#include "core/cost_model.hpp"
#include "tools/common/workload_builder.hpp"

namespace eldr::loadgen {

struct loadgen_options {
  std::string node;  // the node's admin endpoint, e.g. tcp://127.0.0.1:5702
  // Cluster runs: the admin endpoints of the router nodes to spread route requests over (--node
  // may be one of them). Each is asked for its route and worker endpoints; route requests go to
  // them round robin per request (one DEALER connected to every route endpoint); each gets the
  // policy command and the KV-event publishers' registrations. Decode workers register, report and
  // finish at --node's worker endpoint only, and centroids are imported at --node only. Empty =
  // --node's route endpoint alone.
  std::vector<std::string> routers;
  // One weight per --routers entry: router i gets weights[i] of every sum(weights) requests
  // (smooth weighted round robin), e.g. 1,3,3 to give the first router a fixed share while the
  // others carry the rest (bench/cluster_bench.py's fan-in case). Empty = equal shares.
  std::vector<uint32_t> router_weights;
  // --routers-by-prefill: each request goes to the router its prefill worker maps to (prefill
  // worker p -> router p mod N), as a deployment whose clients keep a prefill instance's requests
  // at one router does, so that router has seen every block that prefill worker computed (its
  // prefix hits); instead of the round robin. Not with router_weights.
  bool routers_by_prefill = false;
  // --publishers-at-node-only: the KV-event publishers register at --node only, not at every
  // router, so that only --node's signature cache follows them. Not an exact mirror at the other
  // nodes (they never see their blocks evicted): a measurement of what every cache node applying
  // every KV event costs a cluster (BENCHMARKS.md, "KV events at every cache node, measured").
  bool publishers_at_node_only = false;
  std::string model;  // "" = the first model the node serves
  // The workload (--trace or --synthetic, its shape, seed, calibration, prompt pool, threads,
  // pairs), as eldr-sim's options: the same spec draws the same requests.
  tools::workload_spec workload;
  double rate_rps = 40.0;    // Poisson arrivals
  double duration_s = 30.0;  // requests = ceil(rate * duration), as eldr-sim --requests
  uint32_t decode_workers = 16;
  std::vector<std::string> policies{"eldr", "jsq"};
  std::optional<float> tau;  // sent with the policy command when given
  // Prefill emulation.
  uint32_t prefill_workers = 2;
  uint32_t prefill_cache_blocks = 65536;
  uint32_t block_size = 16;
  double prefill_base_ms = 20.0, prefill_per_token_ms = 0.1, kv_transfer_ms = 5.0;
  bool send_counts = true;
  // Counts of the prefix hits too, with route_request.cached_blocks (eldr-proxy's requests).
  bool counts_of_hits = false;
  // Decode emulation.
  uint32_t max_batch = 64;
  uint64_t kv_capacity_tokens = 0;
  std::optional<uint32_t> capacity;  // registered capacity; default 0 = unbounded (as eldr-sim)
  decode_cost_params cost;
  double time_scale = 1.0;  // model time = wall time * scale
  uint32_t report_ms = 100;
  double drain_s = 300.0;  // wall seconds to wait for decodes after the last route
  // Centroids.
  bool no_import = false;
  // At the end (also after an error or SIGINT) the loadgen sets every router's policy back to what
  // it was, and swaps the node back to the centroid epoch it had before the import, unless this.
  bool keep_centroids = false;
  std::string centroids;  // a centroid file to import instead of fitting
  // Route path.
  bool route_only = false;
  uint32_t max_outstanding = 1024;
  // Requests are prepared (encoded) before the timed phase; runs whose prepared data exceeds
  // this many MiB are prepared by a background thread that stays this far ahead.
  uint64_t prepare_budget_mib = 1024;
  int route_timeout_ms = 2000;
  int subscribe_timeout_ms = 3000;
  // Hot swap under load: this many run-relative seconds into the eldr policy's run, import a
  // second (perturbed) centroid set through the admin endpoint and measure the switch-over.
  std::optional<double> swap_at;  // wait for the node to subscribe to each KV publisher
  // Route latency: replies to requests sent in a run's first warmup_s wall seconds are left out
  // of route_p50/p99/max (they are sent, answered and counted as usual), so those figures
  // describe the steady state and not the start, where every prefill cache is empty and every
  // request carries the counts of all its blocks. route_p99_all_us and route_seconds keep it.
  double warmup_s = 0;
  bool quiet = false;
};

// A hot swap's measurement (--swap-at); times in ms relative to the import's send.
struct swap_result {
  bool attempted = false;  // false: the run ended before swap_at
  std::string error;       // the import failed
  uint64_t epoch_before = 0, epoch_after = 0;
  double import_ms = 0;                      // ack - send
  std::optional<double> first_new_epoch_ms;  // first reply carrying epoch_after (received)
  std::optional<double> last_old_epoch_ms;   // last reply carrying an older epoch (received)
  uint64_t old_epoch_after_ack = 0;          // older-epoch replies to requests sent after the ack
  uint64_t failed_during_swap = 0;  // error replies, timeouts, send errors, sent within +-1 s
  uint64_t requests_in_window = 0;  // requests sent within +-1 s
};

// What one policy's run measured.
struct policy_result {
  std::string policy;
  bool interrupted = false;
  uint64_t sent = 0, replied = 0, errors = 0, error_replies = 0, timeouts = 0;
  std::map<std::string, uint64_t> error_codes;  // error replies by code name
  double offered_rps = 0, route_rps = 0;
  double route_p50_us = 0, route_p99_us = 0, route_max_us = 0;  // after the warm-up
  double route_p99_all_us = 0;                                  // every reply, warm-up included
  // Route round trips by the wall second of the run in which the request was sent.
  struct route_second {
    uint64_t replies = 0;
    double p50_us = 0, p99_us = 0, max_us = 0;
  };
  std::vector<route_second> route_seconds;
  double tpot_p50_ms = 0, tpot_p95_ms = 0, tpot_p99_ms = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  uint32_t completed = 0, incomplete = 0;
  double coverage_mean = 0;         // mean covered_blocks / total_blocks over decisions
  std::vector<uint64_t> decisions;  // per worker
  double decision_imbalance = 0;    // max / mean
  double decision_cv = 0;           // population standard deviation / mean of `decisions`
  // Decode side (not in --route-only runs): a worker's in-flight requests are those that reached
  // it (after the KV transfer) and have not finished (waiting or running). inflight_imbalance =
  // (time integral of max over workers) / (time integral of mean over workers), i.e. the
  // time-averaged max over the time-averaged mean (1 = even); inflight_mean = the time-averaged
  // mean per worker over the run. Both from the decode emulator's own clock (model time).
  double inflight_imbalance = 0, inflight_mean = 0;
  std::vector<uint64_t> epochs;    // distinct epochs seen in replies
  double prefix_hit_fraction = 0;  // prompt blocks served from the prefill caches
  uint64_t kv_blocks_stored = 0, kv_blocks_removed = 0;
  uint64_t decode_steps = 0;
  double distinct_experts_per_layer = 0, batch_size_mean = 0, token_imbalance = 0;
  uint64_t worker_messages = 0, worker_errors = 0;
  double wall_s = 0;
  double cpu_s = 0;  // this process's CPU seconds during the run (is the generator the limit?)
  uint64_t prepare_stalls = 0;  // times the generator waited for preparation (budget exceeded)
  // Requests prepared when the timed phase began; fewer than all = the preparing thread shared the
  // machine with the run (--prepare-budget-mib was full).
  uint64_t prepared_at_start = 0;
  std::optional<swap_result> swap;
};

nlohmann::json to_json(const policy_result& r);

// The run's outcome: exit code 0 on success; 2 for bad options or data; 3 when the node is
// unreachable; 1 for other failures (message says what). 130 when interrupted.
struct loadgen_outcome {
  int exit_code = 0;
  std::string error;
  std::vector<policy_result> results;
  nlohmann::json report;  // top-level fields of the first policy, "policies", the setup
  // What the loadgen changed on the node and what it put back ("changed", "restored" lists of
  // sentences, also in report["node_changes"]); a failed restore is an error (exit 1).
  std::vector<std::string> changed, restored;
};

// Runs the setup and every policy. `stop` (set by a signal handler) ends the current policy's run
// cleanly and skips the others; progress goes to stderr unless options.quiet.
loadgen_outcome run_loadgen(const loadgen_options& options, const std::atomic<bool>& stop);

// The human table (one row per policy, plus ELDR's median TPOT against JSQ's when both ran).
std::string format_table(const std::vector<policy_result>& results);

}  // namespace eldr::loadgen
