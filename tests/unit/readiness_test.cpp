// readiness_board: the /readyz verdict from what the actors publish -- workers, centroid sets,
// stores and cluster membership -- with time injected.
#include "actors/readiness.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace eldr {
namespace {

nlohmann::json body(const readiness_verdict& v) {
  return nlohmann::json::parse(v.body);
}

TEST(Readiness, NotReadyUntilTheRouterPublishesAWorker) {
  readiness_board b({"m"}, /*routes=*/true, /*clustered=*/false);
  auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  EXPECT_EQ(body(v)["reasons"][0]["part"], "workers");
  b.set_routing("m", 0, readiness_board::forever, false, false);
  v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  EXPECT_EQ(body(v)["reasons"][0]["model"], "m");
  EXPECT_NE(body(v)["reasons"][0]["reason"].get<std::string>().find("no decode worker"),
            std::string::npos);
  b.set_routing("m", 1, readiness_board::forever, false, false);
  v = b.evaluate(0);
  EXPECT_TRUE(v.ready) << v.body;
  EXPECT_EQ(body(v), (nlohmann::json{{"ready", true},
                                     {"reasons", nlohmann::json::array()},
                                     {"degraded", nlohmann::json::array()}}));
}

TEST(Readiness, EveryModelMustBeRoutable) {
  readiness_board b({"a", "b"}, true, false);
  b.set_routing("a", 2, readiness_board::forever, false, false);
  auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  ASSERT_EQ(body(v)["reasons"].size(), 1u);
  EXPECT_EQ(body(v)["reasons"][0]["model"], "b");
  b.set_routing("b", 1, readiness_board::forever, false, false);
  EXPECT_TRUE(b.evaluate(0).ready);
  b.set_routing("unknown", 0, 0, true, false);  // ignored
  EXPECT_TRUE(b.evaluate(0).ready);
}

TEST(Readiness, WorkersSilentPastTheirDeadlineMakeItNotReady) {
  readiness_board b({"m"}, true, false);
  b.set_routing("m", 1, 1000, false, false);
  EXPECT_TRUE(b.evaluate(1000).ready);
  const auto v = b.evaluate(1001);
  EXPECT_FALSE(v.ready);
  EXPECT_NE(body(v)["reasons"][0]["reason"].get<std::string>().find("silent"), std::string::npos);
}

TEST(Readiness, PolicyThatNeedsASetWaitsForOne) {
  readiness_board b({"m"}, true, false);
  b.set_routing("m", 4, readiness_board::forever, /*policy_needs_set=*/true, /*has_set=*/false);
  auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  EXPECT_EQ(body(v)["reasons"][0]["part"], "centroids");
  b.set_routing("m", 4, readiness_board::forever, true, true);
  EXPECT_TRUE(b.evaluate(0).ready);
}

TEST(Readiness, StoreNotWritableIsNotReadyUnlessDegraded) {
  readiness_board b({"m"}, true, false);
  b.set_routing("m", 1, readiness_board::forever, false, false);
  b.set_store("m", false, false, "disk full");
  auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  EXPECT_EQ(body(v)["reasons"][0]["part"], "store");
  EXPECT_EQ(body(v)["reasons"][0]["reason"], "disk full");
  b.set_store("m", false, true, "disk full: read-only, routing continues");
  v = b.evaluate(0);
  EXPECT_TRUE(v.ready);
  EXPECT_EQ(body(v)["degraded"][0]["part"], "store");
  EXPECT_EQ(body(v)["degraded"][0]["reason"], "disk full: read-only, routing continues");
  b.set_store("m", true, false, "");
  EXPECT_TRUE(body(b.evaluate(0))["degraded"].empty());
}

TEST(Readiness, ANodeWithoutTheRouterRoleNeedsOnlyItsStoreAndTheCluster) {
  readiness_board b({"m"}, /*routes=*/false, /*clustered=*/true);
  auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  ASSERT_EQ(body(v)["reasons"].size(), 1u);
  EXPECT_EQ(body(v)["reasons"][0]["part"], "cluster");
  b.set_cluster(true, "");
  EXPECT_TRUE(b.evaluate(0).ready);
  b.set_cluster(false, "no refit leader known");
  EXPECT_EQ(body(b.evaluate(0))["reasons"][0]["reason"], "no refit leader known");
}

TEST(Readiness, InvalidUtf8InAReasonIsReplacedNotThrown) {
  readiness_board b({"m"}, false, false);
  b.set_store("m", false, false, std::string("bad \xff byte"));
  const auto v = b.evaluate(0);
  EXPECT_FALSE(v.ready);
  EXPECT_NO_THROW(body(v));
}

TEST(Readiness, ConcurrentWritersAndReadersAreSafe) {
  readiness_board b({"m"}, true, false);
  std::thread writer([&] {
    for (uint32_t i = 0; i < 20000; ++i)
      b.set_routing("m", i % 3, readiness_board::forever, false, false);
  });
  uint32_t ready = 0;
  for (int i = 0; i < 20000; ++i)
    ready += b.evaluate(0).ready ? 1 : 0;
  writer.join();
  b.set_routing("m", 1, readiness_board::forever, false, false);
  EXPECT_TRUE(b.evaluate(0).ready);
  (void)ready;
}

}  // namespace
}  // namespace eldr
