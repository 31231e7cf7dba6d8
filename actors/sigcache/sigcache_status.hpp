// sigcache_status: what the signature cache tells operators: its part of status (cache_stats), the
// operator page's ingest per publisher, and the log lines of its store's health (its /metrics
// families are sigcache_metrics.hpp's). Plain functions over sigcache_state: no actor system, so
// unit tests can drive them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/sigcache/sigcache_state.hpp"

namespace eldr::sigcache {

// The store section of status (cache_stats): the store's health (signature_cache::health()).
nlohmann::json store_json(const store_health& h);

// Logs what changed in a store's health since the last call: degraded and recovered once each,
// read errors rate-limited.
void log_store_health(model_cache& mc, const std::string& model, int64_t now_ms);

// The operator page's ingest per publisher, per model: the first max_page_publishers publishers
// (the page's size stays bounded however many follow), and how many in all; JSON text.
std::string page_text(const sigcache_state& st);

// Status (cache_stats): each model's cache, store and ingest; JSON text.
std::string cache_stats_text(const sigcache_state& st);

}  // namespace eldr::sigcache
