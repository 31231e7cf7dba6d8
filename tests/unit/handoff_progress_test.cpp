// handoff_progress: a router waits for every node of the ring before a join to finish its
// hand-off for the ring it now has; hand-offs finished before the wait starts count, those for
// another ring do not, and the kept rings are bounded.
#include "core/membership/handoff_progress.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eldr {
namespace {

const std::vector<std::string> before = {"n1", "n2"};
const std::vector<std::string> after = {"n1", "n2", "n3"};

TEST(HandoffProgress, WaitsForEverySenderOfTheRingBefore) {
  handoff_progress p;
  EXPECT_FALSE(p.start(before, after));
  EXPECT_TRUE(p.waiting());
  EXPECT_EQ(p.pending(), (std::set<std::string>{"n1", "n2"}));
  EXPECT_FALSE(p.on_done("n3", after));  // the newcomer's own hand-off is not waited for
  EXPECT_FALSE(p.on_done("n1", after));
  EXPECT_FALSE(p.on_done("n1", after));  // twice: still one
  EXPECT_TRUE(p.waiting());
  EXPECT_TRUE(p.on_done("n2", {"n3", "n2", "n1"}));  // any order of names
  EXPECT_FALSE(p.waiting());
  EXPECT_TRUE(p.pending().empty());
  EXPECT_FALSE(p.on_done("n2", after));  // nothing under way any more
}

TEST(HandoffProgress, HandOffsFinishedBeforeTheWaitCountAndOtherRingsDoNot) {
  handoff_progress p;
  EXPECT_FALSE(p.on_done("n1", after));
  EXPECT_FALSE(p.on_done("n2", {"n1", "n2", "n4"}));  // another ring
  EXPECT_FALSE(p.start(before, after));
  EXPECT_EQ(p.pending(), (std::set<std::string>{"n2"}));
  EXPECT_FALSE(p.on_done("n2", {"n1", "n2", "n4"}));
  EXPECT_TRUE(p.on_done("n2", after));
  // Everybody finished before the wait: there is none.
  handoff_progress q;
  q.on_done("n1", after);
  q.on_done("n2", after);
  EXPECT_TRUE(q.start(before, after));
  EXPECT_FALSE(q.waiting());
}

TEST(HandoffProgress, ANewRingRestartsTheWaitAndStopEndsIt) {
  handoff_progress p;
  p.start(before, after);
  p.on_done("n1", after);
  // n4 joins too before the hand-off to n3 finished: the senders hand off again for the new ring.
  const std::vector<std::string> bigger = {"n1", "n2", "n3", "n4"};
  EXPECT_FALSE(p.start(before, bigger));
  EXPECT_EQ(p.pending(), (std::set<std::string>{"n1", "n2"}));
  EXPECT_FALSE(p.on_done("n2", after));  // the old ring's no longer counts for the wait
  p.stop();
  EXPECT_FALSE(p.waiting());
  EXPECT_FALSE(p.on_done("n1", bigger));
}

// n2 leaves and rejoins: the ring {n1, n2} comes back, and the hand-off n1 finished for its first
// instance must not end the wait for the second.
TEST(HandoffProgress, AHandOffForAnEarlierInstanceOfTheSameRingDoesNotCount) {
  handoff_progress p;
  const std::vector<std::string> two = {"n1", "n2"}, one = {"n1"};
  p.on_ring(two);
  EXPECT_FALSE(p.on_done("n1", two));
  p.on_ring(one);  // n2 left
  p.on_ring(two);  // and is back
  EXPECT_FALSE(p.start(one, two));
  EXPECT_EQ(p.pending(), (std::set<std::string>{"n1"}));
  // A hand-off for the new ring that finishes before the router switches to it still counts.
  handoff_progress q;
  q.on_ring(one);
  q.on_done("n1", two);
  q.on_ring(two);
  EXPECT_TRUE(q.start(one, two));
}

// A newcomer n3 meets n1, then n2, while n1 (whose ring grew from {n1, n2} to all three at
// once) already finished handing off for the whole ring: that counts when n3's ring gets there.
// (Before, the step through {n1, n3} dropped it, and n3 waited for n1 until the grace ran out:
// seen in ClusterTest.ANodeThatJoinsUnderLoadMissesNoPrefixWhileItIsHandedItsBlocks.)
TEST(HandoffProgress, AHandOffForABiggerRingTheRouterIsGrowingTowardsCounts) {
  handoff_progress p;
  p.on_ring({"n3"});
  EXPECT_FALSE(p.on_done("n1", after));
  p.on_ring({"n1", "n3"});
  EXPECT_FALSE(p.start({"n1"}, {"n1", "n3"}));  // nobody hands off for this ring: waited for
  p.on_ring(after);
  EXPECT_FALSE(p.start(before, after));
  EXPECT_EQ(p.pending(), (std::set<std::string>{"n2"}));  // n1's finished hand-off counted
  // Once the router has had a ring, a hand-off kept for it goes when it leaves it, even towards
  // a smaller ring it holds.
  handoff_progress q;
  q.on_ring(after);
  q.on_done("n1", after);
  q.on_ring(before);  // n3 left
  q.on_ring(after);   // and is back
  EXPECT_FALSE(q.start(before, after));
  EXPECT_EQ(q.pending(), (std::set<std::string>{"n1", "n2"}));
}

TEST(HandoffProgress, KeepsTheFinishedHandOffsOfTheLastFewRingsOnly) {
  handoff_progress p;
  p.on_done("n1", after);
  for (size_t i = 0; i < handoff_progress::rings_kept; ++i)
    p.on_done("n1", {"n1", "x" + std::to_string(i)});
  EXPECT_FALSE(p.start({"n1"}, after));  // forgotten: waited for again
  EXPECT_TRUE(p.on_done("n1", after));
}

}  // namespace
}  // namespace eldr
