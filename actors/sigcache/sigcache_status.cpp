// sigcache_status: see sigcache_status.hpp.
#include "actors/sigcache/sigcache_status.hpp"

#include <spdlog/spdlog.h>

namespace eldr::sigcache {

constexpr int64_t read_error_log_ms = 10'000;

// The store section of status (cache_stats): the store's health (signature_cache::health()).
nlohmann::json store_json(const store_health& h) {
  return {{"degraded", h.degraded},
          {"reason", h.reason},
          {"degraded_since_ms", h.degraded_since_ms},
          {"recovered_at_ms", h.recovered_at_ms},
          {"write_errors", h.write_errors},
          {"recoveries", h.recoveries},
          {"unpersisted_commits", h.unpersisted_commits},
          {"pending_changes", h.pending_changes},
          {"read_errors", h.read_errors},
          {"last_read_error", h.last_read_error},
          {"recovery_events", h.recovery_events},
          {"recovery_notes", h.recovery_notes},
          {"log_write_errors", h.log_write_errors}};
}

// Logs what changed in a store's health since the last call: degraded and recovered once each,
// read errors rate-limited.
void log_store_health(model_cache& mc, const std::string& model, int64_t now_ms) {
  const store_health h = mc.cache->health();
  if (h.degraded && !mc.logged_degraded)
    spdlog::error(
        "model {}: the signature store is degraded: {}. Routing goes on from memory; changes are "
        "held and written when the store can write again (retried every second), lost if the "
        "node stops first",
        model, h.reason);
  else if (!h.degraded && mc.logged_degraded)
    spdlog::warn("model {}: the signature store writes again (recovered; {} write errors so far)",
                 model, h.write_errors);
  mc.logged_degraded = h.degraded;
  if (h.read_errors > mc.logged_read_errors &&
      now_ms - mc.read_errors_logged_ms >= read_error_log_ms) {
    spdlog::error("model {}: {} signature store read errors ({} in all); the last: {}", model,
                  h.read_errors - mc.logged_read_errors, h.read_errors, h.last_read_error);
    mc.logged_read_errors = h.read_errors;
    mc.read_errors_logged_ms = now_ms;
  }
}

std::string page_text(const sigcache_state& st) {
  constexpr size_t max_page_publishers = 64;
  nlohmann::json out = nlohmann::json::object();
  for (size_t m = 0; m < st.models.size(); ++m) {
    const auto& mc = st.models[m];
    nlohmann::json rows = nlohmann::json::array();
    size_t total = 0;
    for (const auto* list : {&mc.events->kv_metrics(), &mc.events->counts_metrics()}) {
      for (const publisher_metrics& p : *list) {
        if (total++ >= max_page_publishers) continue;
        uint64_t dropped = 0;
        for (uint64_t d : p.dropped)
          dropped += d;
        rows.push_back({{"publisher", p.name},
                        {"kind", list == &mc.events->kv_metrics() ? "kv" : "counts"},
                        {"messages", p.messages},
                        {"block_events", p.block_events},
                        {"gaps", p.gaps},
                        {"gaps_unfilled", p.gaps_unfilled},
                        {"replayed", p.replayed},
                        {"restarts", p.restarts},
                        {"dropped", dropped}});
      }
    }
    out[st.ctx->config.models[m].name] = {{"publishers", std::move(rows)},
                                          {"publishers_total", total}};
  }
  return out.dump();
}

std::string cache_stats_text(const sigcache_state& st) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t m = 0; m < st.models.size(); ++m) {
    const auto& mc = st.models[m];
    const auto s = mc.cache->stats();
    out.push_back(
        {{"model", st.ctx->config.models[m].name},
         {"blocks", s.blocks},
         {"blocks_with_counts", s.blocks_with_counts},
         {"holders", s.holders},
         {"commits", s.commits},
         // The node's commit tick (all models): how often it ran, and found changes to commit.
         {"commit_ticks", st.commit_ticks},
         {"staged_commits", st.staged_commits},
         {"counts_refused", mc.counts_refused},
         {"handoff_sent_blocks", mc.handed_off},
         {"handoff_received_blocks", mc.taken_over},
         {"handoff_refused_blocks", mc.handoff_refused},
         // The node's hand-offs (all models): one running now, the last one's duration.
         {"handoff_running", st.handoff.has_value()},
         {"handoff_last_ms", st.handoff_last_ms},
         {"handoffs_finished", st.handoffs_finished},
         {"handoffs_superseded", st.handoffs_superseded},
         {"signed_requests", mc.signed_requests},
         {"publishers", mc.events->kv_metrics().size() + mc.events->counts_metrics().size()},
         {"store", store_json(mc.cache->health())},
         {"ingest", nlohmann::json::parse(mc.events->metrics_json(), nullptr, false)}});
  }
  return out.dump();
}

}  // namespace eldr::sigcache
