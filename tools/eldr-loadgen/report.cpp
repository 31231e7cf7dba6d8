// report: the run's report, one policy's JSON, the human table (report.hpp, loadgen.hpp).
#include "tools/eldr-loadgen/report.hpp"

#include <cstdio>
#include <string>

namespace eldr::loadgen {
namespace {

using json = nlohmann::json;

// eldr-sim's command line for the workload and cluster this run plays.
std::string eldr_sim_command(const loadgen_options& o, std::size_t requests) {
  const tools::workload_spec& w = o.workload;
  std::string c = "eldr-sim " +
                  (w.trace_path.empty() ? "--synthetic " + w.synthetic : "--trace " + w.trace_path);
  c += " --rate " + fmt(o.rate_rps, 3) + " --requests " + std::to_string(requests) +
       " --calibration-requests " + std::to_string(w.calibration) + " --pairs " +
       std::to_string(w.pairs) + " --decode-workers " + std::to_string(o.decode_workers) +
       " --prefill-workers " + std::to_string(o.prefill_workers) + " --seed " +
       std::to_string(w.seed) + " --max-batch " + std::to_string(o.max_batch) + " --kv-capacity " +
       std::to_string(o.kv_capacity_tokens) + " --prefill-base-ms " + fmt(o.prefill_base_ms, 3) +
       " --prefill-per-token-ms " + fmt(o.prefill_per_token_ms, 4) + " --kv-transfer-ms " +
       fmt(o.kv_transfer_ms, 3) + " --cost-base-ms " + fmt(o.cost.base_ms, 4) +
       " --cost-expert-ms " + fmt(o.cost.per_distinct_expert_ms, 6) + " --cost-sequence-ms " +
       fmt(o.cost.per_sequence_ms, 5) + " --cost-kilotoken-ms " +
       fmt(o.cost.per_context_kilotoken_ms, 5);
  if (w.trace_path.empty())
    c += " --prompt-min " + std::to_string(w.shape->prompt_min) + " --prompt-max " +
         std::to_string(w.shape->prompt_max) + " --output-tokens " +
         std::to_string(w.shape->output_tokens) + " --decode-pool " +
         std::to_string(w.shape->decode_pool);
  else
    c += " --calibration-fraction " + fmt(w.calibration_fraction, 3);
  if (w.prompt_pool > 0)
    c += " --prefix-caching --prompt-pool " + std::to_string(w.prompt_pool) + " --block-size " +
         std::to_string(o.block_size);
  std::string policies;
  for (const std::string& n : o.policies)
    policies += (policies.empty() ? "" : ",") + n;
  if (o.tau) c += " --tau " + fmt(*o.tau, 3);
  return c + " --policies " + policies + " --out DIR";
}

}  // namespace

json run_report(const session& s, const std::vector<policy_result>& results) {
  const loadgen_options& o = *s.o;
  json report = results.empty() ? json::object() : to_json(results.front());
  json policies = json::object();
  for (const policy_result& r : results)
    policies[r.policy] = to_json(r);
  report["policies"] = policies;
  report["node"] = o.node;
  report["route_endpoints"] = s.route_endpoints;
  report["model"] = s.model;
  report["source"] = s.source_name;
  report["rate_rps"] = o.rate_rps;
  report["duration_s"] = o.duration_s;
  report["requests"] = s.w->requests.size();
  report["decode_workers"] = o.decode_workers;
  report["prefill_workers"] = o.prefill_workers;
  report["time_scale"] = o.time_scale;
  report["route_only"] = o.route_only;
  report["seed"] = o.workload.seed;
  report["imported_epoch"] = o.no_import ? json(nullptr) : json(s.import_epoch);
  // The offline simulation of the same workload, for the end-to-end comparison.
  if (!o.route_only) report["eldr_sim_command"] = eldr_sim_command(o, s.w->requests.size());
  return report;
}

json to_json(const policy_result& r) {
  json j;
  j["policy"] = r.policy;
  j["interrupted"] = r.interrupted;
  j["sent"] = r.sent;
  j["received"] = r.replied;
  j["replied"] = r.replied;
  j["errors"] = r.errors;
  j["error_replies"] = r.error_replies;
  j["timeouts"] = r.timeouts;
  j["error_codes"] = r.error_codes;
  j["offered_rps"] = r.offered_rps;
  j["route_rps"] = r.route_rps;
  j["route_p50_us"] = r.route_p50_us;
  j["route_p99_us"] = r.route_p99_us;
  j["route_max_us"] = r.route_max_us;
  j["route_p99_all_us"] = r.route_p99_all_us;
  json seconds = json::array();
  for (const auto& s : r.route_seconds)
    seconds.push_back(
        {{"replies", s.replies}, {"p50_us", s.p50_us}, {"p99_us", s.p99_us}, {"max_us", s.max_us}});
  j["route_seconds"] = std::move(seconds);
  j["tpot_p50_ms"] = r.tpot_p50_ms;
  j["tpot_p95_ms"] = r.tpot_p95_ms;
  j["tpot_p99_ms"] = r.tpot_p99_ms;
  j["ttft_p50_ms"] = r.ttft_p50_ms;
  j["ttft_p99_ms"] = r.ttft_p99_ms;
  j["completed"] = r.completed;
  j["incomplete"] = r.incomplete;
  j["coverage_mean"] = r.coverage_mean;
  j["decisions_per_worker"] = r.decisions;
  j["decision_imbalance"] = r.decision_imbalance;
  j["decision_cv"] = r.decision_cv;
  j["inflight_imbalance"] = r.inflight_imbalance;
  j["inflight_mean"] = r.inflight_mean;
  j["epochs_seen"] = r.epochs;
  j["prefix_hit_fraction"] = r.prefix_hit_fraction;
  j["kv_blocks_stored"] = r.kv_blocks_stored;
  j["kv_blocks_removed"] = r.kv_blocks_removed;
  j["decode_steps"] = r.decode_steps;
  j["distinct_experts_per_layer"] = r.distinct_experts_per_layer;
  j["batch_size_mean"] = r.batch_size_mean;
  j["token_imbalance"] = r.token_imbalance;
  j["worker_messages"] = r.worker_messages;
  j["worker_errors"] = r.worker_errors;
  j["wall_s"] = r.wall_s;
  j["loadgen_cpu_s"] = r.cpu_s;
  j["prepare_stalls"] = r.prepare_stalls;
  j["prepared_at_start"] = r.prepared_at_start;
  if (r.swap) {
    const swap_result& x = *r.swap;
    auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    json sj = {{"attempted", x.attempted},
               {"epoch_before", x.epoch_before},
               {"epoch_after", x.epoch_after},
               {"import_ms", x.import_ms},
               {"first_new_epoch_ms", opt(x.first_new_epoch_ms)},
               {"last_old_epoch_ms", opt(x.last_old_epoch_ms)},
               {"old_epoch_after_ack", x.old_epoch_after_ack},
               {"failed_during_swap", x.failed_during_swap},
               {"requests_in_window", x.requests_in_window}};
    if (!x.error.empty()) sj["error"] = x.error;
    j["swap"] = std::move(sj);
  }
  return j;
}

std::string format_table(const std::vector<policy_result>& results) {
  std::string t;
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %8s %8s %7s %10s %10s %10s %9s %9s %9s %9s %8s %9s\n",
                "policy", "sent", "replied", "errors", "route/s", "rtt p50us", "rtt p99us",
                "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99", "coverage", "imbalance");
  t += line;
  const policy_result* eldr = nullptr;
  const policy_result* jsq = nullptr;
  for (const policy_result& r : results) {
    std::snprintf(line, sizeof line,
                  "%-12s %8llu %8llu %7llu %10.1f %10.1f %10.1f %9.2f %9.2f %9.1f %9.1f %8.3f "
                  "%9.3f%s\n",
                  r.policy.c_str(), static_cast<unsigned long long>(r.sent),
                  static_cast<unsigned long long>(r.replied),
                  static_cast<unsigned long long>(r.errors), r.route_rps, r.route_p50_us,
                  r.route_p99_us, r.tpot_p50_ms, r.tpot_p99_ms, r.ttft_p50_ms, r.ttft_p99_ms,
                  r.coverage_mean, r.decision_imbalance, r.interrupted ? " (interrupted)" : "");
    t += line;
    if (r.policy == "eldr") eldr = &r;
    if (r.policy == "jsq") jsq = &r;
  }
  t += "(TPOT and TTFT in model milliseconds; rtt = route round trip)\n";
  for (const policy_result& r : results) {
    if (!r.swap) continue;
    const swap_result& x = *r.swap;
    if (!x.attempted) {
      t += r.policy + " swap: not attempted (the run ended first)\n";
      continue;
    }
    if (!x.error.empty()) {
      t += r.policy + " swap: failed: " + x.error + "\n";
      continue;
    }
    auto opt = [](const std::optional<double>& v) { return v ? fmt(*v, 1) + " ms" : "none"; };
    t += r.policy + " swap: epoch " + std::to_string(x.epoch_before) + " -> " +
         std::to_string(x.epoch_after) + ", import " + fmt(x.import_ms, 1) +
         " ms, first new-epoch reply at " + opt(x.first_new_epoch_ms) +
         ", last old-epoch reply at " + opt(x.last_old_epoch_ms) + ", old epoch after ack " +
         std::to_string(x.old_epoch_after_ack) + ", failed within 1 s " +
         std::to_string(x.failed_during_swap) + " of " + std::to_string(x.requests_in_window) +
         "\n";
  }
  if (eldr != nullptr && jsq != nullptr && jsq->tpot_p50_ms > 0 && eldr->tpot_p50_ms > 0)
    t += "eldr / jsq median TPOT: " + fmt(eldr->tpot_p50_ms / jsq->tpot_p50_ms, 4) + " (" +
         fmt(100.0 * (1.0 - eldr->tpot_p50_ms / jsq->tpot_p50_ms), 1) + "% lower)\n";
  return t;
}

}  // namespace eldr::loadgen
