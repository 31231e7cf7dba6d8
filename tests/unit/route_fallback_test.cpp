// route_fallback: which reason a load-only decision of the locality policy gets, the warning
// texts, and the log limiter (time injected).
#include "core/route_fallback.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

fallback_facts eldr_with_set() {
  fallback_facts f;
  f.locality_policy = true;
  f.set_active = true;
  f.cache_answered = true;
  return f;
}

TEST(RouteFallback, EachLoadOnlyDecisionGetsItsReason) {
  fallback_facts f;
  EXPECT_EQ(classify_fallback(f), fallback_reason::none);  // jsq, rr, ...: chosen, not a fallback
  f.locality_policy = true;
  EXPECT_EQ(classify_fallback(f), fallback_reason::no_centroid_set);

  f = eldr_with_set();
  f.covered = 3;
  f.have_signature = true;
  EXPECT_EQ(classify_fallback(f), fallback_reason::none);
  // Refused counts but cached blocks made a signature: the decision used it.
  f.counts_refused = true;
  EXPECT_EQ(classify_fallback(f), fallback_reason::none);
  f.have_signature = false;
  EXPECT_EQ(classify_fallback(f), fallback_reason::counts_geometry);

  f = eldr_with_set();
  EXPECT_EQ(classify_fallback(f), fallback_reason::no_counts);
  f.covered = 2;
  EXPECT_EQ(classify_fallback(f), fallback_reason::signature_unusable);
  f.cache_answered = false;
  f.covered = 0;
  EXPECT_EQ(classify_fallback(f), fallback_reason::no_signature_cache);
}

TEST(RouteFallback, ReasonsHaveStableNames) {
  EXPECT_STREQ(to_string(fallback_reason::none), "");
  EXPECT_STREQ(to_string(fallback_reason::no_centroid_set), "no_centroid_set");
  EXPECT_STREQ(to_string(fallback_reason::no_signature_cache), "no_signature_cache");
  EXPECT_STREQ(to_string(fallback_reason::no_counts), "no_counts");
  EXPECT_STREQ(to_string(fallback_reason::counts_geometry), "counts_geometry");
  EXPECT_STREQ(to_string(fallback_reason::signature_unusable), "signature_unusable");
}

TEST(RouteFallback, CountsGeometryWarningNamesBothGeometriesAndTheOutcome) {
  EXPECT_EQ(counts_geometry_warning({48, 64, 6}, {48, 128, 8}, true),
            "counts_geometry: counts are L=48 E=64 k=6, the model is L=48 E=128 k=8; routed by "
            "load");
  EXPECT_EQ(
      counts_geometry_warning("counts of L=1 E=2 k=1 refused: the cache holds L=2 E=8 k=2", false),
      "counts_geometry: counts of L=1 E=2 k=1 refused: the cache holds L=2 E=8 k=2; routed "
      "on the cached blocks' counts");
}

TEST(RouteFallback, LogLimiterLetsOneLinePerIntervalAndCountsTheRest) {
  log_limiter l(10000);
  uint64_t held = 99;
  EXPECT_TRUE(l.allow(5, held));
  EXPECT_EQ(held, 0u);
  EXPECT_FALSE(l.allow(6, held));
  EXPECT_FALSE(l.allow(10004, held));
  EXPECT_TRUE(l.allow(10005, held));
  EXPECT_EQ(held, 2u);
  EXPECT_TRUE(l.allow(30000, held));
  EXPECT_EQ(held, 0u);
  EXPECT_EQ(log_limiter::held_note(0), "");
  EXPECT_EQ(log_limiter::held_note(2), " [2 more since the last line]");
}

}  // namespace
}  // namespace eldr
