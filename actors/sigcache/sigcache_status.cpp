// sigcache_status: see sigcache_status.hpp.
#include "actors/sigcache/sigcache_status.hpp"

#include <spdlog/spdlog.h>

#include <vector>

#include "core/metrics.hpp"

namespace eldr::sigcache {

std::string publishers_metrics_text(const sigcache_state& st) {
  uint64_t replayed = 0, unfilled = 0;
  for (const auto& mc : st.models)
    for (const auto& m : mc.events->kv_metrics()) {
      replayed += m.replayed;
      unfilled += m.gaps_unfilled;
    }
  auto line = [](const char* name, const char* type, const char* help, uint64_t v) {
    return std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
  };
  std::string out;
  out += line("eldr_publishers", "gauge",
              "Publishers the signature cache follows (configured and registered).",
              st.publishers.size());
  out += line("eldr_publishers_max", "gauge", "signature_cache.max_publishers.",
              st.publishers.max_publishers());
  out += line("eldr_publisher_registrations_refused_total", "counter",
              "Publisher registrations refused: at max_publishers or a conflicting endpoint.",
              st.registrations_refused);
  out += line("eldr_publisher_subscribe_failed_total", "counter",
              "Publisher subscriptions ZeroMQ refused.", st.subscribe_failed);
  out += line("eldr_publishers_forgotten_total", "counter",
              "Registered publishers dropped after publisher_forget_ms of silence.",
              st.publishers_forgotten);
  out += line("eldr_ingest_replayed_total", "counter",
              "KV-event batches applied from a publisher's replay.", replayed);
  out += line("eldr_ingest_gaps_unfilled_total", "counter",
              "Sequence gaps that resynchronised a worker (replay failed, short or absent).",
              unfilled);
  if (const auto* f = st.ctx->frontend) {
    out += line("eldr_publisher_replays_total", "counter", "Replays asked of publishers.",
                f->counters().replays.load());
    out += line("eldr_publisher_replays_failed_total", "counter",
                "Replays that ended without the publisher's end marker (timeout, bad reply).",
                f->counters().replays_failed.load());
  }
  return out;
}

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

std::string store_metrics_text(const sigcache_state& st) {
  struct family {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*value)(const store_health&);
  };
  static const family families[] = {
      {"eldr_store_degraded", "gauge",
       "1 while the signature store cannot write (changes held in memory).",
       [](const store_health& h) -> uint64_t { return h.degraded ? 1 : 0; }},
      {"eldr_store_write_errors_total", "counter", "Failed signature store writes.",
       [](const store_health& h) { return h.write_errors; }},
      {"eldr_store_recoveries_total", "counter", "Signature store recoveries from degraded.",
       [](const store_health& h) { return h.recoveries; }},
      {"eldr_store_unpersisted_commits_total", "counter",
       "Commits whose changes could not be written when made.",
       [](const store_health& h) { return h.unpersisted_commits; }},
      {"eldr_store_pending_changes", "gauge", "Changes in memory not yet written to the store.",
       [](const store_health& h) { return h.pending_changes; }},
      {"eldr_store_read_errors_total", "counter",
       "Stored counts that could not be read (corrupt, I/O error, missing).",
       [](const store_health& h) { return h.read_errors; }},
      {"eldr_store_recovery_events_total", "counter",
       "Data RocksDB reported dropping while recovering the WAL at open.",
       [](const store_health& h) { return h.recovery_events; }},
  };
  std::vector<store_health> healths;
  for (const auto& mc : st.models)
    healths.push_back(mc.cache->health());
  std::string out;
  for (const auto& f : families) {
    out +=
        std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
    for (size_t m = 0; m < st.models.size(); ++m)
      out += std::string(f.name) + "{model=\"" + st.ctx->config.models[m].name + "\"} " +
             std::to_string(f.value(healths[m])) + "\n";
  }
  return out;
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

std::string ingest_metrics_text(const sigcache_state& st) {
  std::string out;
  out += "# HELP eldr_ingest_messages_total Publisher messages applied to the signature cache.\n";
  out += "# TYPE eldr_ingest_messages_total counter\n";
  std::string gaps =
      "# HELP eldr_ingest_gaps_total Sequence gaps seen per publisher.\n"
      "# TYPE eldr_ingest_gaps_total counter\n";
  std::string drops =
      "# HELP eldr_ingest_dropped_total Publisher messages dropped, per cause.\n"
      "# TYPE eldr_ingest_dropped_total counter\n";
  std::string blocks =
      "# HELP eldr_sigcache_blocks Blocks held by the signature cache.\n"
      "# TYPE eldr_sigcache_blocks gauge\n";
  for (size_t m = 0; m < st.models.size(); ++m) {
    const auto& mc = st.models[m];
    const std::string model_label = prometheus_label_value(st.ctx->config.models[m].name);
    auto emit = [&](const std::vector<publisher_metrics>& pubs, const char* kind) {
      for (const auto& p : pubs) {
        // Publisher names are endpoints clients chose: escaped like every label value.
        const std::string publisher = prometheus_label_value(p.name);
        const std::string labels =
            "{model=\"" + model_label + "\",publisher=\"" + publisher + "\",kind=\"" + kind + "\"}";
        out += "eldr_ingest_messages_total" + labels + " " + std::to_string(p.messages) + "\n";
        gaps += "eldr_ingest_gaps_total" + labels + " " + std::to_string(p.gaps) + "\n";
        for (size_t c = 0; c < drop_cause_count; ++c) {
          if (p.dropped[c] == 0) continue;
          drops += "eldr_ingest_dropped_total{model=\"" + model_label + "\",publisher=\"" +
                   publisher + "\",cause=\"" + to_string(static_cast<drop_cause>(c)) + "\"} " +
                   std::to_string(p.dropped[c]) + "\n";
        }
      }
    };
    emit(mc.events->kv_metrics(), "kv");
    emit(mc.events->counts_metrics(), "counts");
    blocks += "eldr_sigcache_blocks{model=\"" + model_label + "\"} " +
              std::to_string(mc.cache->stats().blocks) + "\n";
  }
  return out + gaps + drops + blocks;
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
         {"counts_refused", mc.counts_refused},
         {"handoff_sent_blocks", mc.handed_off},
         {"handoff_received_blocks", mc.taken_over},
         {"handoff_refused_blocks", mc.handoff_refused},
         {"signed_requests", mc.signed_requests},
         {"publishers", mc.events->kv_metrics().size() + mc.events->counts_metrics().size()},
         {"store", store_json(mc.cache->health())},
         {"ingest", nlohmann::json::parse(mc.events->metrics_json(), nullptr, false)}});
  }
  return out.dump();
}

}  // namespace eldr::sigcache
