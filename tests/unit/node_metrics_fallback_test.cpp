// node_metrics: the locality policy's load-only decisions and the warnings route replies carry
// are counted per model and reason, in Prometheus text (docs/node.md's metrics list).
#include <gtest/gtest.h>

#include <string>

#include "actors/node_metrics.hpp"

namespace eldr {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(NodeMetricsFallbacks, CountedPerModelAndReason) {
  node_metrics m;
  m.route_fallback("toy", "counts_geometry");
  m.route_fallback("toy", "counts_geometry");
  m.route_fallback("toy", "no_centroid_set");
  m.route_fallback("other", "no_counts");
  m.route_warning("toy", "counts_geometry");
  const std::string text = "\n" + m.render();
  EXPECT_TRUE(
      has_line(text, "eldr_route_fallbacks_total{model=\"toy\",reason=\"counts_geometry\"} 2"))
      << text;
  EXPECT_TRUE(
      has_line(text, "eldr_route_fallbacks_total{model=\"toy\",reason=\"no_centroid_set\"} 1"))
      << text;
  EXPECT_TRUE(has_line(text, "eldr_route_fallbacks_total{model=\"other\",reason=\"no_counts\"} 1"))
      << text;
  EXPECT_TRUE(
      has_line(text, "eldr_route_warnings_total{model=\"toy\",warning=\"counts_geometry\"} 1"))
      << text;
}

}  // namespace
}  // namespace eldr
