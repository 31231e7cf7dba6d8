// eldr-loadgen: plays a workload (an eldr-trace file or a synthetic preset) through a running
// eldr node with emulated prefill and decode workers, and prints route round trips, TPOT and TTFT
// per policy. The command line only; the work is loadgen.hpp's.
//
//   eldr-loadgen --node tcp://127.0.0.1:5702 --synthetic qwen-task --rate 40 --duration 30
//                --decode-workers 16 [--policies eldr,jsq] [--json]
//   eldr-loadgen --node ... --synthetic qwen-task --rate 5000 --duration 10 --decode-workers 16
//                --route-only --max-outstanding 256 --json          (route throughput benchmark)
//   eldr-loadgen --node ... --synthetic qwen-task --rate 500 --duration 3 --decode-workers 16
//                --route-only --policies eldr --swap-at 1 --json    (hot swap under load)
//   eldr-loadgen --node A1 --routers A1,A2,A3 ...   (a cluster: routes round robin over 3 routers)
//
// Exit codes: 0 done, 1 failure during the run, 2 bad options or data, 3 node unreachable,
// 130 interrupted (results so far are still printed).
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "tools/cli.hpp"
#include "tools/common/cli_options.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"

namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_signal(int) {
  g_stop.store(true);
}

}  // namespace

