// router_status: see router_status.hpp.
#include "actors/router/router_status.hpp"

namespace eldr::router {

// Decisions by load only per reason (every reason listed, zeros included, so scripts can rely on
// the keys), as the node's metrics counted them.
namespace {

nlohmann::json fallbacks_json(const node_metrics& metrics, const model_state& m) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t r = 1; r < fallback_reason_count; ++r) {
    const char* reason = to_string(static_cast<fallback_reason>(r));
    out[reason] = metrics.route_fallbacks_of(m.cfg->name, reason);
  }
  return out;
}

}  // namespace

nlohmann::json model_json(const router_state& st, const model_state& m) {
  const int64_t now = st.ctx->now_ms();
  uint32_t registered = 0, active = 0, draining = 0, dead = 0, full = 0;
  for (const auto& w : m.pool.snapshot_all(now)) {
    if (w.state == worker_state::unregistered) continue;
    ++registered;
    switch (w.state) {
      case worker_state::active:
        ++active;
        break;
      case worker_state::draining:
        ++draining;
        break;
      case worker_state::dead:
        ++dead;
        break;
      case worker_state::full:
        ++full;
        break;
      default:
        break;
    }
  }
  const auto& c = m.pool.counters();
  // Counted once, by the node's metrics (the same numbers as on /metrics).
  const node_metrics& metrics = *st.ctx->metrics;
  const uint64_t covered = metrics.covered_blocks_of(m.cfg->name);
  const uint64_t blocks = metrics.signature_blocks_of(m.cfg->name);
  return {{"name", m.cfg->name},
          {"k", m.pool.k()},
          // false: K follows the centroid set or the registrations (config workers = 0)
          {"k_fixed", m.cfg->workers != 0},
          {"policy", m.policy_name},
          {"policy_source", m.policy_source},
          {"routing_with", std::string(m.policy->name())},
          {"tau", m.tau},
          {"widen_single", m.widen_single},
          {"epoch", m.epoch},
          {"width", m.spec ? m.spec->width() : 0},
          {"workers",
           {{"registered", registered},
            {"active", active},
            {"draining", draining},
            {"dead", dead},
            {"full", full}}},
          {"routed", metrics.route_totals_of(m.cfg->name).routes},
          {"route_errors", m.failed},
          {"routed_without_signature", m.unsigned_routes},
          {"counts_geometry", metrics.route_warnings_of(m.cfg->name, "counts_geometry")},
          {"fallbacks", fallbacks_json(metrics, m)},
          {"resigned_after_swap", m.resigned},
          {"swaps", metrics.swaps_of(m.cfg->name)},
          {"term", m.fence.highest_term()},
          {"epochs_refused", m.fenced},
          {"coverage", blocks ? static_cast<double>(covered) / static_cast<double>(blocks) : 0.0},
          {"sample", m.sample ? m.sample->size() : 0},
          {"sample_horizon", m.sample ? m.sample->horizon() : 0},
          {"finished", c.finished},
          {"finished_unknown", c.finished_unknown},
          {"reports", c.reports},
          {"reports_stale", c.reports_stale},
          {"reports_seq_reset", c.seq_resets},
          {"tracked_requests", m.pool.tracked()},
          // The routers this model's peer estimate counts now (router_activity), this one
          // included.
          {"peer_estimate_routers", st.estimate_routers(m, now)},
          // Cluster: the shards' sums this router kept (shard_sum_cache.hpp).
          {"shard_sums",
           {{"entries", m.shard_sums.entries()},
            {"bytes", m.shard_sums.bytes()},
            {"budget_bytes", m.shard_sums.budget_bytes()},
            {"hits", m.shard_sums.hits()},
            {"misses", m.shard_sums.misses()}}},
          {"seen_blocks",
           {{"entries", m.seen.entries()},
            {"bytes", m.seen.bytes()},
            {"budget_bytes", m.seen.budget_bytes()},
            {"hits", m.seen.hits()},
            {"misses", m.seen.misses()}}}};
}

