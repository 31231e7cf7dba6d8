// node_metrics: see node_metrics.hpp.
#include "actors/node_metrics.hpp"

#include <cassert>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "cluster/zmq/zmq_frontend.hpp"
#include "core/base/metrics.hpp"
#include "core/base/version.hpp"

namespace eldr {
namespace {

// Microseconds to seconds: the decision itself is tens of µs, the node's round trip up to ms.
const std::vector<double> latency_bounds = {5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3,
                                            2e-3, 5e-3,  10e-3, 50e-3, 0.1,    0.5,    1.0};
const std::vector<double> band_bounds = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128};

// Families the status JSON reads back (the *_of readers), named once for both sides.
constexpr const char* signature_blocks = "eldr_signature_blocks_total";
constexpr const char* covered_blocks = "eldr_signature_covered_blocks_total";
constexpr const char* route_fallbacks = "eldr_route_fallbacks_total";
constexpr const char* route_warnings = "eldr_route_warnings_total";
constexpr const char* centroid_swaps = "eldr_centroid_swaps_total";

}  // namespace

class node_metrics::impl {
 public:
  metric_registry registry;
  std::mutex mutex;  // guards models
  struct model_series {
    histogram_metric* node_latency = nullptr;
    histogram_metric* decision_latency = nullptr;
    histogram_metric* band = nullptr;
    counter_metric* covered = nullptr;
    counter_metric* total = nullptr;
    std::vector<counter_metric*> per_worker;
  };
  std::unordered_map<std::string, model_series> models;
  std::vector<std::pair<std::string, metric_labels>> frontend_series;  // to forget
  // Created up front: observed from the router's hot path without the mutex.
  histogram_metric* shard_local = must_register(registry.histogram(
      "eldr_shard_request_seconds",
      "Router's signature shard requests, sent to answered, by where the shard is.", latency_bounds,
      {{"shard", "local"}}));
  histogram_metric* shard_remote = must_register(registry.histogram(
      "eldr_shard_request_seconds",
      "Router's signature shard requests, sent to answered, by where the shard is.", latency_bounds,
      {{"shard", "remote"}}));

  model_series& series(std::string_view model) {
    auto it = models.find(std::string(model));
    if (it != models.end()) return it->second;
    const metric_labels l{{"model", std::string(model)}};
    model_series s;
    s.node_latency = must_register(registry.histogram(
        "eldr_route_latency_seconds",
        "Node-side route latency: request received on the frontend to answer queued.",
        latency_bounds, l));
    s.decision_latency = must_register(registry.histogram(
        "eldr_route_decision_seconds", "Time of the routing decision itself (policy + load view).",
        latency_bounds, l));
    s.band = must_register(registry.histogram(
        "eldr_route_band_size", "Workers the pick was made among (locality band size).",
        band_bounds, l));
    s.covered = must_register(
        registry.counter(covered_blocks, "Route request blocks whose counts were known.", l));
    s.total =
        must_register(registry.counter(signature_blocks, "Route request blocks, known or not.", l));
    return models.emplace(std::string(model), std::move(s)).first->second;
  }
};

node_metrics::node_metrics() : impl_(std::make_unique<impl>()) {
  // The info-metric idiom: the value is always 1, the version is a label to join on. The cluster
  // protocol beside it: nodes of two protocols do not join (docs/cluster.md, "Upgrades").
  must_register(impl_->registry.gauge(
                    "eldr_build_info", "eldr's build: its version and cluster protocol, as labels.",
                    {{"version", std::string(version)},
                     {"cluster_protocol", std::to_string(cluster_protocol_version)}}))
      ->set(1);
}
node_metrics::~node_metrics() = default;

void node_metrics::route_decided(std::string_view model, uint32_t worker, uint32_t band_size,
                                 double node_seconds, double decision_seconds, uint32_t covered,
                                 uint32_t total) {
  std::lock_guard lock(impl_->mutex);
  auto& s = impl_->series(model);
  s.node_latency->observe(node_seconds);
  s.decision_latency->observe(decision_seconds);
  s.band->observe(band_size);
  s.covered->inc(covered);
  s.total->inc(total);
  if (worker >= s.per_worker.size()) s.per_worker.resize(worker + 1, nullptr);
  if (!s.per_worker[worker])
    s.per_worker[worker] = must_register(impl_->registry.counter(
        "eldr_route_decisions_total", "Route decisions per decode worker.",
        {{"model", std::string(model)}, {"worker", std::to_string(worker)}}));
  s.per_worker[worker]->inc();
}

