// leadership: the majority rule, the smallest-name rule, terms on takeover and their stability,
// stepping down on newer terms and equal-term conflicts, a split brain where only the majority
// side leads; epoch_fence: stale leaders, monotone epochs and idempotent duplicates.
#include "core/leadership.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eldr {
namespace {

member_view refit(std::string name) {
  return {std::move(name), true};
}
member_view plain(std::string name) {
  return {std::move(name), false};
}

TEST(Leadership, StartsWithoutLeaderOrTerm) {
  leadership l("node-a", true);
  EXPECT_EQ(l.self(), "node-a");
  EXPECT_TRUE(l.self_refit_role());
  EXPECT_FALSE(l.is_leader());
  EXPECT_EQ(l.term(), 0u);
  EXPECT_EQ(l.highest_term_seen(), 0u);
  EXPECT_FALSE(l.leader().has_value());
}

// Five known members: seeing three (self included) is a majority, seeing two is not.
TEST(Leadership, StrictMajorityIsRequired) {
  leadership three("node-a", true);
  const leader_decision d3 = three.evaluate({refit("node-b"), plain("node-c")}, 5);
  EXPECT_TRUE(d3.has_quorum);
  EXPECT_TRUE(d3.self_leads);
  EXPECT_TRUE(three.is_leader());

  leadership two("node-a", true);
  const leader_decision d2 = two.evaluate({plain("node-c")}, 5);
  EXPECT_FALSE(d2.has_quorum);
  EXPECT_FALSE(d2.self_leads);
  EXPECT_EQ(d2.leader, "");
  EXPECT_FALSE(two.is_leader());
  EXPECT_EQ(two.highest_term_seen(), 0u) << "no term is taken without quorum";

  // Half is not a majority: 2 of 4.
  leadership half("node-a", true);
  EXPECT_FALSE(half.evaluate({refit("node-b")}, 4).has_quorum);
  // A lone node of a one-member cluster leads itself.
  leadership alone("node-a", true);
  EXPECT_TRUE(alone.evaluate({}, 1).self_leads);
}

// Duplicate entries and entries naming self do not inflate the visible count.
TEST(Leadership, DuplicatesAndSelfDoNotCountTwice) {
  leadership l("node-a", true);
  const leader_decision d =
      l.evaluate({plain("node-c"), plain("node-c"), refit("node-a"), plain("node-a")}, 5);
  EXPECT_FALSE(d.has_quorum) << "only node-a and node-c are visible: 2 of 5";
}

// Self's role is fixed at construction: a view claiming self has the refit role does not make a
// non-refit node lead.
TEST(Leadership, SelfRoleComesFromConstruction) {
  leadership l("node-a", false);
  const leader_decision d = l.evaluate({refit("node-a"), refit("node-b"), plain("node-c")}, 3);
  EXPECT_FALSE(d.self_leads);
  EXPECT_EQ(d.leader, "node-b");
}

TEST(Leadership, SmallestAliveRefitNameWins) {
  const std::vector<member_view> view = {refit("node-d"), plain("node-a"), refit("node-c"),
                                         plain("node-b")};
  // Seen from node-e (refit): node-c is the smallest refit member; node-a and node-b are smaller
  // but lack the role.
  leadership e("node-e", true);
  const leader_decision de = e.evaluate(view, 5);
  EXPECT_TRUE(de.has_quorum);
  EXPECT_FALSE(de.self_leads);
  EXPECT_EQ(de.leader, "node-c");

  // Seen from node-c itself: it leads.
  leadership c("node-c", true);
  const leader_decision dc =
      c.evaluate({refit("node-d"), plain("node-a"), plain("node-b"), refit("node-e")}, 5);
  EXPECT_TRUE(dc.self_leads);
  EXPECT_EQ(dc.leader, "node-c");

  // node-c dies: node-d is next.
  leadership e2("node-e", true);
  EXPECT_EQ(e2.evaluate({refit("node-d"), plain("node-a"), plain("node-b")}, 5).leader, "node-d");

  // No refit-role member visible: quorum but no leader.
  leadership b("node-b", false);
  const leader_decision db = b.evaluate({plain("node-a"), plain("node-c")}, 5);
  EXPECT_TRUE(db.has_quorum);
  EXPECT_EQ(db.leader, "");
  EXPECT_FALSE(db.self_leads);
}

TEST(Leadership, TakeoverTermExceedsEveryObservedTerm) {
  leadership l("node-a", true);
  l.observe_term(7);
  l.observe_term(41);
  l.observe_term(12);  // older terms do not lower it
  EXPECT_EQ(l.highest_term_seen(), 41u);
  const leader_decision d = l.evaluate({refit("node-b"), plain("node-c")}, 3);
  EXPECT_TRUE(d.self_leads);
  EXPECT_TRUE(d.took_over);
  EXPECT_EQ(d.term, 42u);
  EXPECT_EQ(l.term(), 42u);
  EXPECT_EQ(l.highest_term_seen(), 42u);
  ASSERT_TRUE(l.leader().has_value());
  EXPECT_EQ(l.leader()->name, "node-a");
  EXPECT_EQ(l.leader()->term, 42u);
}

TEST(Leadership, ReevaluatingWhileLeaderKeepsTheTerm) {
  leadership l("node-a", true);
  const std::vector<member_view> view = {refit("node-b"), plain("node-c")};
  const leader_decision first = l.evaluate(view, 3);
  ASSERT_TRUE(first.took_over);
  for (int i = 0; i < 5; ++i) {
    const leader_decision again = l.evaluate(view, 3);
    EXPECT_TRUE(again.self_leads);
    EXPECT_FALSE(again.took_over);
    EXPECT_EQ(again.term, first.term);
  }
  // A view change that keeps self the rightful leader keeps the term too.
  EXPECT_EQ(l.evaluate({refit("node-b"), plain("node-c"), plain("node-d")}, 4).term, first.term);
}

// Every new stint takes a fresh term, even when nobody else led in between.
TEST(Leadership, LosingAndRegainingQuorumTakesANewTerm) {
  leadership l("node-a", true);
  EXPECT_EQ(l.evaluate({refit("node-b"), plain("node-c")}, 3).term, 1u);
  const leader_decision lost = l.evaluate({}, 3);
  EXPECT_FALSE(lost.has_quorum);
  EXPECT_FALSE(l.is_leader());
  EXPECT_EQ(l.term(), 0u);
  const leader_decision back = l.evaluate({plain("node-c")}, 3);
  EXPECT_TRUE(back.took_over);
  EXPECT_EQ(back.term, 2u);
}

TEST(Leadership, SmallerRefitMemberAppearingTakesOver) {
  leadership b("node-b", true);
  ASSERT_TRUE(b.evaluate({plain("node-c")}, 3).self_leads);
  const leader_decision d = b.evaluate({refit("node-a"), plain("node-c")}, 3);
  EXPECT_FALSE(d.self_leads);
  EXPECT_EQ(d.leader, "node-a");
  EXPECT_FALSE(b.is_leader());
}

TEST(Leadership, NewerTermStepsTheLeaderDown) {
  leadership l("node-a", true);
  ASSERT_EQ(l.evaluate({plain("node-b"), plain("node-c")}, 3).term, 1u);
  EXPECT_FALSE(l.observe_term(1)) << "its own term changes nothing";
  EXPECT_TRUE(l.is_leader());
  EXPECT_TRUE(l.observe_term(5));
  EXPECT_FALSE(l.is_leader());
  EXPECT_FALSE(l.leader().has_value());
  // Still the rightful leader by its own view: it takes over above the term it saw.
  const leader_decision d = l.evaluate({plain("node-b"), plain("node-c")}, 3);
  EXPECT_TRUE(d.took_over);
  EXPECT_EQ(d.term, 6u);
}

TEST(Leadership, AnnouncementsRecordTheLeader) {
  leadership c("node-c", true);
  EXPECT_FALSE(c.observe_leader("node-a", 3));
  ASSERT_TRUE(c.leader().has_value());
  EXPECT_EQ(c.leader()->name, "node-a");
  EXPECT_EQ(c.leader()->term, 3u);
  EXPECT_EQ(c.highest_term_seen(), 3u);
  // A stale announcement (older term) does not replace it.
  c.observe_leader("node-b", 2);
  EXPECT_EQ(c.leader()->name, "node-a");
  // The leader stays known while visible, and is forgotten once it is not.
  c.evaluate({refit("node-a"), plain("node-b")}, 3);
  ASSERT_TRUE(c.leader().has_value());
  EXPECT_EQ(c.leader()->name, "node-a");
  const leader_decision d = c.evaluate({plain("node-b")}, 3);
  ASSERT_TRUE(c.leader().has_value());
  EXPECT_EQ(c.leader()->name, "node-c");
  EXPECT_TRUE(d.self_leads);
  EXPECT_EQ(d.term, 4u);
  // An announcement naming self (an echo of an old stint) does not make it leader.
  leadership x("node-x", true);
  EXPECT_FALSE(x.observe_leader("node-x", 9));
  EXPECT_FALSE(x.is_leader());
  EXPECT_EQ(x.highest_term_seen(), 9u);
}

// Two nodes took the same term: the smaller name keeps it, the larger steps down.
TEST(Leadership, EqualTermConflictResolvesByName) {
  leadership a("node-a", true);
  leadership b("node-b", true);
  ASSERT_EQ(a.evaluate({plain("node-c")}, 3).term, 1u);  // node-a cannot see node-b
  ASSERT_EQ(b.evaluate({plain("node-c")}, 3).term, 1u);  // node-b cannot see node-a
  EXPECT_FALSE(a.observe_leader("node-b", 1));
  EXPECT_TRUE(a.is_leader());
  EXPECT_TRUE(b.observe_leader("node-a", 1));
  EXPECT_FALSE(b.is_leader());
  ASSERT_TRUE(b.leader().has_value());
  EXPECT_EQ(b.leader()->name, "node-a");
}

// Five members split {a, b} | {c, d, e}, all with the refit role. node-a would win by name but
// sees only two of five; node-c leads the majority side.
TEST(Leadership, OnlyTheMajoritySideOfASplitLeads) {
  leadership a("node-a", true);
  leadership c("node-c", true);
  // Before the split both agree on node-a.
  const std::vector<member_view> all = {refit("node-a"), refit("node-b"), refit("node-c"),
                                        refit("node-d"), refit("node-e")};
  const leader_decision before = a.evaluate(all, 5);
  ASSERT_TRUE(before.self_leads);
  EXPECT_EQ(c.evaluate(all, 5).leader, "node-a");
  c.observe_leader("node-a", before.term);  // node-a's announcement reached node-c

  const leader_decision minority = a.evaluate({refit("node-b")}, 5);
  const leader_decision majority = c.evaluate({refit("node-d"), refit("node-e")}, 5);
  EXPECT_FALSE(minority.has_quorum);
  EXPECT_FALSE(minority.self_leads);
  EXPECT_FALSE(a.is_leader());
  EXPECT_TRUE(majority.has_quorum);
  EXPECT_TRUE(majority.self_leads);
  EXPECT_GT(majority.term, before.term);

  // A router that accepted node-a's last publish rejects it once node-c's term reaches it.
  epoch_fence router;
  ASSERT_EQ(router.offer(before.term, 10), fence_result::accepted);
  ASSERT_EQ(router.offer(majority.term, 11), fence_result::accepted);
  EXPECT_EQ(router.offer(before.term, 12), fence_result::stale_term);
}

TEST(Leadership, StepDownRelinquishesUntilReevaluated) {
  leadership l("node-a", true);
  ASSERT_TRUE(l.evaluate({plain("node-b")}, 2).self_leads);
  l.step_down();
  EXPECT_FALSE(l.is_leader());
  EXPECT_FALSE(l.leader().has_value());
  EXPECT_EQ(l.evaluate({plain("node-b")}, 2).term, 2u);
}

// known_members below the visible count is stale configuration: the visible count is used.
TEST(Leadership, KnownMembersBelowVisibleUsesVisible) {
  leadership l("node-a", true);
  EXPECT_TRUE(l.evaluate({plain("node-b"), plain("node-c")}, 1).self_leads);
}

TEST(EpochFence, FirstPublishAcceptedThenEpochsMustGrow) {
  epoch_fence f;
  EXPECT_FALSE(f.has_epoch());
  EXPECT_EQ(f.offer(1, 0), fence_result::accepted);
  EXPECT_TRUE(f.has_epoch());
  EXPECT_EQ(f.offer(1, 1), fence_result::accepted);
  EXPECT_EQ(f.offer(1, 5), fence_result::accepted);
  EXPECT_EQ(f.offer(1, 3), fence_result::old_epoch);
  EXPECT_EQ(f.epoch(), 5u);
  EXPECT_EQ(f.term(), 1u);
}

TEST(EpochFence, DuplicateIsIdempotent) {
  epoch_fence f;
  ASSERT_EQ(f.offer(2, 7), fence_result::accepted);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(f.offer(2, 7), fence_result::duplicate);
  EXPECT_EQ(f.term(), 2u);
  EXPECT_EQ(f.epoch(), 7u);
  // The same epoch under a newer term is not a duplicate: it is not newer.
  EXPECT_EQ(f.offer(3, 7), fence_result::old_epoch);
}

TEST(EpochFence, StaleLeaderRejectedEvenWithAHigherEpoch) {
  epoch_fence f;
  ASSERT_EQ(f.offer(4, 10), fence_result::accepted);
  ASSERT_EQ(f.offer(5, 11), fence_result::accepted);  // new leader
  EXPECT_EQ(f.offer(4, 12), fence_result::stale_term);
  EXPECT_EQ(f.offer(4, 11), fence_result::stale_term);
  EXPECT_EQ(f.epoch(), 11u);
  EXPECT_EQ(f.offer(5, 12), fence_result::accepted);
}

// A new leader's refused publish (its epoch lagging) still fences the old leader.
TEST(EpochFence, RefusedOfferFromNewTermStillFences) {
  epoch_fence f;
  ASSERT_EQ(f.offer(4, 10), fence_result::accepted);
  EXPECT_EQ(f.offer(5, 3), fence_result::old_epoch);
  EXPECT_EQ(f.highest_term(), 5u);
  EXPECT_EQ(f.offer(4, 11), fence_result::stale_term);
  EXPECT_EQ(f.offer(5, 11), fence_result::accepted);
}

TEST(EpochFence, ObservedTermFencesBeforeAnyPublish) {
  epoch_fence f(3, 20);
  EXPECT_TRUE(f.has_epoch());
  EXPECT_EQ(f.offer(3, 20), fence_result::duplicate);
  f.observe_term(4);
  f.observe_term(2);  // never lowers
  EXPECT_EQ(f.highest_term(), 4u);
  EXPECT_EQ(f.offer(3, 21), fence_result::stale_term);
  EXPECT_EQ(f.offer(4, 21), fence_result::accepted);
}

TEST(EpochFence, ResultNames) {
  EXPECT_EQ(to_string(fence_result::accepted), "accepted");
  EXPECT_EQ(to_string(fence_result::stale_term), "stale_term");
  EXPECT_EQ(to_string(fence_result::old_epoch), "old_epoch");
  EXPECT_EQ(to_string(fence_result::duplicate), "duplicate");
}

TEST(Leadership, BystandersSettleTwoClaimsOfOneTermOnTheSmallerName) {
  leadership l("n3", true);
  EXPECT_FALSE(l.observe_leader("n1", 1));
  EXPECT_FALSE(l.observe_leader("n2", 1));  // a later, larger claim of the same term
  ASSERT_TRUE(l.leader().has_value());
  EXPECT_EQ(l.leader()->name, "n1");
  EXPECT_FALSE(l.observe_leader("n2", 2));  // a newer term wins whatever the name
  EXPECT_EQ(l.leader()->name, "n2");
  EXPECT_EQ(l.leader()->term, 2u);
}

}  // namespace
}  // namespace eldr
