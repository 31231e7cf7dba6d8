// router_activity: which routers the peer estimate counts (core/membership/router_activity.hpp).
#include "core/membership/router_activity.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace eldr {
namespace {

using included = std::map<std::string, included_delta>;

TEST(RouterActivity, CountsItselfAloneUntilAVectorShowsAPeerDeciding) {
  router_activity a(250);
  EXPECT_EQ(a.active("self", 0), 1u);
  const included first{{"p", {1, 4}}, {"q", {1, 9}}};
  // The first vector of an authority has nothing to compare with.
  a.on_vector(nullptr, first, 10);
  EXPECT_EQ(a.active("self", 10), 1u);
  // p's delta advanced, q's did not: p decided since, q only listens.
  a.on_vector(&first, {{"p", {1, 5}}, {"q", {1, 9}}}, 20);
  EXPECT_EQ(a.active("self", 20), 2u);
  // Listed itself, the caller is not counted twice.
  a.on_vector(&first, {{"p", {1, 6}}, {"q", {1, 9}}, {"self", {1, 1}}}, 30);
  EXPECT_EQ(a.active("self", 30), 2u);
  EXPECT_EQ(a.active("other", 30), 3u);
}

TEST(RouterActivity, ARouterCountsForTheWindowAfterItWasLastSeen) {
  router_activity a(250);
  const included before{{"p", {1, 1}}};
  a.on_vector(&before, {{"p", {1, 2}}}, 100);
  EXPECT_EQ(a.active("self", 349), 2u);
  EXPECT_EQ(a.active("self", 350), 1u);
  // Seen again: counted again, from the new sighting.
  a.on_vector(&before, {{"p", {1, 3}}}, 400);
  EXPECT_EQ(a.active("self", 649), 2u);
  EXPECT_EQ(a.active("self", 650), 1u);
}

TEST(RouterActivity, ARestartedRouterAndANewlyListedOneCount) {
  router_activity a(250);
  const included before{{"p", {1, 7}}};
  // p restarted: another incarnation, its seq from 1 again (smaller, yet it decided).
  a.on_vector(&before, {{"p", {2, 1}}}, 0);
  EXPECT_EQ(a.active("self", 0), 2u);
  // r appears in the authority's included map for the first time: its first delta.
  a.on_vector(&before, {{"p", {1, 7}}, {"r", {1, 1}}}, 0);
  EXPECT_EQ(a.active("self", 0), 3u);
}

TEST(RouterActivity, OnDecidedMarksARouterAsTheSimulatorDoes) {
  router_activity a(100);
  a.on_decided("r1", 0);
  a.on_decided("r2", 50);
  EXPECT_EQ(a.active("r0", 60), 3u);
  EXPECT_EQ(a.active("r1", 60), 2u);
  EXPECT_EQ(a.active("r0", 100), 2u);  // r1's window lapsed
  EXPECT_EQ(a.active("r0", 150), 1u);
  EXPECT_EQ(a.window_ms(), 100);
}

TEST(RouterActivity, ForgetsRoutersWhoseWindowLapsed) {
  // Many routers seen once, long ago: a later vector prunes them, and they count no more.
  router_activity a(10);
  included before, after;
  for (int i = 0; i < 1000; ++i) {
    before["n" + std::to_string(i)] = {1, 1};
    after["n" + std::to_string(i)] = {1, 2};
  }
  a.on_vector(&before, after, 0);
  EXPECT_EQ(a.active("self", 0), 1001u);
  EXPECT_EQ(a.tracked(), 1000u);
  a.on_vector(&after, after, 20);
  EXPECT_EQ(a.active("self", 20), 1u);
  EXPECT_EQ(a.tracked(), 0u);
}

}  // namespace
}  // namespace eldr