// The current centroid set's spec and provenance (`centroids.show`, the operator page).
nlohmann::json spec_json(const model_state& m) {
  nlohmann::json r = {{"model", m.cfg->name}, {"epoch", m.epoch}};
  if (m.file) {
    r["k"] = m.file->workers;
    r["width"] = m.file->spec.width();
    r["transform"] = std::string(to_string(m.file->spec.transform()));
    r["layers"] = m.file->spec.layer_mask();
    r["geometry"] = {m.file->spec.geometry().layers, m.file->spec.geometry().experts,
                     m.file->spec.geometry().top_k};
    r["source"] = m.file->provenance.source;
    r["tool"] = m.file->provenance.tool;
    r["rho"] = m.file->provenance.rho;
    r["objective"] = m.file->provenance.objective;
  }
  return r;
}

nlohmann::json workers_json(const router_state& st, const model_state& m) {
  nlohmann::json rows = nlohmann::json::array();
  const int64_t now = st.ctx->now_ms();
  for (const auto& w : m.pool.snapshot_all(now)) {
    if (w.state == worker_state::unregistered) continue;
    rows.push_back({{"model", m.cfg->name},
                    {"worker", w.index},
                    {"endpoint", w.endpoint},
                    {"state", std::string(to_string(w.state))},
                    {"draining", w.draining},
                    {"load", w.load},
                    // Of `load`, peers' decisions estimated until the next vector (docs/cluster.md,
                    // "Peer estimate"): a guess, not a count.
                    {"load_estimated", m.pool.estimated(w.index)},
                    {"capacity", w.capacity},
                    {"last_report_ms_ago", w.last_report_age_ms},
                    {"routed", w.routed},
                    {"finished", w.finished}});
    // With load authorities: the node that applies and publishes this worker's load. Another
    // node's worker is not scraped here: its load comes in that node's vectors.
    const auto* claim = st.authority_mode ? m.claims.claim(w.index) : nullptr;
    if (claim != nullptr) rows.back()["authority"] = claim->node;
    if (claim != nullptr && claim->node != st.ctx->config.name) {
      rows.back()["load_source"] = "authority";
      if (w.index < m.metrics_url_text.size() && !m.metrics_url_text[w.index].empty())
        rows.back()["metrics_url"] = m.metrics_url_text[w.index];
    } else if (w.index < m.metrics_urls.size() && m.metrics_urls[w.index]) {
      auto& row = rows.back();
      row["metrics_url"] = m.metrics_url_text[w.index];
      row["last_scrape_ms_ago"] = w.last_scrape_age_ms;
      row["scrapes"] = w.scrapes;
      row["scrapes_failed"] = w.scrapes_failed;
      row["scrape_error"] = m.scrape_error[w.index];
      // The engine's own view at the last good scrape (null before one).
      const auto& seen = w.index < m.scraped.size() ? m.scraped[w.index] : std::nullopt;
      row["running"] = seen ? nlohmann::json(seen->running) : nlohmann::json(nullptr);
      row["waiting"] = seen ? nlohmann::json(seen->waiting) : nlohmann::json(nullptr);
      row["kv_usage"] = seen ? nlohmann::json(seen->kv_usage) : nlohmann::json(nullptr);
      row["load_source"] = "scrape";
    } else if (w.index < m.reported.size() && m.reported[w.index]) {
      // A worker that pushes load_reports: its own figures from the newest one.
      auto& row = rows.back();
      const auto& r = m.reported[w.index]->load;
      row["running"] = r.running;
      row["waiting"] = r.waiting;
      row["kv_usage"] = r.kv_usage;
      row["load_source"] = "report";
    }
  }
  return rows;
}

nlohmann::json policy_json(const model_state& m) {
  return {{"model", m.cfg->name},
          {"policy", m.policy_name},
          {"policy_source", m.policy_source},
          {"routing_with", std::string(m.policy->name())},
          {"tau", m.tau},
          {"widen_single", m.widen_single}};
}

