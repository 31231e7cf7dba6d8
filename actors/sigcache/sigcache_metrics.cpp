// sigcache_metrics: see sigcache_metrics.hpp.
#include "actors/sigcache/sigcache_metrics.hpp"

#include <cassert>
#include <string>

#include "actors/sigcache/sigcache_state.hpp"

namespace eldr::sigcache {
namespace {

constexpr const char* messages_name = "eldr_ingest_messages_total";
constexpr const char* messages_help = "Publisher messages applied to the signature cache.";
constexpr const char* gaps_name = "eldr_ingest_gaps_total";
constexpr const char* gaps_help = "Sequence gaps seen per publisher.";
constexpr const char* dropped_name = "eldr_ingest_dropped_total";
constexpr const char* dropped_help = "Publisher messages dropped, per cause.";

struct store_family {
  const char* name;
  metric_type type;
  const char* help;
  uint64_t (*value)(const store_health&);
};

const store_family store_families[] = {
    {"eldr_store_degraded", metric_type::gauge,
     "1 while the signature store cannot write (changes held in memory).",
     [](const store_health& h) -> uint64_t { return h.degraded ? 1 : 0; }},
    {"eldr_store_write_errors_total", metric_type::counter, "Failed signature store writes.",
     [](const store_health& h) { return h.write_errors; }},
    {"eldr_store_recoveries_total", metric_type::counter,
     "Signature store recoveries from degraded.",
     [](const store_health& h) { return h.recoveries; }},
    {"eldr_store_unpersisted_commits_total", metric_type::counter,
     "Commits whose changes could not be written when made.",
     [](const store_health& h) { return h.unpersisted_commits; }},
    {"eldr_store_pending_changes", metric_type::gauge,
     "Changes in memory not yet written to the store.",
     [](const store_health& h) { return h.pending_changes; }},
    {"eldr_store_read_errors_total", metric_type::counter,
     "Stored counts that could not be read (corrupt, I/O error, missing).",
     [](const store_health& h) { return h.read_errors; }},
    {"eldr_store_recovery_events_total", metric_type::counter,
     "Data RocksDB reported dropping while recovering the WAL at open.",
     [](const store_health& h) { return h.recovery_events; }},
};

}  // namespace

sigcache_metrics::sigcache_metrics(metric_registry& registry, const node_context& ctx)
    : registrations_refused(must_register(registry.counter(
          "eldr_publisher_registrations_refused_total",
          "Publisher registrations refused: at max_publishers or a conflicting endpoint."))),
      subscribe_failed(must_register(registry.counter("eldr_publisher_subscribe_failed_total",
                                                      "Publisher subscriptions ZeroMQ refused."))),
      publishers_forgotten(must_register(
          registry.counter("eldr_publishers_forgotten_total",
                           "Registered publishers dropped after publisher_forget_ms of silence."))),
      registry_(registry),
      frontend_(ctx.frontend),
      publishers_(must_register(
          registry.gauge("eldr_publishers",
                         "Publishers the signature cache follows (configured and registered)."))),
      publishers_max_(
          must_register(registry.gauge("eldr_publishers_max", "signature_cache.max_publishers."))),
      replayed_(must_register(registry.counter(
          "eldr_ingest_replayed_total", "KV-event batches applied from a publisher's replay."))),
      gaps_unfilled_(must_register(registry.counter(
          "eldr_ingest_gaps_unfilled_total",
          "Sequence gaps that resynchronised a worker (replay failed, short or absent)."))) {
  if (frontend_) {
    replays_ = must_register(
        registry.counter("eldr_publisher_replays_total", "Replays asked of publishers."));
    replays_failed_ = must_register(registry.counter(
        "eldr_publisher_replays_failed_total",
        "Replays that ended without the publisher's end marker (timeout, bad reply)."));
  }
  must_register(registry.declare(messages_name, messages_help, metric_type::counter));
  must_register(registry.declare(gaps_name, gaps_help, metric_type::counter));
  must_register(registry.declare(dropped_name, dropped_help, metric_type::counter));
  for (const auto& model : ctx.config.models) {
    const metric_labels l{{"model", model.name}};
    blocks_.push_back(must_register(
        registry.gauge("eldr_sigcache_blocks", "Blocks held by the signature cache.", l)));
    auto& series = stores_.emplace_back();
    for (const auto& f : store_families) {
      store_series s;
      if (f.type == metric_type::counter)
        s.counter = must_register(registry.counter(f.name, f.help, l));
      else
        s.gauge = must_register(registry.gauge(f.name, f.help, l));
      series.push_back(s);
    }
  }
}

void sigcache_metrics::publish_publishers(const sigcache_state& st) {
  publishers_->set(static_cast<double>(st.publishers.size()));
  publishers_max_->set(static_cast<double>(st.publishers.max_publishers()));
  uint64_t replayed = 0, unfilled = 0;
  for (const auto& mc : st.models)
    for (const auto& m : mc.events->kv_metrics()) {
      replayed += m.replayed;
      unfilled += m.gaps_unfilled;
    }
  replayed_->advance_to(replayed);
  gaps_unfilled_->advance_to(unfilled);
  if (frontend_) {
    replays_->advance_to(frontend_->counters().replays.load());
    replays_failed_->advance_to(frontend_->counters().replays_failed.load());
  }
}

sigcache_metrics::publisher_series& sigcache_metrics::series_of(const publisher_key& key,
                                                                const std::string& model,
                                                                const std::string& publisher) {
  auto it = followed_.find(key);
  if (it != followed_.end()) return it->second;
  publisher_series s;
  s.labels = {
      {"model", model}, {"publisher", publisher}, {"kind", std::get<1>(key) ? "counts" : "kv"}};
  s.messages = must_register(registry_.counter(messages_name, messages_help, s.labels));
  s.gaps = must_register(registry_.counter(gaps_name, gaps_help, s.labels));
  return followed_.emplace(key, std::move(s)).first->second;
}

void sigcache_metrics::remove(const publisher_series& s) {
  registry_.remove(messages_name, s.labels);
  registry_.remove(gaps_name, s.labels);
  for (size_t c = 0; c < drop_cause_count; ++c)
    if (s.dropped[c])
      registry_.remove(
          dropped_name,
          {s.labels[0], s.labels[1], {"cause", to_string(static_cast<drop_cause>(c))}});
}

void sigcache_metrics::publish_ingest(const sigcache_state& st) {
  for (auto& [key, s] : followed_)
    s.followed = false;
  auto copy = [&](uint32_t model, bool counts, uint32_t p) {
    const auto& ev = *st.models[model].events;
    const auto& all = counts ? ev.counts_metrics() : ev.kv_metrics();
    if (p >= all.size()) return;
    const publisher_metrics& m = all[p];
    publisher_series& s = series_of({model, counts, p}, st.ctx->config.models[model].name, m.name);
    s.followed = true;
    s.messages->advance_to(m.messages);
    s.gaps->advance_to(m.gaps);
    for (size_t c = 0; c < drop_cause_count; ++c) {
      if (m.dropped[c] == 0) continue;
      if (!s.dropped[c])
        s.dropped[c] = must_register(registry_.counter(
            dropped_name, dropped_help,
            {s.labels[0], s.labels[1], {"cause", to_string(static_cast<drop_cause>(c))}}));
      s.dropped[c]->advance_to(m.dropped[c]);
    }
  };
  // The publishers followed now: every subscription's, and those a bound socket tells apart by
  // topic. A forgotten publisher keeps its ingest counters (it may come back) but not its series.
  for (const auto& [id, sub] : st.subscriptions) {
    copy(sub.model, sub.counts, sub.publisher);
    for (const auto& [topic, p] : sub.topics)
      copy(sub.model, sub.counts, p);
  }
  for (auto it = followed_.begin(); it != followed_.end();) {
    if (it->second.followed) {
      ++it;
      continue;
    }
    remove(it->second);
    it = followed_.erase(it);
  }
  for (size_t m = 0; m < st.models.size() && m < blocks_.size(); ++m)
    blocks_[m]->set(static_cast<double>(st.models[m].cache->stats().blocks));
}

void sigcache_metrics::publish_store(const sigcache_state& st) {
  for (size_t m = 0; m < st.models.size() && m < stores_.size(); ++m) {
    const store_health h = st.models[m].cache->health();
    for (size_t f = 0; f < stores_[m].size(); ++f) {
      const uint64_t v = store_families[f].value(h);
      if (stores_[m][f].counter)
        stores_[m][f].counter->advance_to(v);
      else
        stores_[m][f].gauge->set(static_cast<double>(v));
    }
  }
}

}  // namespace eldr::sigcache
