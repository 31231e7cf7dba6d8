// hash_ring: input validation, determinism across independently built rings and member orders,
// distinct replica sets, balance over small-integer block hashes, and the consistent-hashing
// promises -- adding a member moves about 1/(n+1) of the keys, all to it; removing one moves only
// its own keys; replica sets not containing a removed member do not change.
#include "core/membership/hash_ring.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace eldr {
namespace {

// Block hashes 0..n-1: deliberately non-uniform keys, to exercise the key mix.
constexpr uint64_t key_count = 200000;

hash_ring make_or_die(std::vector<std::string> members, uint32_t vnodes) {
  auto ring = hash_ring::make(std::move(members), vnodes);
  EXPECT_TRUE(ring.ok()) << ring.error().to_string();
  return std::move(ring).value();
}

std::vector<std::string> names(const hash_ring& ring, const std::vector<uint32_t>& indices) {
  std::vector<std::string> out;
  for (const uint32_t i : indices)
    out.push_back(ring.members().at(i));
  return out;
}

std::string primary_name(const hash_ring& ring, uint64_t key) {
  return ring.members().at(ring.primary(key).value());
}

const std::vector<std::string> five = {"node-1", "node-2", "node-3", "node-4", "node-5"};

TEST(HashRing, MakeRejectsBadInput) {
  EXPECT_EQ(hash_ring::make({"a", "b"}, 0).error().code(), status_code::invalid_argument);
  EXPECT_EQ(hash_ring::make({"a", "b", "a"}, 4).error().code(), status_code::invalid_argument);
  EXPECT_EQ(hash_ring::make({"a", ""}, 4).error().code(), status_code::invalid_argument);
  // Two members of 2^23 + 1 points each exceed max_points (2^24); checked before allocating.
  EXPECT_EQ(hash_ring::make({"a", "b"}, (1u << 23) + 1).error().code(), status_code::out_of_range);
}

TEST(HashRing, EmptyRingOwnsNothing) {
  const hash_ring ring = make_or_die({}, 16);
  EXPECT_TRUE(ring.empty());
  EXPECT_TRUE(ring.owners(42, 3).empty());
  EXPECT_FALSE(ring.primary(42).has_value());
  EXPECT_FALSE(ring.owns("node-1", 42, 3));
}

TEST(HashRing, MembersAreSortedAndIndexed) {
  const hash_ring ring = make_or_die({"c", "a", "b"}, 8);
  EXPECT_EQ(ring.members(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ring.index_of("a"), 0u);
  EXPECT_EQ(ring.index_of("c"), 2u);
  EXPECT_FALSE(ring.index_of("d").has_value());
  EXPECT_FALSE(ring.index_of("").has_value());
  EXPECT_EQ(ring.vnodes_per_member(), 8u);
}

// Two rings built separately, from the same names in different orders, agree on every owner
// list: positions depend on names only, not on construction order or on the process.
TEST(HashRing, IndependentRingsAndMemberOrderAgree) {
  const hash_ring a = make_or_die(five, 64);
  const hash_ring b = make_or_die({"node-4", "node-2", "node-5", "node-1", "node-3"}, 64);
  const hash_ring c = make_or_die({"node-5", "node-4", "node-3", "node-2", "node-1"}, 64);
  for (uint64_t key = 0; key < 20000; ++key) {
    const auto expected = names(a, a.owners(key, 3));
    ASSERT_EQ(names(b, b.owners(key, 3)), expected) << "key " << key;
    ASSERT_EQ(names(c, c.owners(key, 3)), expected) << "key " << key;
  }
}

// Owner lists hold min(r, n) distinct members, start with the primary, and extend each other:
// owners(k, r) is a prefix of owners(k, r + 1), so a replica never changes rank when r grows.
TEST(HashRing, OwnersAreDistinctPrefixesStartingWithThePrimary) {
  const hash_ring ring = make_or_die(five, 64);
  for (uint64_t key = 0; key < 5000; ++key) {
    EXPECT_TRUE(ring.owners(key, 0).empty());
    std::vector<uint32_t> previous;
    for (std::size_t r = 1; r <= 7; ++r) {
      const std::vector<uint32_t> o = ring.owners(key, r);
      ASSERT_EQ(o.size(), std::min<std::size_t>(r, 5)) << "key " << key << " r " << r;
      ASSERT_EQ(std::set<uint32_t>(o.begin(), o.end()).size(), o.size()) << "duplicate owner";
      ASSERT_EQ(o.front(), ring.primary(key).value());
      ASSERT_TRUE(std::equal(previous.begin(), previous.end(), o.begin()));
      previous = o;
    }
  }
}

TEST(HashRing, RBeyondMembersGivesEveryMember) {
  const hash_ring ring = make_or_die(five, 64);
  for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}}) {
    const std::vector<uint32_t> o = ring.owners(key, 100);
    EXPECT_EQ(std::set<uint32_t>(o.begin(), o.end()), (std::set<uint32_t>{0, 1, 2, 3, 4}));
  }
}