nlohmann::json explain_json(const model_state& m, const explained& e) {
  nlohmann::json band = nlohmann::json::array();
  for (uint32_t w : e.candidates)
    band.push_back({{"worker", w},
                    {"score", w < e.scores.size() ? e.scores[w] : 0.0f},
                    {"load", w < e.load.size() ? e.load[w] : 0}});
  return {{"request", e.request},
          {"model", m.cfg->name},
          {"worker", e.worker},
          {"epoch", e.epoch},
          {"policy", e.policy},
          {"tau", e.tau},
          {"best_score", e.best_score},
          {"worker_score", e.worker_score},
          {"threshold", e.best_score - e.tau},
          {"widened", e.widened},
          {"fallback", e.fallback},
          {"covered_blocks", e.covered},
          {"total_blocks", e.total},
          {"band", band},
          {"scores", e.scores},
          {"load", e.load}};
}

nlohmann::json router_json(const router_state& s) {
  nlohmann::json models = nlohmann::json::array();
  uint64_t peer_estimated = 0;  // requests counted for peers (load_view::add_estimate), all models
  uint32_t estimate_routers = 1;  // the most routers any model's peer estimate counts now
  const int64_t now = s.ctx->now_ms();
  for (const auto& m : s.models) {
    models.push_back(model_json(s, *m));
    peer_estimated += m->pool.counters().estimated;
    estimate_routers = std::max(estimate_routers, s.estimate_routers(*m, now));
  }
  return nlohmann::json{{"models", models},
                        {"unknown_model", s.unknown_model},
                        {"retried_routes", s.retried},
                        {"marked_retries", s.marked_retries},
                        {"marked_retries_remembered", s.marked_retries_remembered},
                        {"recalls", s.recalls},
                        {"recalled", s.recalled},
                        {"recall_misses", s.recall_misses},
                        {"recall_peer_failures", s.recall_peer_failures},
                        {"recalls_refused", s.recalls_refused},
                        {"recalls_answered", s.recalls_answered},
                        {"recalls_answered_known", s.recalls_answered_known},
                        {"recalls_answered_waited", s.recalls_answered_waited},
                        {"peer_routers", s.peers.size()},
                        {"peer_decisions", s.peer_decisions},
                        {"load_sharing", s.authority_mode ? "authority" : "decisions"},
                        {"load_peer_estimate_routers", estimate_routers},
                        {"load_peer_estimated", peer_estimated},
                        {"load_deltas_sent", s.deltas_sent},
                        {"load_deltas_applied", s.deltas_applied},
                        {"load_vectors_sent", s.vectors_sent},
                        {"load_vectors_applied", s.vectors_applied},
                        {"load_messages_refused", s.load_messages_refused},
                        {"load_vectors_from_non_members", s.vectors_from_non_members},
                        {"load_authority_restarts", s.authority_restarts},
                        {"authority_reclaims", s.authority_reclaims},
                        {"authority_takeovers", s.authority_takeovers},
                        {"authority_handovers", s.authority_handovers},
                        {"authority_yields", s.authority_yields},
                        {"authority_claims_by_report", s.authority_claims_by_report},
                        {"peer_worker_messages", s.peer_worker_messages},
                        {"peer_epochs", s.peer_epochs},
                        {"untrusted_messages", s.untrusted},
                        {"shards", s.ring ? s.ring->size() : 0},
                        {"ring_joins_bridged", s.ring_joins_bridged},
                        {"reading_ring_before", s.ring_before.has_value()},
                        {"handoff_waiting_for", s.handoff_wait.pending()},
                        {"handoffs_confirmed", s.handoffs_confirmed},
                        {"handoffs_unconfirmed", s.handoffs_unconfirmed},
                        {"shard_requests_ring_before", s.shard_requests_ring_before},
                        {"shard_requests", s.shard_requests},
                        {"shard_local_requests", s.shard_local_requests},
                        {"changes_forwarded", s.changes_forwarded},
                        {"refit_leader", s.leader},
                        {"refit_leader_term", s.leader_term},
                        {"shard_failovers", s.shard_failovers},
                        {"shard_failures", s.shard_failures},
                        {"shard_failovers_refused", s.shard_failovers_refused},
                        {"shard_store_messages", s.shard_store_messages},
                        {"shard_stores_dropped", s.shard_stores_dropped},
                        {"shard_stores_cached", s.shard_stores_cached}};
}

}  // namespace eldr::router
