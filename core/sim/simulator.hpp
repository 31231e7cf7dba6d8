// simulator: a discrete-event model of a prefill/decode-disaggregated MoE cluster, the engine of
// eldr-sim. It routes with the very same routing_policy objects the router runs (make_policy),
// builds signatures with the same signature_builder, runs decode on the decode_engine that
// eldr-loadgen's emulated workers run, and refits through the node's refit path (core/refit).
//
// The model:
// - Requests arrive at the workload's times. P prefill workers serve them first come, first
//   served; a prefill takes prefill_base_ms + prefill_per_token_ms * (uncached prompt tokens).
// - At the prefill-to-decode handoff the policy under test picks a decode worker (its load: the
//   worker's in-flight decode requests, +1 when routed, -1 when the request's last token is out);
//   the KV transfer then takes kv_transfer_ms.
// - Each of D decode workers runs continuous batching (core/sim/decode_engine.hpp): up to max_batch
//   sequences within kv_capacity_tokens, steps priced by decode_cost_model on the batch's REAL
//   distinct experts per layer (recorded in a trace, or drawn from the request's own profile for
//   synthetic ones), here in simulated time.
// - TTFT = arrival to the first decode token; TPOT = (last token - first token) / (output - 1).
// Deterministic: the same workload, config and policy give the same metrics (only wall_seconds
// varies). Ties between events at the same instant resolve by insertion order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.hpp"
#include "core/cost_model.hpp"
#include "core/refit.hpp"
#include "core/routing.hpp"
#include "core/signature.hpp"
#include "core/sim/decode_engine.hpp"
#include "core/sim/workload.hpp"

namespace eldr {

struct sim_config {
  uint32_t prefill_workers = 8;     // P (the paper's testbed: 8 prefill + 16 decode)
  uint32_t decode_workers = 16;     // D
  uint32_t max_batch = 64;          // running sequences per decode worker
  uint64_t kv_capacity_tokens = 0;  // per decode worker; 0 = unlimited
  double prefill_base_ms = 20.0;
  double prefill_per_token_ms = 0.1;
  double kv_transfer_ms = 5.0;
  decode_cost_params cost;
  // Prefix caching: prompt blocks computed before (same workload prompt_id, same block) are not
  // prefilled again, and signatures are summed from per-block expert counts held in a
  // block-level signature cache (docs/method.md section 7). Blocks are never evicted.
  bool prefix_caching = false;
  uint32_t block_size = 16;  // tokens per KV block, 1..255

  // A cluster of routers (docs/cluster.md, "Load: one authority per worker"). The k-th routing
  // decision (in handoff order) goes to router k mod routers, as eldr-loadgen sends its k-th route
  // request to router k mod routers. Each router routes with its own policy instance on its own
  // load view: the true in-flight count of every worker at the last load-sharing instant, plus its
  // own decisions since then. Its peers' decisions and the workers' finishes reach it only at the
  // next instant. Every router syncs at the same instants 0, load_sync_ms, 2 load_sync_ms, ...:
  // one authority publishes one load vector per interval to every router. With routers == 1 the
  // router is its own authority and its view is exact; load_sync_ms == 0 makes every view exact.
  uint32_t routers = 1;       // R, 1..4096
  double load_sync_ms = 5.0;  // cluster.load_sync_ms; finite and >= 0
  // Intervals by which the routers' decisions reach the shared vector late, 0..16. 0: a vector
  // carries every decision up to its instant. 1: only those up to the previous instant, as when
  // each router's totals reach the authority just after it published (docs/cluster.md: totals
  // travel at each router's own tick, the vector at the authority's). A router still adds its own
  // decisions that the vector does not carry; a worker whose load minus the missing decisions
  // would be negative counts 0.
  uint32_t load_sync_lag = 0;
  // Each router also counts its peers' decisions the vector does not carry yet as (R' - 1) times
  // its own (core/membership/load_exchange.hpp, peer_estimate), as the node does with
  // cluster.peer_estimate (its default). R' is the routers the vectors showed deciding within
  // peer_activity_window_ms, itself included (core/membership/router_activity.hpp): a router
  // whose decisions entered a vector at a sharing instant counts from then on. false: own
  // decisions only.
  bool peer_estimate = true;
  // An ablation of R': 0 = as above (the node's rule); N = N always, whoever decides (the node's
  // rule before router_activity: the membership's routers), 1..4096.
  uint32_t peer_estimate_routers = 0;
  // Routers that get requests, 1..routers: the k-th decision goes to router k mod this; the
  // others only listen (a standby router, clients that prefer some nodes). 0 = all routers.
  uint32_t routers_with_traffic = 0;

