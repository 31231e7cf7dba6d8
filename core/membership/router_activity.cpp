// router_activity: see router_activity.hpp.
#include "core/membership/router_activity.hpp"

#include <algorithm>

namespace eldr {

void router_activity::seen(const std::string& router, int64_t now_ms) {
  int64_t& t = last_seen_[router];
  t = std::max(t, now_ms);
  valid_until_ = INT64_MIN;
}

void router_activity::on_vector(const std::map<std::string, included_delta>* previous,
                                const std::map<std::string, included_delta>& next, int64_t now_ms) {
  if (previous != nullptr) {
    // Both maps are sorted by router: one walk through each.
    auto p = previous->begin();
    for (const auto& [router, delta] : next) {
      while (p != previous->end() && p->first < router)
        ++p;
      if (p == previous->end() || p->first != router || !(p->second == delta)) seen(router, now_ms);
    }
  }
  // Routers that stopped (or left) are forgotten once their window lapsed: the map holds the
  // routers of the last window, not every router ever seen.
  std::erase_if(last_seen_, [&](const auto& e) { return e.second + window_ms_ <= now_ms; });
  valid_until_ = INT64_MIN;
}

void router_activity::on_decided(const std::string& router, int64_t now_ms) {
  seen(router, now_ms);
}

void router_activity::recount(const std::string& self, int64_t now_ms) const {
  uint32_t n = 0;
  bool self_counted = false;
  int64_t until = INT64_MAX;
  for (const auto& [router, t] : last_seen_) {
    if (t + window_ms_ <= now_ms) continue;
    ++n;
    self_counted = self_counted || router == self;
    until = std::min(until, t + window_ms_);
  }
  cached_ = n + (self_counted ? 0 : 1);
  valid_until_ = until;
  cached_self_ = self;
}

uint32_t router_activity::active(const std::string& self, int64_t now_ms) const {
  if (now_ms >= valid_until_ || self != cached_self_) recount(self, now_ms);
  return cached_;
}

}  // namespace eldr
