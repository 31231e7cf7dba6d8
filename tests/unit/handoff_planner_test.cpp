// handoff_planner: after a ring change every held block goes, once, to each owner it has on the
// new ring and did not have on the base ring (never to this node, never to a node that is not a
// receiver), in batches of at most the batch size, with the scan bounded per call so that the
// actor can answer other messages between slices. And the hand-off's byte form of counts.
#include "actors/sigcache/handoff_planner.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "actors/sigcache/handoff.hpp"

namespace eldr::sigcache {
namespace {

hash_ring ring(std::vector<std::string> members) {
  return *hash_ring::make(std::move(members), 16);
}

std::vector<handoff_planner::held_block> held(size_t n) {
  std::vector<handoff_planner::held_block> out;
  for (size_t i = 0; i < n; ++i)
    out.emplace_back(block_hash{1000 + i * 7919},
                     i == 0 ? std::nullopt : std::optional<block_hash>(1000 + (i - 1) * 7919));
  return out;
}

// Drains the planner: blocks per receiver (each block at most once per receiver), the batches'
// sizes, and how many calls returned nothing before it was done.
struct drained {
  std::map<std::string, std::vector<block_hash>> to;
  std::vector<size_t> sizes;
  int idle_calls = 0;
};
drained drain(handoff_planner& p, size_t scan) {
  drained d;
  for (int guard = 0; guard < 100000 && !p.done(); ++guard) {
    auto b = p.next(scan);
    if (!b) {
      ++d.idle_calls;
      continue;
    }
    d.sizes.push_back(b->blocks.size());
    for (const auto& [h, parent] : b->blocks)
      d.to[b->to].push_back(h);
  }
  return d;
}

// n3 joins n1 and n2 (R = 2): n1 hands n3 exactly the blocks n3 owns on the new ring and did not
// own before (it did not exist), nothing to n2 (its blocks did not move to it).
TEST(HandoffPlanner, ANodeThatJoinsGetsExactlyTheBlocksItNowOwns) {
  const auto before = ring({"n1", "n2"});
  const auto after = ring({"n1", "n2", "n3"});
  const auto blocks = held(2000);
  handoff_planner p(before, after, 2, "n1", {"n2", "n3"}, blocks, 64);
  const auto d = drain(p, 100000);
  EXPECT_EQ(d.to.count("n2"), 0u);
  std::set<block_hash> want;
  for (const auto& [h, parent] : blocks)
    if (after.owns("n3", h, 2)) want.insert(h);
  ASSERT_GT(want.size(), 100u);
  const std::set<block_hash> got(d.to.at("n3").begin(), d.to.at("n3").end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(d.to.at("n3").size(), want.size()) << "a block was sent twice";
  for (size_t s : d.sizes)
    EXPECT_LE(s, 64u);
}

// Without a base ring (this node knew no ring yet) every owner but this node is new; receivers
// that are not live signature-cache nodes get nothing.
TEST(HandoffPlanner, WithoutABaseEveryOtherOwnerIsNewAndOnlyReceiversGetBlocks) {
  const auto after = ring({"n1", "n2", "n3"});
  const auto blocks = held(500);
  handoff_planner p(std::nullopt, after, 3, "n1", {"n2"}, blocks, 1000);
  const auto d = drain(p, 100000);
  EXPECT_EQ(d.to.size(), 1u);
  EXPECT_EQ(d.to.at("n2").size(), blocks.size());  // R = 3 of 3: everybody owns everything
}

// The scan is bounded per call: with a batch larger than the blocks, each call scans `scan`
// blocks and returns nothing until the call that scans the last ones, which returns the partial
// batch.
TEST(HandoffPlanner, EachCallScansAtMostTheSliceAndThenFlushesWhatIsLeft) {
  const auto before = ring({"n1"});
  const auto after = ring({"n1", "n2"});
  handoff_planner p(before, after, 2, "n1", {"n2"}, held(1000), 5000);
  for (int call = 1; call < 10; ++call) {
    EXPECT_FALSE(p.next(100).has_value()) << call;
    EXPECT_EQ(p.scanned(), size_t(call) * 100);
    EXPECT_FALSE(p.done());
  }
  auto last = p.next(100);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->to, "n2");
  EXPECT_EQ(last->blocks.size(), 1000u);
  EXPECT_TRUE(p.done());
  EXPECT_FALSE(p.next(100).has_value());
}

TEST(HandoffPlanner, NothingMovesWhenTheRingDidNotGrowForAnyone) {
  const auto r = ring({"n1", "n2", "n3"});
  handoff_planner p(r, r, 2, "n1", {"n2", "n3"}, held(300), 16);
  const auto d = drain(p, 50);
  EXPECT_TRUE(d.to.empty());
  EXPECT_TRUE(p.done());
}

TEST(HandoffBytes, NarrowsCountsAndRefusesOneAboveAByte) {
  const auto b = handoff_bytes({0, 1, 16, 255});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<uint8_t>{0, 1, 16, 255}));
  EXPECT_FALSE(handoff_bytes({3, 256}).has_value());
}

}  // namespace
}  // namespace eldr::sigcache