  // ok, or invalid_argument naming the first bad field.
  status validate() const;
};

// Where a policy's signatures come from.
enum class signature_source {
  none,            // load-only policies
  prefill,         // ELDR: the prompt's expert counts (or the sum of its cached blocks' counts)
  decode_profile,  // the clairvoyant bound: the request's real decode-phase counts
};

// ELDR with online refit (docs/method.md section 6), run as the node runs it (actors/refit_actor):
// every routed signature is offered to a reservoir sample of sample_size rows (signature_sample,
// the router's); every interval_s of simulated time, once rule.min_sample rows are held,
// refit_candidate fits K centroids seeded from the current ones, aligns them to the workers and
// validates them against the current set on the same sample (refit_rule: the node's knobs and
// their defaults); only an accepted candidate is installed. The first refit comes interval_s after
// the first handoff, as the node's first comes one interval after it starts.
struct online_refit {
  bool enabled = false;
  uint32_t sample_size = 4096;  // models.sample_size
  uint64_t sample_horizon = 0;  // models.sample_horizon (0: automatic, 8 x sample_size)
  double interval_s = 2.0;      // models.refit_interval_s
  refit_rule rule;              // min_sample, validation, seed (the sample's and the fits')
};

// Builds router `router`'s own instance of a policy (router >= 1; router 0 routes with
// sim_policy::policy): make_policy with the same name, centroids and configuration, and for the
// seeded policies ("random", "p2c") a seed of its own, as separate router processes would have.
using router_policy_maker = std::function<result<std::unique_ptr<routing_policy>>(uint32_t router)>;

// A policy under test. Owns its routing_policy (whose state, e.g. a round-robin cursor, the
// simulation advances); a sim_policy serves one simulate() call.
struct sim_policy {
  std::string name;  // as reported ("eldr", "eldr/tau=0.2", "clairvoyant"...)
  std::unique_ptr<routing_policy> policy;
  // Required when sim_config::routers > 1: the other routers' instances, made at the start of
  // simulate(). Each must route over the same workers as `policy`, and be of the same name.
  router_policy_maker more_routers;
  signature_source signatures = signature_source::none;
  std::shared_ptr<const signature_spec> spec;  // required unless signatures == none
  online_refit refit;                          // needs an "eldr" or "eldr-adaptive" policy
};

struct sim_metrics {
  std::string policy;
  uint32_t requests = 0;  // evaluated
  double tpot_p50_ms = 0, tpot_p95_ms = 0, tpot_p99_ms = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  // Mean over all decode steps of the distinct experts per layer (averaged over layers).
  double distinct_experts_per_layer = 0;
  double batch_size_mean = 0;  // mean running sequences per decode step
  // Per-worker decode tokens: max / mean (1 = perfectly even).
  double load_imbalance = 0;
  // The cluster benchmark's decision imbalance figures (bench/cluster_bench.py, eldr-loadgen):
  // time-averaged in-flight max / mean over the workers (decode_engine::inflight_imbalance) and
  // the population standard deviation over the mean of the requests routed to each worker.
  double inflight_imbalance = 0;
  double decision_cv = 0;
  std::vector<uint32_t> decisions;  // requests routed to each worker (D entries)
  uint32_t routers = 1;             // as configured
  double load_sync_ms = 0.0;        // as configured
  // Load-sharing instants simulated (0 when every view is exact: one router, or load_sync_ms 0).
  uint64_t load_syncs = 0;
  double throughput_tokens_s = 0;  // output tokens / (last finish - first arrival)
  double throughput_requests_s = 0;
  double makespan_s = 0;
  uint64_t decode_steps = 0;
  uint32_t refits = 0;  // online refits installed
  // Online refits that installed nothing (sample below min_sample, a failed fit, a candidate
  // that failed validation): what the node counts as rejected.
  uint32_t refits_rejected = 0;
  double prefix_hit_fraction = 0;  // prompt tokens served from the prefix cache
  double wall_seconds = 0;         // host time of the run (the only non-deterministic field)
};

// Called with the fraction of requests finished, at most every 5% and at the end.
using sim_progress = std::function<void(double)>;

// Runs one policy over the workload. decode_counts (optional, needed by decode_profile
// policies): dense L * E decode counts per evaluated request's prefill row (parallel to
// w.prefill_sources), see decode_profiles().
// Several routers (config.routers > 1) each route with their own instance (policy.more_routers)
// on a stale view of the load, see sim_config. An online refit is the cluster leader's: one
// sample fed by every router's decisions, the accepted set installed in every router's policy at
// the same instant (its announcement's latency is not modelled).
// Errors (invalid_argument): a bad config, a policy whose K differs from decode_workers, a
// signature policy without a spec or with a spec of another geometry, decode_profile without
// decode counts, refit on a non-"eldr" policy or with an interval that is not > 0, several
// routers without more_routers or with an instance of another name or K; a refit sample_size
// signature_sample refuses, an error of more_routers, and a routing error, are returned as they
// come.
result<sim_metrics> simulate(const workload& w, const sim_config& config, sim_policy& policy,
                             const std::vector<uint32_t>* decode_counts = nullptr,
                             const sim_progress& progress = {});

// Real decode-phase counts of every distinct evaluated source (rows parallel to
// w.prefill_sources), for the clairvoyant bound.
std::vector<uint32_t> decode_profiles(const workload& w, uint32_t threads = 2);

// The locality a workload offers, measured as the paper does (batches of one domain against
// mixed batches): mean distinct experts per layer of one decode step of `batch` running
// requests, over `batches` batches x `steps` steps each. Same-domain batches cycle through the
// labels; requests are drawn from the evaluated ones' distinct source requests, without
// replacement while the pool lasts, each batch with fresh decode streams.
struct locality_point {
  uint32_t batch = 0;
  double same_domain = 0.0;
  double mixed = 0.0;
  double reduction() const { return mixed > 0.0 ? 1.0 - same_domain / mixed : 0.0; }
};
// Errors (invalid_argument): no labelled evaluated request, a batch size of 0, batches or steps 0.
result<std::vector<locality_point>> measure_locality(const workload& w,
                                                     std::span<const uint32_t> batch_sizes,
                                                     uint32_t batches = 6, uint32_t steps = 20,
                                                     uint64_t seed = 1);

}  // namespace eldr
