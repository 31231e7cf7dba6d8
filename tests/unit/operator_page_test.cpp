// operator_page: the history ring's bounds (capacity, workers per sample, baseline), the interval
// arithmetic (rates, latency quantiles from histogram deltas, band means), histogram_quantile, and
// what the page function answers for each path.
#include "actors/operator_page.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace eldr {
namespace {

const std::vector<double> bounds = {1e-3, 2e-3, 5e-3, 10e-3};

// Totals after `routes` decisions, each of `latency_s` and band `band`, on top of `base`.
route_totals add(route_totals base, uint64_t routes, double latency_s, double band) {
  if (base.latency_bounds.empty()) {
    base.latency_bounds = bounds;
    base.latency_counts.assign(bounds.size() + 1, 0);
  }
  size_t i = 0;
  while (i < bounds.size() && bounds[i] < latency_s)
    ++i;
  base.latency_counts[i] += routes;
  base.routes += routes;
  base.band_sum += band * static_cast<double>(routes);
  return base;
}

TEST(HistogramQuantile, InterpolatesInsideTheBucketLikePrometheus) {
  const std::vector<double> b = {1, 2, 4};
  // 10 in (0,1], 10 in (1,2]: the median is the top of the first bucket, p75 half-way in the next.
  EXPECT_DOUBLE_EQ(*histogram_quantile(0.5, b, std::vector<uint64_t>{10, 10, 0, 0}), 1.0);
  EXPECT_DOUBLE_EQ(*histogram_quantile(0.75, b, std::vector<uint64_t>{10, 10, 0, 0}), 1.5);
  // Everything above the last bound answers the highest finite bound.
  EXPECT_DOUBLE_EQ(*histogram_quantile(0.99, b, std::vector<uint64_t>{0, 0, 0, 5}), 4.0);
  // Empty buckets before the rank are skipped.
  EXPECT_DOUBLE_EQ(*histogram_quantile(0.5, b, std::vector<uint64_t>{0, 0, 4, 0}), 3.0);
  EXPECT_FALSE(histogram_quantile(0.5, b, std::vector<uint64_t>{0, 0, 0, 0}));
  EXPECT_FALSE(histogram_quantile(0.5, b, std::vector<uint64_t>{1, 2}));  // sizes do not match
}

TEST(OperatorHistory, TheFirstRecordIsOnlyTheBaselineThenEachIntervalIsADifference) {
  operator_history h({"m"}, 10);
  route_totals t = add({}, 100, 1.5e-3, 2);
  h.record(1000, std::vector<route_totals>{t}, {{1, 2}});
  EXPECT_EQ(h.size(), 0u);
  // 20 decisions in 2 s, all between 2 and 5 ms, band 4: the earlier 100 are not in this interval.
  t = add(t, 20, 4e-3, 4);
  h.record(3000, std::vector<route_totals>{t}, {{3, 0, 7}});
  ASSERT_EQ(h.size(), 1u);
  const auto j = nlohmann::json::parse(h.json());
  const auto& m = j["models"][0];
  EXPECT_EQ(m["name"], "m");
  EXPECT_EQ(m["t_ms"], nlohmann::json::array({3000}));
  EXPECT_DOUBLE_EQ(m["routes_per_s"][0].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(m["band_mean"][0].get<double>(), 4.0);
  EXPECT_GT(m["p50_ms"][0].get<double>(), 2.0);
  EXPECT_LE(m["p99_ms"][0].get<double>(), 5.0);
  EXPECT_EQ(m["in_flight"][0], nlohmann::json::array({3, 0, 7}));
  // An idle interval: rate 0, no latency and no band (null, not 0).
  h.record(5000, std::vector<route_totals>{t}, {{0, 0, 0}});
  const auto k = nlohmann::json::parse(h.json())["models"][0];
  EXPECT_DOUBLE_EQ(k["routes_per_s"][1].get<double>(), 0.0);
  EXPECT_TRUE(k["p50_ms"][1].is_null());
  EXPECT_TRUE(k["band_mean"][1].is_null());
}

TEST(OperatorHistory, TheRingKeepsTheLastCapacitySamplesOldestFirst) {
  operator_history h({"a", "b"}, 3);
  route_totals t;
  t = add(t, 0, 1e-3, 1);
  for (int64_t i = 0; i <= 10; ++i) {
    t = add(t, static_cast<uint64_t>(i), 1e-3, 1);
    h.record(i * 1000, std::vector<route_totals>{t, t}, {});
  }
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.capacity(), 3u);
  const auto j = nlohmann::json::parse(h.json());
  EXPECT_EQ(j["capacity"], 3);
  for (const auto& m : j["models"]) {
    EXPECT_EQ(m["t_ms"], nlohmann::json::array({8000, 9000, 10000}));
    EXPECT_EQ(m["routes_per_s"], nlohmann::json::array({8.0, 9.0, 10.0}));
  }
}

TEST(OperatorHistory, InFlightListsAreCutAtMaxWorkersAndBadClocksRestartTheBaseline) {
  operator_history h({"m"}, 4);
  const route_totals t = add({}, 1, 1e-3, 1);
  h.record(1000, std::vector<route_totals>{t}, {});
  h.record(2000, std::vector<route_totals>{t},
           {std::vector<uint32_t>(operator_history::max_workers + 50, 1)});
  auto j = nlohmann::json::parse(h.json());
  EXPECT_EQ(j["models"][0]["in_flight"][0].size(), operator_history::max_workers);
  // The same instant again, or a model count that does not match: no sample, a new baseline.
  h.record(2000, std::vector<route_totals>{t}, {});
  h.record(3000, std::vector<route_totals>{t, t}, {});
  EXPECT_EQ(h.size(), 1u);
  // Counters that went down (not within one process): no rate is made up from them.
  h.record(4000, std::vector<route_totals>{t}, {});
  h.record(5000, std::vector<route_totals>{route_totals{}}, {});
  j = nlohmann::json::parse(h.json());
  EXPECT_DOUBLE_EQ(j["models"][0]["routes_per_s"].back().get<double>(), 0.0);
  EXPECT_TRUE(j["models"][0]["p99_ms"].back().is_null());
}

TEST(OperatorView, ServesThePageTheSnapshotAndTheHistoryAndNothingElse) {
  operator_view v({"m"}, 5, 1000);
  const auto root = v.page("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->content_type, "text/html; charset=utf-8");
  EXPECT_NE(root->body.find("<!DOCTYPE html>"), std::string::npos);
  EXPECT_NE(root->body.find("/api/status"), std::string::npos);
  // Offline: nothing is loaded from another origin.
  EXPECT_EQ(root->body.find("src=\"http"), std::string::npos);
  EXPECT_EQ(root->body.find("href=\"http"), std::string::npos);

  EXPECT_EQ(v.page("/api/status")->body, R"({"starting":true})");
  v.set_status(R"({"node":{}})");
  EXPECT_EQ(v.page("/api/status")->body, R"({"node":{}})");
  EXPECT_EQ(v.page("/api/status")->content_type, "application/json");

  const route_totals t = add({}, 3, 1e-3, 1);
  v.record(1000, std::vector<route_totals>{t}, {});
  v.record(2000, std::vector<route_totals>{add(t, 4, 1e-3, 1)}, {{2}});
  const auto h = nlohmann::json::parse(v.page("/api/history")->body);
  EXPECT_EQ(h["interval_ms"], 1000);
  EXPECT_EQ(h["now_ms"], 2000);
  EXPECT_EQ(h["capacity"], 5);
  EXPECT_EQ(h["models"][0]["routes_per_s"], nlohmann::json::array({4.0}));

  EXPECT_FALSE(v.page("/api/"));
  EXPECT_FALSE(v.page("/api/statusx"));
  EXPECT_FALSE(v.page("/index.html"));
}

}  // namespace
}  // namespace eldr
