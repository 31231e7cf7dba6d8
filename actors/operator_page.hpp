// operator_page: what the node's operator page serves on its metrics port (docs/operations.md,
// "The operator page"): `GET /` is the page itself (actors/ui/index.html, embedded in the binary at
// build time: plain HTML, JS and SVG, nothing fetched from elsewhere), `GET /api/status` the node's
// status as `eldrctl status --json` has it plus each model's worker rows and stored epochs, and
// `GET /api/history` the last minutes of route rate, route latency, band size and in-flight per
// worker, from a bounded ring.
//
// The HTTP thread never waits on an actor: the admin actor renders a snapshot every
// sample interval (admin_actor.cpp) and the page function hands out the last one. A client can
// thus cost a string copy per request, and the node's memory for the page is bounded by the ring
// (operator_history) and two rendered strings.
//
// Thread safety: every method of operator_view may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/node_metrics.hpp"
#include "cluster/http/metrics_http.hpp"

namespace eldr {

// The q-quantile (0 < q < 1) of a histogram of non-cumulative `counts` over `bounds` (counts has
// one more entry: +Inf), linearly interpolated inside its bucket from the bucket's lower bound (0
// for the first) -- Prometheus' histogram_quantile. A quantile in +Inf answers the highest finite
// bound. nullopt when the counts are all zero or the sizes do not match.
std::optional<double> histogram_quantile(double q, std::span<const double> bounds,
                                         std::span<const uint64_t> counts);

// One model over one sample interval.
struct model_sample {
  double routes_per_s = 0;
  std::optional<double> p50_ms, p99_ms;  // route latency in the interval; nullopt without routes
  std::optional<double> band_mean;       // mean band size in the interval; nullopt without routes
  std::vector<uint32_t> in_flight;       // per worker index at the sample's instant
};

// A ring of the last `capacity` samples (oldest dropped first), each holding every model. Memory is
// bounded by capacity x models x (4 numbers + at most max_workers in-flight values).
class operator_history {
 public:
  static constexpr size_t max_workers = 256;  // in-flight values kept per model and sample

  operator_history(std::vector<std::string> models, size_t capacity);

  // Records the instant `now_ms` from the cumulative totals (one per model, in model order) and the
  // in-flight counts per model and worker (longer lists are cut at max_workers). The first call
  // only sets the baseline; each later one adds the interval since the previous call. A counter
  // that went down (cannot happen in one process) restarts the baseline.
  void record(int64_t now_ms, std::span<const route_totals> totals,
              std::vector<std::vector<uint32_t>> in_flight);

  size_t size() const { return samples_.size(); }
  size_t capacity() const { return capacity_; }
  // {"capacity": N, "models": [{"name", "t_ms": [...], "routes_per_s": [...], "p50_ms": [...],
  //  "p99_ms": [...], "band_mean": [...], "in_flight": [[per worker], ...]}]}, oldest first, null
  // where a value is absent; t_ms on the node's monotonic clock.
  std::string json() const;

 private:
  struct sample {
    int64_t t_ms = 0;
    std::vector<model_sample> models;
  };
  std::vector<std::string> names_;
  size_t capacity_;
  std::vector<sample> samples_;  // a ring: next_ is the oldest once full
  size_t next_ = 0;
  std::optional<int64_t> last_ms_;
  std::vector<route_totals> last_;
};

// What the page function serves; filled by the admin actor.
class operator_view {
 public:
  // 300 samples 2 s apart: the last 10 minutes.
  static constexpr size_t default_capacity = 300;
  static constexpr int64_t default_interval_ms = 2000;

  operator_view(std::vector<std::string> models, size_t capacity = default_capacity,
                int64_t interval_ms = default_interval_ms);

  int64_t interval_ms() const { return interval_ms_; }
  const std::vector<std::string>& models() const { return models_; }

  // The latest /api/status body (a JSON object).
  void set_status(std::string json);
  void record(int64_t now_ms, std::span<const route_totals> totals,
              std::vector<std::vector<uint32_t>> in_flight);

  // `/` (the page), `/api/status`, `/api/history`; nullopt for any other path. Before the first
  // snapshot /api/status is {"starting": true}.
  std::optional<metrics_http_server::page> page(std::string_view path) const;

 private:
  const std::vector<std::string> models_;
  const int64_t interval_ms_;
  mutable std::mutex mutex_;  // guards the members below
  std::string status_json_;
  std::string history_json_;
  operator_history history_;
};

}  // namespace eldr
