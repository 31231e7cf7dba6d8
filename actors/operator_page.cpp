// operator_page: see operator_page.hpp.
#include "actors/operator_page.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "actors/operator_page_html.hpp"  // generated from actors/ui/index.html (CMakeLists.txt)

namespace eldr {

std::optional<double> histogram_quantile(double q, std::span<const double> bounds,
                                         std::span<const uint64_t> counts) {
  if (counts.size() != bounds.size() + 1 || bounds.empty()) return std::nullopt;
  uint64_t total = 0;
  for (uint64_t c : counts)
    total += c;
  if (total == 0) return std::nullopt;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (static_cast<double>(below + counts[i]) >= rank && counts[i] > 0) {
      const double lower = i == 0 ? 0.0 : bounds[i - 1];
      const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
      return lower + (bounds[i] - lower) * std::clamp(within, 0.0, 1.0);
    }
    below += counts[i];
  }
  return bounds.back();
}

operator_history::operator_history(std::vector<std::string> models, size_t capacity)
    : names_(std::move(models)), capacity_(std::max<size_t>(capacity, 1)) {
  samples_.reserve(capacity_);
}

void operator_history::record(int64_t now_ms, std::span<const route_totals> totals,
                              std::vector<std::vector<uint32_t>> in_flight) {
  const bool comparable = last_ms_ && now_ms > *last_ms_ && last_.size() == totals.size() &&
                          totals.size() == names_.size();
  std::optional<sample> s;
  if (comparable) {
    s.emplace();
    s->t_ms = now_ms;
    const double seconds = static_cast<double>(now_ms - *last_ms_) / 1000.0;
    for (size_t m = 0; m < totals.size(); ++m) {
      const route_totals& now = totals[m];
      const route_totals& then = last_[m];
      model_sample ms;
      if (m < in_flight.size()) {
        ms.in_flight = std::move(in_flight[m]);
        if (ms.in_flight.size() > max_workers) ms.in_flight.resize(max_workers);
      }
      if (now.routes >= then.routes) {
        const uint64_t routes = now.routes - then.routes;
        ms.routes_per_s = static_cast<double>(routes) / seconds;
        if (routes > 0) ms.band_mean = (now.band_sum - then.band_sum) / static_cast<double>(routes);
        // The buckets of the interval: the difference of two cumulative snapshots (a model seen
        // for the first time has no earlier snapshot: every count is new).
        std::vector<uint64_t> delta = now.latency_counts;
        if (then.latency_counts.size() == delta.size() && then.latency_bounds == now.latency_bounds)
          for (size_t i = 0; i < delta.size(); ++i)
            delta[i] = delta[i] >= then.latency_counts[i] ? delta[i] - then.latency_counts[i] : 0;
        if (auto p = histogram_quantile(0.5, now.latency_bounds, delta)) ms.p50_ms = *p * 1e3;
        if (auto p = histogram_quantile(0.99, now.latency_bounds, delta)) ms.p99_ms = *p * 1e3;
      }
      s->models.push_back(std::move(ms));
    }
  }
  last_ms_ = now_ms;
  last_.assign(totals.begin(), totals.end());
  if (!s) return;
  if (samples_.size() < capacity_) {
    samples_.push_back(std::move(*s));
  } else {
    samples_[next_] = std::move(*s);
    next_ = (next_ + 1) % capacity_;
  }
}

std::string operator_history::json() const {
  const auto opt = [](const std::optional<double>& v) -> nlohmann::json {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json models = nlohmann::json::array();
  for (size_t m = 0; m < names_.size(); ++m) {
    nlohmann::json t = nlohmann::json::array(), rate = nlohmann::json::array(),
                   p50 = nlohmann::json::array(), p99 = nlohmann::json::array(),
                   band = nlohmann::json::array(), flight = nlohmann::json::array();
    for (size_t i = 0; i < samples_.size(); ++i) {
      const sample& s = samples_[(next_ + i) % samples_.size()];
      if (m >= s.models.size()) continue;
      const model_sample& ms = s.models[m];
      t.push_back(s.t_ms);
      rate.push_back(ms.routes_per_s);
      p50.push_back(opt(ms.p50_ms));
      p99.push_back(opt(ms.p99_ms));
      band.push_back(opt(ms.band_mean));
      flight.push_back(ms.in_flight);
    }
    models.push_back({{"name", names_[m]},
                      {"t_ms", std::move(t)},
                      {"routes_per_s", std::move(rate)},
                      {"p50_ms", std::move(p50)},
                      {"p99_ms", std::move(p99)},
                      {"band_mean", std::move(band)},
                      {"in_flight", std::move(flight)}});
  }
  return nlohmann::json{{"capacity", capacity_}, {"models", std::move(models)}}.dump();
}

operator_view::operator_view(std::vector<std::string> models, size_t capacity, int64_t interval_ms)
    : models_(models),
      interval_ms_(std::max<int64_t>(interval_ms, 1)),
      status_json_(R"({"starting":true})"),
      history_(std::move(models), capacity) {
  history_json_ = history_.json();
}

void operator_view::set_status(std::string json) {
  std::lock_guard lock(mutex_);
  status_json_ = std::move(json);
}

void operator_view::record(int64_t now_ms, std::span<const route_totals> totals,
                           std::vector<std::vector<uint32_t>> in_flight) {
  std::lock_guard lock(mutex_);
  history_.record(now_ms, totals, std::move(in_flight));
  nlohmann::json j = nlohmann::json::parse(history_.json());
  j["interval_ms"] = interval_ms_;
  j["now_ms"] = now_ms;
  history_json_ = j.dump();
}

std::optional<metrics_http_server::page> operator_view::page(std::string_view path) const {
  if (path == "/")
    return metrics_http_server::page{"text/html; charset=utf-8", std::string(operator_page_html)};
  std::lock_guard lock(mutex_);
  if (path == "/api/status") return metrics_http_server::page{"application/json", status_json_};
  if (path == "/api/history") return metrics_http_server::page{"application/json", history_json_};
  return std::nullopt;
}

}  // namespace eldr