route_totals node_metrics::route_totals_of(std::string_view model) const {
  route_totals t;
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->models.find(std::string(model));
  if (it == impl_->models.end()) {
    t.latency_bounds = latency_bounds;
    t.latency_counts.assign(latency_bounds.size() + 1, 0);
    return t;
  }
  const histogram_metric& lat = *it->second.node_latency;
  t.latency_bounds.assign(lat.upper_bounds().begin(), lat.upper_bounds().end());
  for (size_t i = 0; i <= t.latency_bounds.size(); ++i)
    t.latency_counts.push_back(lat.bucket_count(i));
  t.band_sum = it->second.band->sum();
  t.routes = it->second.band->count();
  return t;
}

void node_metrics::route_failed(wire_error_code code) {
  auto* c = must_register(impl_->registry.counter(
      "eldr_route_errors_total", "Route requests answered with an error_reply, per code.",
      {{"code", to_string(code)}}));
  c->inc();
}

void node_metrics::route_fallback(std::string_view model, std::string_view reason) {
  must_register(
      impl_->registry.counter(route_fallbacks,
                              "Decisions of the locality policy made by load only, by reason.",
                              {{"model", std::string(model)}, {"reason", std::string(reason)}}))
      ->inc();
}

void node_metrics::route_warning(std::string_view model, std::string_view code) {
  must_register(
      impl_->registry.counter(route_warnings, "Warnings route replies carried, by code.",
                              {{"model", std::string(model)}, {"warning", std::string(code)}}))
      ->inc();
}

void node_metrics::refit_done(std::string_view model, bool accepted) {
  must_register(impl_->registry.counter("eldr_refits_total", "Refits run, by outcome.",
                                        {{"model", std::string(model)},
                                         {"outcome", accepted ? "accepted" : "rejected"}}))
      ->inc();
}

void node_metrics::swapped(std::string_view model, uint64_t epoch) {
  const metric_labels l{{"model", std::string(model)}};
  must_register(impl_->registry.counter(centroid_swaps, "Centroid sets installed.", l))->inc();
  must_register(
      impl_->registry.gauge("eldr_centroid_epoch", "Epoch of the current centroid set.", l))
      ->set(static_cast<double>(epoch));
}

void node_metrics::worker_message(std::string_view type) {
  must_register(impl_->registry.counter("eldr_worker_messages_total",
                                        "Decode-worker messages, by type.",
                                        {{"type", std::string(type)}}))
      ->inc();
}

void node_metrics::worker_scraped(std::string_view model, uint32_t worker, bool ok,
                                  uint32_t in_flight, float kv_usage) {
  const std::string m(model), w = std::to_string(worker);
  must_register(
      impl_->registry.counter("eldr_worker_scrapes_total",
                              "Scrapes of decode workers' vLLM /metrics, by result.",
                              {{"model", m}, {"worker", w}, {"result", ok ? "ok" : "failed"}}))
      ->inc();
  if (!ok) return;
  const metric_labels l{{"model", m}, {"worker", w}};
  must_register(
      impl_->registry.gauge("eldr_worker_scraped_load",
                            "Running + waiting requests in the worker's last good scrape.", l))
      ->set(static_cast<double>(in_flight));
  must_register(impl_->registry.gauge("eldr_worker_kv_cache_usage",
                                      "KV-cache usage (0..1) in the worker's last good scrape.", l))
      ->set(static_cast<double>(kv_usage));
}

void node_metrics::worker_scrape_age(std::string_view model, uint32_t worker, double seconds) {
  must_register(
      impl_->registry.gauge("eldr_worker_scrape_age_seconds",
                            "Age of the worker's last good scrape, as of the last scrape round.",
                            {{"model", std::string(model)}, {"worker", std::to_string(worker)}}))
      ->set(seconds);
}

void node_metrics::cluster_event(std::string_view event) {
  must_register(impl_->registry.counter("eldr_cluster_events_total",
                                        "Cluster membership events, by kind.",
                                        {{"event", std::string(event)}}))
      ->inc();
}

void node_metrics::cluster_members(uint32_t up) {
  must_register(impl_->registry.gauge("eldr_cluster_members",
                                      "Cluster members this node sees up, itself included."))
      ->set(static_cast<double>(up));
}

void node_metrics::cluster_leadership(bool self_leads, uint64_t term) {
  must_register(impl_->registry.gauge("eldr_cluster_is_leader", "1 on the refit leader, else 0."))
      ->set(self_leads ? 1 : 0);
  must_register(
      impl_->registry.gauge("eldr_cluster_term",
                            "Term of the refit leader as this node knows it (0: none known)."))
      ->set(static_cast<double>(term));
}

void node_metrics::cache_committed(std::string_view model, double seconds) {
  must_register(impl_->registry.histogram(
                    "eldr_sigcache_commit_seconds",
                    "Signature cache group commits on the route path: expiry, staging, hand-over.",
                    latency_bounds, {{"model", std::string(model)}}))
      ->observe(seconds);
}