TEST(HashRing, SingleMemberAndSingleVnodeOwnEverything) {
  const hash_ring one = make_or_die({"only"}, 1);
  for (uint64_t key = 0; key < 1000; ++key) {
    EXPECT_EQ(one.owners(key, 3), (std::vector<uint32_t>{0}));
    EXPECT_TRUE(one.owns("only", key, 1));
  }
  // One vnode each: still every member reachable, just badly balanced.
  const hash_ring sparse = make_or_die(five, 1);
  EXPECT_EQ(sparse.owners(7, 5).size(), 5u);
}

TEST(HashRing, OwnsMatchesOwners) {
  const hash_ring ring = make_or_die(five, 32);
  for (uint64_t key = 0; key < 2000; ++key) {
    const auto o = names(ring, ring.owners(key, 2));
    for (const std::string& m : five)
      ASSERT_EQ(ring.owns(m, key, 2), std::find(o.begin(), o.end(), m) != o.end());
    ASSERT_FALSE(ring.owns("node-9", key, 5));
    ASSERT_FALSE(ring.owns(o.front(), key, 0));
  }
}

// With 64 vnodes, 5 members and 200k small-integer keys, every member's primary share is within
// +-25% of 1/5.
TEST(HashRing, PrimarySharesAreBalanced) {
  const hash_ring ring = make_or_die(five, 64);
  std::vector<uint64_t> count(5, 0);
  for (uint64_t key = 0; key < key_count; ++key)
    ++count[ring.primary(key).value()];
  const double ideal = static_cast<double>(key_count) / 5;
  double lo = 1e9, hi = 0;
  for (std::size_t m = 0; m < 5; ++m) {
    const double share = static_cast<double>(count[m]) / ideal;  // 1.0 = exactly 1/5
    lo = std::min(lo, share);
    hi = std::max(hi, share);
    EXPECT_GT(share, 0.75) << ring.members()[m];
    EXPECT_LT(share, 1.25) << ring.members()[m];
  }
  std::printf(
      "[hash_ring] 5 members x 64 vnodes, %llu keys: primary share / ideal in [%.3f, %.3f]\n",
      static_cast<unsigned long long>(key_count), lo, hi);
  RecordProperty("min_share_over_ideal", std::to_string(lo));
  RecordProperty("max_share_over_ideal", std::to_string(hi));
}

// Adding a 6th member moves the primary of about 1/6 of the keys (within +-25%), every one of them
// to the new member.
TEST(HashRing, AddingAMemberMovesAboutOneSixthAllToIt) {
  const hash_ring before = make_or_die(five, 64);
  std::vector<std::string> six = five;
  six.push_back("node-6");
  const hash_ring after = make_or_die(six, 64);
  uint64_t moved = 0;
  for (uint64_t key = 0; key < key_count; ++key) {
    const std::string was = primary_name(before, key);
    const std::string now = primary_name(after, key);
    if (was == now) continue;
    ++moved;
    ASSERT_EQ(now, "node-6") << "key " << key << " moved from " << was << " to " << now;
  }
  const double fraction = static_cast<double>(moved) / key_count;
  std::printf("[hash_ring] adding a 6th member moved %.4f of keys (ideal %.4f)\n", fraction,
              1.0 / 6);
  RecordProperty("moved_fraction_on_add", std::to_string(fraction));
  EXPECT_GT(fraction, 0.75 / 6);
  EXPECT_LT(fraction, 1.25 / 6);
}

// Removing a member moves only the keys it owned, and spreads them over all the others (the point
// of virtual nodes: no single neighbour inherits the whole load).
TEST(HashRing, RemovingAMemberMovesOnlyItsKeys) {
  const hash_ring before = make_or_die(five, 64);
  const hash_ring after = make_or_die({"node-1", "node-2", "node-4", "node-5"}, 64);
  std::vector<uint64_t> inherited(after.size(), 0);
  uint64_t orphaned = 0;
  for (uint64_t key = 0; key < key_count; ++key) {
    const std::string was = primary_name(before, key);
    const std::string now = primary_name(after, key);
    if (was != "node-3") {
      ASSERT_EQ(now, was) << "key " << key << " moved though its owner stayed";
    } else {
      ++orphaned;
      ++inherited[after.primary(key).value()];
    }
  }
  ASSERT_GT(orphaned, 0u);
  for (std::size_t m = 0; m < after.size(); ++m)
    EXPECT_GT(static_cast<double>(inherited[m]), 0.10 * static_cast<double>(orphaned))
        << after.members()[m] << " inherited too little of node-3's keys";
}

