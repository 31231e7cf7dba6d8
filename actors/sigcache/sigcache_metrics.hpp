// sigcache_metrics: the signature cache's families in the node's one registry (node_metrics.hpp):
// the publishers it follows, each publisher's ingest, each model's blocks and store health.
//
// The actor owns what these count (its publishers, the ingest's per-publisher counters, the
// store's health), and that state is single-threaded while /metrics renders on the HTTP thread.
// So the render never reads actor state: the actor counts its own events straight into registry
// counters, and copies what other components count into registry atomics on its tick (publish_*),
// as often as it used to render text. A publisher's series go when it is no longer followed
// (forgotten, or its subscription closed), so they do not grow with every publisher ever seen.
//
// Thread safety: the actor's thread only; the registry it writes to is safe to render meanwhile.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cluster/wire/drop_cause.hpp"
#include "core/base/metrics.hpp"

namespace eldr {
class zmq_frontend;
struct node_context;
}  // namespace eldr

namespace eldr::sigcache {

struct sigcache_state;

class sigcache_metrics {
 public:
  // Declares every family (so each has its HELP and TYPE before its first series) and registers
  // each configured model's series.
  sigcache_metrics(metric_registry& registry, const node_context& ctx);
  sigcache_metrics(const sigcache_metrics&) = delete;
  sigcache_metrics& operator=(const sigcache_metrics&) = delete;

  // Counted by the actor as they happen; its log lines read the totals back.
  counter_metric* registrations_refused;  // at max_publishers, or a conflicting endpoint
  counter_metric* subscribe_failed;       // subscriptions ZeroMQ refused
  counter_metric* publishers_forgotten;   // registered publishers dropped after silence

  // Copies into the registry what the actor's components count (publisher_metrics in
  // cluster/ingest/ingest.hpp, store_health in storage/signature_cache.hpp, the frontend's replay
  // counters): the publishers the cache follows and their totals; each followed publisher's
  // messages, gaps and drops, and each model's blocks; each model's store health.
  void publish_publishers(const sigcache_state& st);
  void publish_ingest(const sigcache_state& st);
  void publish_store(const sigcache_state& st);

 private:
  // One followed ingest publisher's series. Drops per cause appear at the cause's first drop.
  struct publisher_series {
    metric_labels labels;  // model, publisher, kind
    counter_metric* messages = nullptr;
    counter_metric* gaps = nullptr;
    std::array<counter_metric*, drop_cause_count> dropped{};
    bool followed = false;  // seen in this publish_ingest: the rest are removed
  };
  // (model, counts, ingest index): how ingest tells its publishers apart.
  using publisher_key = std::tuple<uint32_t, bool, uint32_t>;

  // One series of a model's store health: a counter or a gauge, as its family is.
  struct store_series {
    counter_metric* counter = nullptr;
    gauge_metric* gauge = nullptr;
  };

  publisher_series& series_of(const publisher_key& key, const std::string& model,
                              const std::string& publisher);
  void remove(const publisher_series& s);

  metric_registry& registry_;
  const zmq_frontend* frontend_;
  gauge_metric* publishers_;
  gauge_metric* publishers_max_;
  counter_metric* replayed_;
  counter_metric* gaps_unfilled_;
  counter_metric* replays_ = nullptr;  // with a frontend only
  counter_metric* replays_failed_ = nullptr;
  std::vector<gauge_metric*> blocks_;              // per model
  std::vector<std::vector<store_series>> stores_;  // per model, per store family
  std::map<publisher_key, publisher_series> followed_;
};

}  // namespace eldr::sigcache