void node_metrics::expose_frontend(const frontend_counters& c) {
  std::lock_guard lock(impl_->mutex);
  const auto add = [&](bool counter, const char* name, const char* help, metric_labels labels,
                       const auto& atomic) {
    auto read = [&atomic] { return static_cast<double>(atomic.load(std::memory_order_relaxed)); };
    must_register(counter ? impl_->registry.callback_counter(name, help, labels, read)
                          : impl_->registry.callback_gauge(name, help, labels, read));
    impl_->frontend_series.emplace_back(name, std::move(labels));
  };
  const char* received = "Messages the ZeroMQ frontend read, per channel.";
  add(true, "eldr_frontend_received_total", received, {{"channel", "route"}},
      c.received[static_cast<size_t>(frontend_channel::route)]);
  add(true, "eldr_frontend_received_total", received, {{"channel", "worker"}},
      c.received[static_cast<size_t>(frontend_channel::worker)]);
  add(true, "eldr_frontend_received_total", received, {{"channel", "admin"}},
      c.received[static_cast<size_t>(frontend_channel::admin)]);
  const char* replies =
      "Replies the frontend sent, and dropped (the peer gone or its backlog full).";
  add(true, "eldr_frontend_replies_total", replies, {{"outcome", "sent"}}, c.replies_sent);
  add(true, "eldr_frontend_replies_total", replies, {{"outcome", "dropped"}}, c.replies_dropped);
  add(true, "eldr_frontend_replies_over_cap_total",
      "Dropped replies whose peer's backlog was at max_queued_reply_bytes.", {},
      c.replies_over_cap);
  const char* refused = "Messages the frontend refused before any actor saw them, per reason.";
  add(true, "eldr_frontend_refused_total", refused, {{"reason", "malformed"}}, c.malformed);
  add(true, "eldr_frontend_refused_total", refused, {{"reason", "too_large"}}, c.too_large);
  add(true, "eldr_frontend_refused_total", refused, {{"reason", "unknown_type"}}, c.unknown_type);
  add(true, "eldr_frontend_refused_total", refused, {{"reason", "overloaded"}}, c.overloaded);
  add(true, "eldr_frontend_refused_total", refused, {{"reason", "bad_frames"}}, c.bad_frames);
  add(true, "eldr_frontend_publisher_messages_total",
      "KV-event messages the frontend read from publishers.", {}, c.publisher_messages);
  add(false, "eldr_frontend_reply_backlog", "Replies queued for slow peers now.", {},
      c.queued_replies);
  add(false, "eldr_frontend_reply_backlog_bytes", "Bytes of replies queued for slow peers now.", {},
      c.queued_reply_bytes);
  add(false, "eldr_frontend_reply_backlog_bytes_peak",
      "The most bytes of replies ever queued for slow peers at once.", {},
      c.queued_reply_bytes_peak);
  add(false, "eldr_frontend_pending",
      "Requests handed to the actors and not answered yet (the overload limit's count).", {},
      c.pending);
  const char* curve = "CURVE handshakes the client-key allowlist decided.";
  add(true, "eldr_frontend_curve_handshakes_total", curve, {{"result", "accepted"}},
      c.curve_accepted);
  add(true, "eldr_frontend_curve_handshakes_total", curve, {{"result", "refused"}},
      c.curve_refused);
}

void node_metrics::forget_frontend() {
  std::lock_guard lock(impl_->mutex);
  for (const auto& [name, labels] : impl_->frontend_series)
    (void)impl_->registry.remove(name, labels);
  impl_->frontend_series.clear();
}

void node_metrics::shard_answered(bool local, double seconds) {
  auto& h = local ? impl_->shard_local : impl_->shard_remote;
  h->observe(seconds);
}

metric_registry& node_metrics::registry() {
  return impl_->registry;
}

std::string node_metrics::render() const {
  return impl_->registry.render();
}

uint64_t node_metrics::signature_blocks_of(std::string_view model) const {
  return impl_->registry.counter_value(signature_blocks, {{"model", std::string(model)}});
}

uint64_t node_metrics::covered_blocks_of(std::string_view model) const {
  return impl_->registry.counter_value(covered_blocks, {{"model", std::string(model)}});
}

uint64_t node_metrics::route_fallbacks_of(std::string_view model, std::string_view reason) const {
  return impl_->registry.counter_value(
      route_fallbacks, {{"model", std::string(model)}, {"reason", std::string(reason)}});
}

uint64_t node_metrics::route_warnings_of(std::string_view model, std::string_view code) const {
  return impl_->registry.counter_value(
      route_warnings, {{"model", std::string(model)}, {"warning", std::string(code)}});
}

uint64_t node_metrics::swaps_of(std::string_view model) const {
  return impl_->registry.counter_value(centroid_swaps, {{"model", std::string(model)}});
}

}  // namespace eldr