// Replica sets (r = 2): a key whose owners did not include the removed member keeps exactly the
// same owners, in the same order; one whose owners did keeps its surviving owner.
TEST(HashRing, ReplicaSetsSurviveRemovalOfOthers) {
  const hash_ring before = make_or_die(five, 64);
  const hash_ring after = make_or_die({"node-1", "node-2", "node-3", "node-5"}, 64);
  uint64_t affected = 0;
  for (uint64_t key = 0; key < key_count; ++key) {
    const auto was = names(before, before.owners(key, 2));
    const auto now = names(after, after.owners(key, 2));
    if (std::find(was.begin(), was.end(), "node-4") == was.end()) {
      ASSERT_EQ(now, was) << "key " << key;
    } else {
      ++affected;
      const std::string& survivor = was[0] == "node-4" ? was[1] : was[0];
      ASSERT_NE(std::find(now.begin(), now.end(), survivor), now.end()) << "key " << key;
    }
  }
  EXPECT_GT(affected, 0u);
}

// The same from the other side: adding a member changes a key's owner set only by bringing the
// new member into it.
TEST(HashRing, ReplicaSetsChangeOnAddOnlyByTheNewMember) {
  const hash_ring before = make_or_die(five, 64);
  std::vector<std::string> six = five;
  six.push_back("node-6");
  const hash_ring after = make_or_die(six, 64);
  for (uint64_t key = 0; key < 50000; ++key) {
    const auto was = names(before, before.owners(key, 2));
    const auto now = names(after, after.owners(key, 2));
    if (std::find(now.begin(), now.end(), "node-6") == now.end()) {
      ASSERT_EQ(now, was) << "key " << key;
    }
  }
}

// A router reads through the previous ring only when nodes joined and none left.
TEST(HashRing, OnlyJoinedWhenEveryMemberStaysAndOneIsAdded) {
  const hash_ring three = make_or_die({"a", "b", "c"}, 8);
  EXPECT_TRUE(only_joined(three, make_or_die({"a", "b", "c", "d"}, 8)));
  EXPECT_TRUE(only_joined(three, make_or_die({"0", "a", "b", "c", "z"}, 8)));
  EXPECT_FALSE(only_joined(three, three));                                 // no change
  EXPECT_FALSE(only_joined(three, make_or_die({"a", "b"}, 8)));            // one left
  EXPECT_FALSE(only_joined(three, make_or_die({"a", "b", "d", "e"}, 8)));  // one left, two came
  EXPECT_TRUE(only_joined(make_or_die({}, 8), make_or_die({"a"}, 8)));
}

// Which ring a router reads while a joining node is handed its blocks: the established nodes
// read the ring before the join; the newcomer (just started, its ring itself alone) reads the
// others'; a departure, no change or a ring of one is read at once.
TEST(HashRing, HandoffReadMembersForTheEstablishedNodesAndTheNewcomer) {
  using names = std::vector<std::string>;
  const hash_ring ab = make_or_die({"a", "b"}, 8);
  const hash_ring abc = make_or_die({"a", "b", "c"}, 8);
  const hash_ring c_alone = make_or_die({"c"}, 8);
  const hash_ring a_alone = make_or_die({"a"}, 8);
  // At a and b, which have served a while: read {a, b}, who hold every block.
  EXPECT_EQ(handoff_read_members(&ab, abc, "a", false), names({"a", "b"}));
  EXPECT_EQ(handoff_read_members(&ab, abc, "a", true), names({"a", "b"}));
  // At c, just started, alone until now (or with no ring yet): read the ring without itself.
  EXPECT_EQ(handoff_read_members(&c_alone, abc, "c", true), names({"a", "b"}));
  EXPECT_EQ(handoff_read_members(nullptr, abc, "c", true), names({"a", "b"}));
  // A lone node that has served a while, and one joins: the joiner, just started, reads it.
  EXPECT_EQ(handoff_read_members(&c_alone, make_or_die({"b", "c"}, 8), "c", true), names({"b"}));
  // Read at once: a member left; nothing changed; a ring of one; a router-only node (not in the
  // ring) that has just started.
  EXPECT_EQ(handoff_read_members(&abc, ab, "a", false), std::nullopt);
  EXPECT_EQ(handoff_read_members(&abc, make_or_die({"a", "b", "d"}, 8), "a", false), std::nullopt);
  EXPECT_EQ(handoff_read_members(&abc, abc, "a", false), std::nullopt);
  EXPECT_EQ(handoff_read_members(nullptr, a_alone, "a", true), std::nullopt);
  EXPECT_EQ(handoff_read_members(nullptr, abc, "r", true), std::nullopt);
  // A node that was alone and has not just started reads the new ring at once: alone, it missed
  // what the others wrote meanwhile (a healed partition), which the new ring's owners have; a
  // lone node that served a while owns every block again on the new ring when R >= 2.
  EXPECT_EQ(handoff_read_members(&c_alone, abc, "c", false), std::nullopt);
  EXPECT_EQ(handoff_read_members(&a_alone, ab, "a", false), std::nullopt);
}

}  // namespace
}  // namespace eldr