int main(int argc, char** argv) {
  eldr::loadgen::loadgen_options o;
  bool as_json = false;
  float tau = 0.1f;
  uint32_t capacity = 0;
  bool no_counts = false;
  CLI::App app{
      "eldr-loadgen: plays a workload through a running eldr node with emulated prefill workers\n"
      "(route requests, per-block counts, vLLM KV events) and decode workers (continuous\n"
      "batching in real time with the cost model), and reports route round trips, TPOT and TTFT\n"
      "per policy, to check eldr-sim's results end to end."};
  eldr::tools::workload_spec& spec = o.workload;
  app.add_option("--node", o.node, "the node's ADMIN endpoint, e.g. tcp://127.0.0.1:5702")
      ->required();
  app.add_option("--routers", o.routers,
                 "cluster: admin endpoints of the router nodes to send route requests to, round "
                 "robin per request (each also gets the policy and the KV-event publishers; "
                 "decode workers stay at --node)")
      ->delimiter(',');
  app.add_option("--router-weights", o.router_weights,
                 "cluster: one integer weight per --routers entry, the share of route requests "
                 "each gets (smooth weighted round robin; default equal), e.g. 1,3,3")
      ->delimiter(',');
  eldr::tools::add_workload_input(
      app, spec,
      {"the workload", "eldr-trace file, v1 or v2 (resampled, as eldr-sim does)",
       "synthetic preset: " + eldr::synthetic_preset_list(), true});
  app.add_option("--rate", o.rate_rps, "requests per second (Poisson arrivals)")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--duration", o.duration_s,
                 "seconds of arrivals (model time): ceil(rate * duration) requests")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--decode-workers", o.decode_workers, "emulated decode workers D (= the node's K)")
      ->required()
      ->check(CLI::Range(1u, 4096u));
  app.add_flag("--json", as_json, "print one JSON object on stdout instead of the table");
  app.add_option("--model", o.model, "model to drive (default: the node's first)");
  app.add_option("--policies", o.policies, "node policies to run in turn, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  auto* tau_opt = app.add_option("--tau", tau, "band half-width sent with each policy command")
                      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--seed", spec.seed, "seed of the workload and the fit")->capture_default_str();
  eldr::add_defaulted(app, "--calibration-requests", spec.calibration,
                      "calibration requests for the fit", CLI::Range(1u, 1000000u));
  eldr::add_defaulted(app, "--calibration-fraction", spec.calibration_fraction,
                      "trace only: share of the trace set aside for calibration",
                      CLI::Range(0.01, 0.99));
  eldr::tools::add_synthetic_shape_options(app, *spec.shape);
  app.add_option("--decode-pool", spec.shape->decode_pool,
                 "synthetic: decode tokens drawn per request up front (0 = every token afresh)")
      ->capture_default_str();
  auto* pool_opt = app.add_option("--prompt-pool", spec.prompt_pool,
                                  "distinct prompts the requests draw from, so prefix caches hit "
                                  "(0 = each request its own; --route-only default 1024)");
  eldr::tools::add_pairs_option(app, spec.pairs);
  eldr::add_defaulted(app, "--threads", spec.threads,
                      "threads for workload preparation and the fit", CLI::Range(1u, 256u));
  app.add_flag("--routers-by-prefill", o.routers_by_prefill,
               "cluster: send each request to the router its prefill worker maps to (prefill "
               "worker p -> router p mod N) instead of round robin, so prefix hits are blocks "
               "that router saw computed (docs/cluster.md, \"Prefill-affine routers\")");
  app.add_flag("--publishers-at-node-only", o.publishers_at_node_only,
               "cluster: register the KV-event publishers at --node only, not at every router "
               "(a measurement: the other nodes then miss the events of the blocks they own)");
  eldr::add_defaulted(app, "--prefill-workers", o.prefill_workers,
                      "emulated prefill workers (one prefix cache and KV-event publisher each)",
                      CLI::Range(1u, 256u));
  eldr::add_defaulted(app, "--prefill-cache-blocks", o.prefill_cache_blocks,
                      "KV blocks each prefill worker's prefix cache holds (LRU)",
                      CLI::Range(1u, 100000000u));
  eldr::tools::add_block_size_option(app, o.block_size);
  eldr::tools::add_prefill_cost_options(app, o.prefill_base_ms, o.prefill_per_token_ms,
                                        o.kv_transfer_ms);
  std::string counts_mode = "computed";
  auto* counts_opt =
      app.add_option("--counts", counts_mode,
                     "per-block expert counts sent with a route request: computed (the blocks "
                     "the prefill computed), all (every block, prefix hits too, with "
                     "cached_blocks: as eldr-proxy with vLLM's routed experts) or none")
          ->check(CLI::IsMember({"computed", "all", "none"}))
          ->capture_default_str();
  app.add_flag("--no-counts", no_counts, "the same as --counts none")->excludes(counts_opt);
  eldr::tools::add_decode_worker_options(app, o.max_batch, o.kv_capacity_tokens);
  auto* cap_opt = app.add_option("--capacity", capacity,
                                 "capacity each decode worker registers (max concurrent requests; "
                                 "default 0 = unbounded, as eldr-sim's waiting queues)");
  eldr::tools::add_decode_cost_options(app, o.cost);
  eldr::add_defaulted(app, "--time-scale", o.time_scale,
                      "model time = wall time * scale (2 = twice as fast as real time)",
                      CLI::PositiveNumber);
  eldr::add_defaulted(app, "--report-ms", o.report_ms,
                      "load_report interval of each decode worker (wall)", CLI::Range(1u, 60000u));
  eldr::add_defaulted(app, "--drain-s", o.drain_s,
                      "wall seconds to wait for running decodes after the last route",
                      CLI::NonNegativeNumber);
  app.add_flag("--no-import", o.no_import, "use the node's centroids as they are");
  app.add_flag("--keep-centroids", o.keep_centroids,
               "leave the imported centroid set current at the end (default: swap the node back "
               "to the epoch it had; the policy is always restored)");
  app.add_option("--centroids", o.centroids, "centroid file to import instead of fitting one")
      ->check(CLI::ExistingFile);
  app.add_flag("--route-only", o.route_only,
               "no decode emulation: every decided request is reported finished at once "
               "(route throughput and latency benchmark)");
  eldr::add_defaulted(app, "--max-outstanding", o.max_outstanding,
                      "route requests in flight at most", CLI::Range(1u, 1000000u));
  eldr::add_defaulted(app, "--route-timeout-ms", o.route_timeout_ms,
                      "a route request without a reply after this long counts as an error",
                      CLI::Range(1, 600000));
  eldr::add_defaulted(app, "--subscribe-timeout-ms", o.subscribe_timeout_ms,
                      "wait this long for the node to subscribe to each KV-event publisher",
                      CLI::Range(0, 600000));
  double swap_at = 0;
  auto* swap_opt =
      app.add_option("--swap-at", swap_at,
                     "hot swap under load: SECONDS into the eldr policy's run, import a second "
                     "centroid set and report the switch-over (JSON \"swap\")")
          ->check(CLI::NonNegativeNumber);
  eldr::add_defaulted(app, "--warmup", o.warmup_s,
                      "SECONDS: leave replies to requests sent in each run's first SECONDS out of "
                      "route_p50/p99/max (still sent, answered and counted; route_p99_all_us and "
                      "route_seconds keep them)",
                      CLI::NonNegativeNumber);
  eldr::add_defaulted(
      app, "--prepare-budget-mib", o.prepare_budget_mib,
      "memory for requests encoded ahead of their send; beyond it a background thread "
      "prepares while the run plays",
      CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_flag("--quiet", o.quiet, "no progress on stderr");
  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;
  if (tau_opt->count() > 0) o.tau = tau;
  if (cap_opt->count() > 0) o.capacity = capacity;
  if (swap_opt->count() > 0) o.swap_at = swap_at;
  if (o.route_only && pool_opt->count() == 0) spec.prompt_pool = 1024;
  o.send_counts = !no_counts && counts_mode != "none";
  o.counts_of_hits = counts_mode == "all";

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const eldr::loadgen::loadgen_outcome out = eldr::loadgen::run_loadgen(o, g_stop);
  if (!out.error.empty()) {
    std::fprintf(stderr, "eldr-loadgen: %s\n", out.error.c_str());
    return out.exit_code;
  }
  if (as_json) {
    std::printf("%s\n", out.report.dump().c_str());
  } else {
    std::printf("%s", eldr::loadgen::format_table(out.results).c_str());
    if (out.report.contains("eldr_sim_command"))
      std::printf("same workload offline: %s\n",
                  out.report["eldr_sim_command"].get<std::string>().c_str());
  }
  return out.exit_code;
}
