// shard_plan: blocks this node owns stay local, the rest go to few nodes (greedy cover with its
// tie-breaks), exclusions are honoured, and on real rings every choice is a live owner and R = 2
// of 3 nodes never needs more than one other node; partial sums over different layer sets add
// where their layers meet, and travel packed in 2 or 4 bytes a value.
#include "core/membership/shard_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/membership/hash_ring.hpp"

namespace eldr {
namespace {

using owner_lists = std::vector<std::vector<uint32_t>>;

std::set<uint32_t> distinct(const std::vector<uint32_t>& chosen, std::optional<uint32_t> local) {
  std::set<uint32_t> out;
  for (uint32_t c : chosen)
    if (c != no_signer && (!local || c != *local)) out.insert(c);
  return out;
}

TEST(ShardPlan, EmptyRequest) {
  EXPECT_TRUE(choose_signers({}, 0u, {}).empty());
  EXPECT_TRUE(choose_signers({}, std::nullopt, {}).empty());
}

TEST(ShardPlan, BlocksOwnedHereAreSummedHere) {
  // Member 0 is this node: the primary of block 0, a replica of block 1, no owner of block 2.
  const owner_lists owners = {{0, 1}, {2, 0}, {1, 2}};
  const auto chosen = choose_signers(owners, 0u, {});
  EXPECT_EQ(chosen, (std::vector<uint32_t>{0, 0, 1}));  // block 2: tie 1 vs 2, 1 is nearest
}

TEST(ShardPlan, WithoutALocalShardEveryBlockGoesOut) {
  const owner_lists owners = {{0, 1}, {1, 0}, {0, 1}};
  // Both members cover all three blocks; member 0 is the nearest owner of two of them.
  EXPECT_EQ(choose_signers(owners, std::nullopt, {}), (std::vector<uint32_t>{0, 0, 0}));
  // A local member that owns nothing changes nothing.
  EXPECT_EQ(choose_signers(owners, 7u, {}), (std::vector<uint32_t>{0, 0, 0}));
}

TEST(ShardPlan, GreedyTakesTheOwnerOfMostOpenBlocksFirst) {
  // Member 2 owns three of the four blocks (never as primary); the fourth has owners 1 and 3,
  // a tie on coverage broken by nearness (1 is its primary).
  const owner_lists owners = {{1, 2}, {3, 2}, {4, 2}, {1, 3}};
  const auto chosen = choose_signers(owners, 0u, {});
  EXPECT_EQ(chosen, (std::vector<uint32_t>{2, 2, 2, 1}));
  EXPECT_EQ(distinct(chosen, 0u).size(), 2u);  // asking the primaries would have needed 4
}

TEST(ShardPlan, TiesOnCoverageAndNearnessGoToTheSmallerIndex) {
  const owner_lists owners = {{5, 3}, {3, 5}};
  EXPECT_EQ(choose_signers(owners, std::nullopt, {}), (std::vector<uint32_t>{3, 3}));
}

TEST(ShardPlan, ExcludedOwnersAreNeverChosen) {
  const owner_lists owners = {{0, 1, 2}, {1, 2, 0}, {2, 1, 0}};
  // The local shard failed: its blocks go to the owners left, here all to member 1 or 2.
  auto chosen = choose_signers(owners, 0u, {0});
  for (size_t i = 0; i < chosen.size(); ++i) {
    EXPECT_NE(chosen[i], 0u);
    EXPECT_NE(std::find(owners[i].begin(), owners[i].end(), chosen[i]), owners[i].end());
  }
  EXPECT_EQ(distinct(chosen, std::nullopt).size(), 1u);
  // Every owner of block 0 excluded: nobody can sum it; the others still can.
  chosen = choose_signers({{0, 1}, {1, 2}}, 0u, {0, 1});
  EXPECT_EQ(chosen, (std::vector<uint32_t>{no_signer, 2}));
}

TEST(ShardPlan, DoesNotDependOnTheOrderOfBlocks) {
  const owner_lists owners = {{1, 2}, {2, 3}, {3, 1}, {1, 4}, {4, 2}, {2, 1}};
  const auto chosen = choose_signers(owners, std::nullopt, {});
  owner_lists reversed(owners.rbegin(), owners.rend());
  auto back = choose_signers(reversed, std::nullopt, {});
  std::reverse(back.begin(), back.end());
  EXPECT_EQ(chosen, back);
}

hash_ring ring_of(size_t n) {
  std::vector<std::string> names;
  for (size_t i = 1; i <= n; ++i)
    names.push_back("n" + std::to_string(i));
  auto ring = hash_ring::make(names, 64);
  EXPECT_TRUE(ring.ok());
  return std::move(ring).value();
}

TEST(ShardPlan, OnRealRingsEveryBlockGoesToALiveOwner) {
  for (size_t nodes : {1u, 2u, 3u, 5u, 8u}) {
    const auto ring = ring_of(nodes);
    for (size_t r : {1u, 2u, 3u}) {
      for (uint32_t local = 0; local < nodes; ++local) {
        owner_lists owners;
        for (uint64_t h = 0; h < 64; ++h)
          owners.push_back(ring.owners(h * 7919 + local, r));
        const std::vector<uint32_t> excluded = {static_cast<uint32_t>((local + 1) % nodes)};
        const auto chosen = choose_signers(owners, local, excluded);
        for (size_t i = 0; i < owners.size(); ++i) {
          const auto& o = owners[i];
          const bool local_owns = std::find(o.begin(), o.end(), local) != o.end();
          const bool all_excluded = o.size() == 1 && o[0] == excluded[0];
          if (local_owns && excluded[0] != local) {
            EXPECT_EQ(chosen[i], local);
          } else if (all_excluded) {
            EXPECT_EQ(chosen[i], no_signer);
          } else {
            ASSERT_NE(chosen[i], no_signer);
            EXPECT_NE(std::find(o.begin(), o.end(), chosen[i]), o.end());
            EXPECT_NE(chosen[i], excluded[0]);
          }
        }
      }
    }
  }
}

TEST(ShardPlan, TwoOfThreeNeedsAtMostOneOtherNode) {
  // R = 2 of 3: every block this node does not own has the other two nodes as owners, so one of
  // them covers all of it.
  const auto ring = ring_of(3);
  for (uint32_t local = 0; local < 3; ++local) {
    owner_lists owners;
    for (uint64_t h = 0; h < 200; ++h)
      owners.push_back(ring.owners(h, 2));
    const auto chosen = choose_signers(owners, local, {});
    EXPECT_LE(distinct(chosen, local).size(), 1u);
    EXPECT_EQ(std::count(chosen.begin(), chosen.end(), no_signer), 0);
  }
}

TEST(ShardPlan, CommonLayers) {
  EXPECT_EQ(common_layers({0, 1, 2, 3}, {1, 3}), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(common_layers({1, 3}, {0, 1, 2}), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(common_layers({1, 3}, {}).empty());
}

TEST(ShardPlan, AddCommonLayersAddsWhereTheLayersMeet) {
  // Two experts. A shard's reply over layers {1, 2, 5}; the router sums layers {0, 2, 5}.
  const std::vector<uint32_t> from_layers = {1, 2, 5};
  const std::vector<uint32_t> from = {10, 11, 20, 21, 50, 51};
  const std::vector<uint32_t> to_layers = {0, 2, 5};
  std::vector<uint32_t> to = {1, 1, 1, 1, 1, 1};
  ASSERT_TRUE(add_common_layers(from_layers, from, to_layers, 2, to));
  // Layer 0: the shard lacks it; layer 1: the router does not want it.
  EXPECT_EQ(to, (std::vector<uint32_t>{1, 1, 21, 22, 51, 52}));
  // The same layers on both sides: a plain sum.
  std::vector<uint32_t> same(6, 0);
  ASSERT_TRUE(add_common_layers(from_layers, from, from_layers, 2, same));
  EXPECT_EQ(same, from);
  // Nothing in common.
  std::vector<uint32_t> none = {7, 7};
  ASSERT_TRUE(add_common_layers(from_layers, from, {3}, 2, none));
  EXPECT_EQ(none, (std::vector<uint32_t>{7, 7}));
}

TEST(ShardPlan, AddCommonLayersRefusesSizesThatDoNotMatchTheLayers) {
  std::vector<uint32_t> to(4, 0);
  const std::vector<uint32_t> short_from = {1, 2, 3};
  EXPECT_FALSE(add_common_layers({0, 1}, short_from, {0, 1}, 2, to));
  const std::vector<uint32_t> from = {1, 2, 3, 4};
  std::vector<uint32_t> short_to(3, 0);
  EXPECT_FALSE(add_common_layers({0, 1}, from, {0, 1}, 2, short_to));
  EXPECT_EQ(to, (std::vector<uint32_t>(4, 0)));
}

TEST(ShardPlan, SumsPackIntoTwoBytesWhenTheyFitElseFour) {
  std::vector<uint8_t> bytes;
  std::vector<uint32_t> back;
  const std::vector<uint32_t> small = {0, 1, 255, 256, 0xffff};
  EXPECT_EQ(pack_sums(small, bytes), 2);
  EXPECT_EQ(bytes.size(), small.size() * 2);
  EXPECT_EQ(bytes[4], 0xff);  // little-endian: 255 is ff 00
  EXPECT_EQ(bytes[5], 0x00);
  ASSERT_TRUE(unpack_sums(bytes, 2, back));
  EXPECT_EQ(back, small);
  const std::vector<uint32_t> large = {7, 0x10000, 0xffffffffu, 123456789};
  EXPECT_EQ(pack_sums(large, bytes), 4);
  EXPECT_EQ(bytes.size(), large.size() * 4);
  ASSERT_TRUE(unpack_sums(bytes, 4, back));
  EXPECT_EQ(back, large);
  EXPECT_EQ(pack_sums({}, bytes), 2);
  EXPECT_TRUE(bytes.empty());
  ASSERT_TRUE(unpack_sums(bytes, 2, back));
  EXPECT_TRUE(back.empty());
}

TEST(ShardPlan, UnpackRefusesOtherWidthsAndRaggedBytes) {
  std::vector<uint32_t> out;
  const std::vector<uint8_t> three = {1, 2, 3};
  EXPECT_FALSE(unpack_sums(three, 2, out));
  EXPECT_FALSE(unpack_sums(three, 4, out));
  EXPECT_FALSE(unpack_sums(three, 1, out));
  EXPECT_FALSE(unpack_sums(three, 3, out));
  EXPECT_FALSE(unpack_sums({}, 0, out));
}

}  // namespace
}  // namespace eldr
