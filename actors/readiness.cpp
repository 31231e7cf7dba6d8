// readiness: see readiness.hpp.
#include "actors/readiness.hpp"

#include <nlohmann/json.hpp>
#include <utility>

namespace eldr {

readiness_board::readiness_board(std::vector<std::string> models, bool routes, bool clustered)
    : routes_(routes), clustered_(clustered), order_(std::move(models)) {
  for (const auto& m : order_)
    models_.emplace(m, model_entry{});
}

void readiness_board::set_routing(const std::string& model, uint32_t routable_workers,
                                  int64_t live_until_ms, bool policy_needs_set, bool has_set) {
  std::lock_guard lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return;
  auto& e = it->second;
  e.routing_known = true;
  e.routable = routable_workers;
  e.live_until_ms = live_until_ms;
  e.needs_set = policy_needs_set;
  e.has_set = has_set;
}

void readiness_board::set_store(const std::string& model, bool writable, bool degraded,
                                std::string reason) {
  std::lock_guard lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return;
  it->second.writable = writable;
  it->second.degraded = degraded;
  it->second.store_reason = std::move(reason);
}

void readiness_board::set_cluster(bool formed, std::string reason) {
  std::lock_guard lock(mu_);
  cluster_formed_ = formed;
  cluster_reason_ = std::move(reason);
}

readiness_verdict readiness_board::evaluate(int64_t now_ms) const {
  nlohmann::json reasons = nlohmann::json::array();
  nlohmann::json degraded = nlohmann::json::array();
  {
    std::lock_guard lock(mu_);
    if (clustered_ && !cluster_formed_)
      reasons.push_back({{"part", "cluster"}, {"reason", cluster_reason_}});
    for (const auto& name : order_) {
      const auto& e = models_.at(name);
      auto add = [&](nlohmann::json& to, const char* part, std::string why) {
        to.push_back({{"model", name}, {"part", part}, {"reason", std::move(why)}});
      };
      if (routes_) {
        if (!e.routing_known)
          add(reasons, "workers", "the router has not started");
        else if (e.routable == 0 || now_ms > e.live_until_ms)
          add(reasons, "workers",
              e.routable == 0 ? "no decode worker may receive a request (none registered, all "
                                "drained or silent past worker_timeout_ms)"
                              : "every decode worker is silent past worker_timeout_ms");
        if (e.routing_known && e.needs_set && !e.has_set)
          add(reasons, "centroids",
              "policy eldr has no centroid set of the pool's K (import one with eldrctl "
              "centroids import)");
      }
      if (e.degraded || !e.writable) {
        std::string why = e.store_reason;
        if (why.empty())
          why = e.writable ? "the signature store is degraded"
                           : "the signature store is not writable";
        add(e.degraded ? degraded : reasons, "store", std::move(why));
      }
    }
  }
  readiness_verdict v;
  v.ready = reasons.empty();
  v.body = nlohmann::json{{"ready", v.ready}, {"reasons", reasons}, {"degraded", degraded}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  return v;
}

}  // namespace eldr
