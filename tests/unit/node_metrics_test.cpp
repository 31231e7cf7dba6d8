// node_metrics: the shard request histogram keeps local and remote shards apart, in the
// route-latency buckets, in Prometheus text; build and cluster gauges.
#include "actors/node_metrics.hpp"

#include "actors/cluster/cluster_protocol.hpp"
#include "core/base/metrics.hpp"
#include "core/base/version.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eldr {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(NodeMetrics, ShardRequestsAreCountedByWhereTheShardIs) {
  node_metrics m;
  m.shard_answered(false, 0.0015);
  m.shard_answered(false, 0.0004);
  m.shard_answered(true, 0.00003);
  const std::string text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_bucket{shard=\"remote\",le=\"5e-04\"} 1"))
      << text;
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_bucket{shard=\"remote\",le=\"0.001\"} 1"))
      << text;
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_bucket{shard=\"remote\",le=\"0.002\"} 2"))
      << text;
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_count{shard=\"remote\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_count{shard=\"local\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "eldr_shard_request_seconds_bucket{shard=\"local\",le=\"5e-05\"} 1"))
      << text;
}

TEST(NodeMetrics, WorkerScrapesAreCountedByResultWithTheLastGoodValues) {
  node_metrics m;
  m.worker_scraped("q", 3, true, 12, 0.5f);
  m.worker_scraped("q", 3, true, 7, 0.25f);
  m.worker_scraped("q", 3, false, 0, 0.0f);
  const std::string text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_worker_scrapes_total{model=\"q\",result=\"ok\",worker=\"3\"} 2"))
      << text;
  EXPECT_TRUE(
      has_line(text, "eldr_worker_scrapes_total{model=\"q\",result=\"failed\",worker=\"3\"} 1"))
      << text;
  // A failed scrape leaves the last good values.
  EXPECT_TRUE(has_line(text, "eldr_worker_scraped_load{model=\"q\",worker=\"3\"} 7")) << text;
  EXPECT_TRUE(has_line(text, "eldr_worker_kv_cache_usage{model=\"q\",worker=\"3\"} 0.25")) << text;
  m.worker_scrape_age("q", 3, 0.25);
  EXPECT_TRUE(
      has_line("\n" + m.render(), "eldr_worker_scrape_age_seconds{model=\"q\",worker=\"3\"} 0.25"));
}

// A standalone node: the build, and no cluster gauges (nothing sets them).
TEST(NodeMetrics, BuildInfoFromTheStartAndClusterGaugesOnlyOnceSet) {
  node_metrics m;
  std::string text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_build_info{cluster_protocol=\"" +
                                 std::to_string(cluster_protocol_version) + "\",version=\"" +
                                 std::string(version) + "\"} 1"))
      << text;
  EXPECT_EQ(text.find("eldr_cluster_"), std::string::npos) << text;
  m.cluster_members(3);
  m.cluster_leadership(true, 7);
  text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_cluster_members 3")) << text;
  EXPECT_TRUE(has_line(text, "eldr_cluster_is_leader 1")) << text;
  EXPECT_TRUE(has_line(text, "eldr_cluster_term 7")) << text;
  m.cluster_leadership(false, 8);
  text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_cluster_is_leader 0")) << text;
  EXPECT_TRUE(has_line(text, "eldr_cluster_term 8")) << text;
}

// What status shows (router_status.cpp) is read back from the counters on the page: one count.
TEST(NodeMetrics, StatusReadersReturnTheCountersOnThePage) {
  node_metrics m;
  EXPECT_EQ(m.route_totals_of("q").routes, 0u);
  EXPECT_EQ(m.signature_blocks_of("q"), 0u);
  EXPECT_EQ(m.route_fallbacks_of("q", "no_counts"), 0u);
  m.route_decided("q", 1, 2, 1e-4, 1e-5, 3, 4);
  m.route_decided("q", 0, 1, 1e-4, 1e-5, 1, 5);
  m.route_decided("other", 0, 1, 1e-4, 1e-5, 7, 7);
  m.route_fallback("q", "no_counts");
  m.route_fallback("q", "no_counts");
  m.route_warning("q", "counts_geometry");
  m.swapped("q", 4);
  m.swapped("q", 5);
  m.swapped("q", 6);
  EXPECT_EQ(m.route_totals_of("q").routes, 2u);
  EXPECT_EQ(m.covered_blocks_of("q"), 4u);
  EXPECT_EQ(m.signature_blocks_of("q"), 9u);
  EXPECT_EQ(m.route_fallbacks_of("q", "no_counts"), 2u);
  EXPECT_EQ(m.route_fallbacks_of("q", "no_centroid_set"), 0u);
  EXPECT_EQ(m.route_fallbacks_of("other", "no_counts"), 0u);
  EXPECT_EQ(m.route_warnings_of("q", "counts_geometry"), 1u);
  EXPECT_EQ(m.swaps_of("q"), 3u);
  EXPECT_EQ(m.swaps_of("other"), 0u);
  const std::string text = "\n" + m.render();
  EXPECT_TRUE(has_line(text, "eldr_route_band_size_count{model=\"q\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "eldr_signature_covered_blocks_total{model=\"q\"} 4")) << text;
  EXPECT_TRUE(has_line(text, "eldr_signature_blocks_total{model=\"q\"} 9")) << text;
  EXPECT_TRUE(has_line(text, "eldr_route_fallbacks_total{model=\"q\",reason=\"no_counts\"} 2"))
      << text;
  EXPECT_TRUE(has_line(text, "eldr_centroid_swaps_total{model=\"q\"} 3")) << text;
}

// A component's own families (the signature cache's) are in the same registry, on the same page.
TEST(NodeMetrics, FamiliesRegisteredByAComponentAreOnThePage) {
  node_metrics m;
  auto c = m.registry().counter("eldr_publishers_forgotten_total", "Forgotten.");
  ASSERT_TRUE(c.ok());
  (*c)->inc();
  EXPECT_TRUE(has_line("\n" + m.render(), "eldr_publishers_forgotten_total 1"));
}

}  // namespace
}  // namespace eldr
