// recall_gather: a marked retry's ask of the peers settles at the first decision a peer
// remembered, or -- when every peer answered without one or failed -- with a fresh decision;
// outcomes after it settled change nothing.
#include "core/membership/recall_gather.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

using step = recall_gather::step;

TEST(RecallGather, TheFirstRememberedDecisionAnswersAtOnce) {
  recall_gather g(3);
  EXPECT_EQ(g.on_answer(std::nullopt), step::wait);
  EXPECT_EQ(g.on_answer(recalled_decision{2, 7}), step::answer);
  ASSERT_TRUE(g.found().has_value());
  EXPECT_EQ(g.found()->worker, 2u);
  EXPECT_EQ(g.found()->epoch, 7u);
  EXPECT_TRUE(g.settled());
  // The third peer's late answer, even a different decision, changes nothing.
  EXPECT_EQ(g.on_answer(recalled_decision{1, 7}), step::settled);
  EXPECT_EQ(g.on_failure(), step::settled);
  EXPECT_EQ(g.found()->worker, 2u);
  EXPECT_EQ(g.failures(), 0u);
}

TEST(RecallGather, NoPeerRemembersIt) {
  recall_gather g(2);
  EXPECT_EQ(g.on_answer(std::nullopt), step::wait);
  EXPECT_FALSE(g.settled());
  EXPECT_EQ(g.on_answer(std::nullopt), step::decide_afresh);
  EXPECT_TRUE(g.settled());
  EXPECT_FALSE(g.found().has_value());
  EXPECT_EQ(g.on_answer(recalled_decision{0, 1}), step::settled);  // too late: already decided
  EXPECT_FALSE(g.found().has_value());
}

TEST(RecallGather, PeersThatFailAreCountedAndTheRouterDecidesWhenAllAreIn) {
  recall_gather g(3);
  EXPECT_EQ(g.on_failure(), step::wait);
  EXPECT_EQ(g.on_answer(std::nullopt), step::wait);
  EXPECT_EQ(g.on_failure(), step::decide_afresh);
  EXPECT_EQ(g.failures(), 2u);
  EXPECT_FALSE(g.found().has_value());
}

TEST(RecallGather, ADecisionAfterAFailureStillAnswers) {
  recall_gather g(2);
  EXPECT_EQ(g.on_failure(), step::wait);
  EXPECT_EQ(g.on_answer(recalled_decision{3, 4}), step::answer);
  EXPECT_EQ(g.failures(), 1u);
  EXPECT_EQ(g.found()->worker, 3u);
}

TEST(RecallGather, OnePeer) {
  recall_gather a(1);
  EXPECT_EQ(a.on_answer(recalled_decision{0, 1}), step::answer);
  recall_gather b(1);
  EXPECT_EQ(b.on_failure(), step::decide_afresh);
  EXPECT_EQ(b.failures(), 1u);
}

}  // namespace
}  // namespace eldr
