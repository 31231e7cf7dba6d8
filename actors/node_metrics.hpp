// node_metrics: the node's Prometheus metrics, in one registry (core/base/metrics.hpp) exported
// over HTTP by cluster/http/metrics_http: every line of /metrics comes from it. Actors call these
// named events; labelled series (per model, per worker) are created on first use and cached, so the
// hot path only increments. A component with families of its own (the signature cache's, in
// actors/sigcache/sigcache_metrics.hpp) registers them in registry(). The status JSON reads the
// same counters back (the *_of readers) rather than counting the events a second time.
// eldr_build_info{version} 1 is there from construction.
//
// Thread-safe: any actor thread may record, the HTTP thread renders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/wire/route_protocol.hpp"

namespace eldr {

class metric_registry;
struct frontend_counters;

// One model's route counters at an instant, cumulative since the node started: what the operator
// page's history (operator_page.hpp) turns into rates and quantiles per interval.
struct route_totals {
  std::vector<double> latency_bounds;  // upper bounds (seconds) of the node-side latency histogram
  std::vector<uint64_t> latency_counts;  // non-cumulative; latency_bounds.size() + 1 (+Inf last)
  double band_sum = 0;                   // sum of the band sizes of every decision
  uint64_t routes = 0;                   // decisions
};

class node_metrics {
 public:
  node_metrics();
  ~node_metrics();
  node_metrics(const node_metrics&) = delete;
  node_metrics& operator=(const node_metrics&) = delete;

  // One decision: the node-side time from the request's arrival on the frontend thread to its
  // answer (seconds), the chosen worker, the band size, and the signature coverage.
  void route_decided(std::string_view model, uint32_t worker, uint32_t band_size,
                     double node_seconds, double decision_seconds, uint32_t covered,
                     uint32_t total);
  void route_failed(wire_error_code code);
  // A locality-policy decision made by load only, by reason (core/route_fallback.hpp), and a
  // warning a route reply carried, by its code ("counts_geometry", ...).
  void route_fallback(std::string_view model, std::string_view reason);
  void route_warning(std::string_view model, std::string_view code);
  void refit_done(std::string_view model, bool accepted);
  void swapped(std::string_view model, uint64_t epoch);
  void worker_message(std::string_view type);
  // One scrape of a decode worker's vLLM /metrics: counted by result ("ok", "failed"); a good one
  // also sets the worker's scraped load (running + waiting) and KV-cache usage.
  void worker_scraped(std::string_view model, uint32_t worker, bool ok, uint32_t in_flight,
                      float kv_usage);
  // How old the worker's last good scrape is (seconds), set at every scrape round.
  void worker_scrape_age(std::string_view model, uint32_t worker, double seconds);
  // Membership: "join", "down", "refused" (a join without the secret), "untrusted" (a cluster
  // message from a node that never proved it).
  void cluster_event(std::string_view event);
  // Cluster only (a standalone node exports none of these): the members this node sees up, itself
  // included (set at every membership change), and the refit leadership as this node sees it:
  // whether it leads, and the leader's term (0 while no leader is known).
  void cluster_members(uint32_t up);
  void cluster_leadership(bool self_leads, uint64_t term);
  // One group commit of a model's signature cache as the actor sees it: expiry, staging of the
  // changed blocks and the hand-over to the background writer (seconds). It runs between two
  // signatures, so it is time route requests wait.
  void cache_committed(std::string_view model, double seconds);
  // A signature shard answered a router's request after `seconds` (sent to answer merged), from
  // this node's own shard (local) or another node's (remote): the cross-node share of a route.
  void shard_answered(bool local, double seconds);

  // The ZeroMQ frontend's own counts on /metrics: messages read per channel, replies sent and
  // dropped, messages refused before any actor saw them, the reply backlog, requests pending,
  // CURVE decisions. Read from the frontend's atomics at each render: the same counts as the
  // status JSON's "counters". `c` must outlive the exposure: forget_frontend() first.
  void expose_frontend(const frontend_counters& c);
  void forget_frontend();
  // The registry behind every family here, for components that declare their own.
  metric_registry& registry();

  std::string render() const;

  // The model's route counters now (all zero before its first decision).
  route_totals route_totals_of(std::string_view model) const;
  // Route request blocks of the model's decisions so far, and those whose counts were known.
  uint64_t signature_blocks_of(std::string_view model) const;
  uint64_t covered_blocks_of(std::string_view model) const;
  // How often route_fallback / route_warning / swapped were called for the model so far.
  uint64_t route_fallbacks_of(std::string_view model, std::string_view reason) const;
  uint64_t route_warnings_of(std::string_view model, std::string_view code) const;
  uint64_t swaps_of(std::string_view model) const;

  class impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
