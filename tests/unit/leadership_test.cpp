// leadership: the majority rule, the smallest-name rule, campaigns and their votes, terms and
// their stability, stepping down on newer terms and equal-term conflicts, a split brain where only
// the majority side leads; vote_box: one vote per term; next_epoch: epochs numbered inside their
// term; epoch_fence: stale leaders, monotone epochs and idempotent duplicates.
#include "core/membership/leadership.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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

// evaluate, and when it campaigns, the votes of every known member; returns the decision as the
// node sees it afterwards (leading, when the rule named it).
leader_decision elect(leadership& l, const std::vector<member_view>& view, std::size_t known) {
  const leader_decision d = l.evaluate(view, known);
  if (!d.campaign) return d;
  const std::size_t all = std::max(known, view.size() + 1);
  EXPECT_TRUE(l.campaign_result(d.term, all, all));
  return l.evaluate(view, known);
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
  const leader_decision d3 = elect(three, {refit("node-b"), plain("node-c")}, 5);
  EXPECT_TRUE(d3.has_quorum);
  EXPECT_TRUE(d3.self_leads);
  EXPECT_TRUE(three.is_leader());

  leadership two("node-a", true);
  const leader_decision d2 = elect(two, {plain("node-c")}, 5);
  EXPECT_FALSE(d2.has_quorum);
  EXPECT_FALSE(d2.self_leads);
  EXPECT_EQ(d2.leader, "");
  EXPECT_FALSE(two.is_leader());
  EXPECT_EQ(two.highest_term_seen(), 0u) << "no term is taken without quorum";

  // Half is not a majority: 2 of 4.
  leadership half("node-a", true);
  EXPECT_FALSE(elect(half, {refit("node-b")}, 4).has_quorum);
  // A lone node of a one-member cluster leads itself.
  leadership alone("node-a", true);
  EXPECT_TRUE(elect(alone, {}, 1).self_leads);
}

// Duplicate entries and entries naming self do not inflate the visible count.
TEST(Leadership, DuplicatesAndSelfDoNotCountTwice) {
  leadership l("node-a", true);
  const leader_decision d =
      elect(l, {plain("node-c"), plain("node-c"), refit("node-a"), plain("node-a")}, 5);
  EXPECT_FALSE(d.has_quorum) << "only node-a and node-c are visible: 2 of 5";
}

// Self's role is fixed at construction: a view claiming self has the refit role does not make a
// non-refit node lead.
TEST(Leadership, SelfRoleComesFromConstruction) {
  leadership l("node-a", false);
  const leader_decision d = elect(l, {refit("node-a"), refit("node-b"), plain("node-c")}, 3);
  EXPECT_FALSE(d.self_leads);
  EXPECT_EQ(d.leader, "node-b");
}

TEST(Leadership, SmallestAliveRefitNameWins) {
  const std::vector<member_view> view = {refit("node-d"), plain("node-a"), refit("node-c"),
                                         plain("node-b")};
  // Seen from node-e (refit): node-c is the smallest refit member; node-a and node-b are smaller
  // but lack the role.
  leadership e("node-e", true);
  const leader_decision de = elect(e, view, 5);
  EXPECT_TRUE(de.has_quorum);
  EXPECT_FALSE(de.self_leads);
  EXPECT_EQ(de.leader, "node-c");

  // Seen from node-c itself: it leads.
  leadership c("node-c", true);
  const leader_decision dc =
      elect(c, {refit("node-d"), plain("node-a"), plain("node-b"), refit("node-e")}, 5);
  EXPECT_TRUE(dc.self_leads);
  EXPECT_EQ(dc.leader, "node-c");

  // node-c dies: node-d is next.
  leadership e2("node-e", true);
  EXPECT_EQ(elect(e2, {refit("node-d"), plain("node-a"), plain("node-b")}, 5).leader, "node-d");

  // No refit-role member visible: quorum but no leader.
  leadership b("node-b", false);
  const leader_decision db = elect(b, {plain("node-a"), plain("node-c")}, 5);
  EXPECT_TRUE(db.has_quorum);
  EXPECT_EQ(db.leader, "");
  EXPECT_FALSE(db.self_leads);
}

TEST(Leadership, CampaignTermExceedsEveryObservedTerm) {
  leadership l("node-a", true);
  l.observe_term(7);
  l.observe_term(41);
  l.observe_term(12);  // older terms do not lower it
  EXPECT_EQ(l.highest_term_seen(), 41u);
  const std::vector<member_view> view = {refit("node-b"), plain("node-c")};
  const leader_decision d = l.evaluate(view, 3);
  EXPECT_TRUE(d.campaign);
  EXPECT_FALSE(d.self_leads) << "no leadership before the votes";
  EXPECT_FALSE(l.is_leader());
  EXPECT_EQ(d.term, 42u);
  EXPECT_EQ(l.campaign_term(), 42u);
  EXPECT_EQ(l.highest_term_seen(), 42u);
  // Re-evaluating while the votes are out neither campaigns again nor leads.
  const leader_decision waiting = l.evaluate(view, 3);
  EXPECT_FALSE(waiting.campaign);
  EXPECT_FALSE(waiting.self_leads);
  EXPECT_EQ(waiting.term, 42u);
  ASSERT_TRUE(l.campaign_result(42, 2, 3));
  EXPECT_TRUE(l.is_leader());
  EXPECT_EQ(l.term(), 42u);
  EXPECT_EQ(l.campaign_term(), 0u);
  ASSERT_TRUE(l.leader().has_value());
  EXPECT_EQ(l.leader()->name, "node-a");
  EXPECT_EQ(l.leader()->term, 42u);
}

// Half the votes is not a majority; a lost campaign is retried under a new term.
TEST(Leadership, ACampaignNeedsAStrictMajorityOfVotes) {
  leadership l("node-a", true);
  const std::vector<member_view> view = {plain("node-b"), plain("node-c"), plain("node-d")};
  const leader_decision d = l.evaluate(view, 4);
  ASSERT_TRUE(d.campaign);
  EXPECT_FALSE(l.campaign_result(d.term, 2, 4));
  EXPECT_FALSE(l.is_leader());
  EXPECT_FALSE(l.campaign_result(d.term, 4, 4)) << "the campaign is over";
  const leader_decision again = l.evaluate(view, 4);
  ASSERT_TRUE(again.campaign);
  EXPECT_GT(again.term, d.term);
  EXPECT_TRUE(l.campaign_result(again.term, 3, 4));
  EXPECT_TRUE(l.is_leader());
}

// A campaign overtaken by a newer term, or by the view (a smaller refit member, lost quorum),
// cannot be won by late votes.
TEST(Leadership, LateVotesDoNotWinAnAbandonedCampaign) {
  leadership l("node-b", true);
  const leader_decision d = l.evaluate({plain("node-c")}, 3);
  ASSERT_TRUE(d.campaign);
  l.observe_term(d.term + 1);
  EXPECT_FALSE(l.campaign_result(d.term, 3, 3));
  EXPECT_FALSE(l.is_leader());

  const leader_decision d2 = l.evaluate({plain("node-c")}, 3);
  ASSERT_TRUE(d2.campaign);
  l.evaluate({refit("node-a"), plain("node-c")}, 3);  // node-a appears: it should lead
  EXPECT_FALSE(l.campaign_result(d2.term, 3, 3));

  leadership m("node-a", true);
  const leader_decision d3 = m.evaluate({plain("node-b")}, 3);
  ASSERT_TRUE(d3.campaign);
  m.evaluate({}, 3);  // quorum lost
  EXPECT_FALSE(m.campaign_result(d3.term, 2, 3));
  EXPECT_FALSE(m.is_leader());
}

TEST(Leadership, ReevaluatingWhileLeaderKeepsTheTerm) {
  leadership l("node-a", true);
  const std::vector<member_view> view = {refit("node-b"), plain("node-c")};
  const leader_decision first = elect(l, view, 3);
  ASSERT_TRUE(first.self_leads);
  for (int i = 0; i < 5; ++i) {
    const leader_decision again = l.evaluate(view, 3);
    EXPECT_TRUE(again.self_leads);
    EXPECT_FALSE(again.campaign);
    EXPECT_EQ(again.term, first.term);
  }
  // A view change that keeps self the rightful leader keeps the term too.
  EXPECT_EQ(l.evaluate({refit("node-b"), plain("node-c"), plain("node-d")}, 4).term, first.term);
}

// Every new stint takes a fresh term, even when nobody else led in between.
TEST(Leadership, LosingAndRegainingQuorumTakesANewTerm) {
  leadership l("node-a", true);
  EXPECT_EQ(elect(l, {refit("node-b"), plain("node-c")}, 3).term, 1u);
  const leader_decision lost = l.evaluate({}, 3);
  EXPECT_FALSE(lost.has_quorum);
  EXPECT_FALSE(l.is_leader());
  EXPECT_EQ(l.term(), 0u);
  const leader_decision back = l.evaluate({plain("node-c")}, 3);
  EXPECT_TRUE(back.campaign);
  EXPECT_EQ(back.term, 2u);
}

TEST(Leadership, SmallerRefitMemberAppearingTakesOver) {
  leadership b("node-b", true);
  ASSERT_TRUE(elect(b, {plain("node-c")}, 3).self_leads);
  const leader_decision d = elect(b, {refit("node-a"), plain("node-c")}, 3);
  EXPECT_FALSE(d.self_leads);
  EXPECT_EQ(d.leader, "node-a");
  EXPECT_FALSE(b.is_leader());
}

TEST(Leadership, NewerTermStepsTheLeaderDown) {
  leadership l("node-a", true);
  ASSERT_EQ(elect(l, {plain("node-b"), plain("node-c")}, 3).term, 1u);
  EXPECT_FALSE(l.observe_term(1)) << "its own term changes nothing";
  EXPECT_TRUE(l.is_leader());
  EXPECT_TRUE(l.observe_term(5));
  EXPECT_FALSE(l.is_leader());
  EXPECT_FALSE(l.leader().has_value());
  // Still the rightful leader by its own view: it campaigns above the term it saw.
  const leader_decision d = l.evaluate({plain("node-b"), plain("node-c")}, 3);
  EXPECT_TRUE(d.campaign);
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
  elect(c, {refit("node-a"), plain("node-b")}, 3);
  ASSERT_TRUE(c.leader().has_value());
  EXPECT_EQ(c.leader()->name, "node-a");
  const leader_decision d = elect(c, {plain("node-b")}, 3);
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
  ASSERT_EQ(elect(a, {plain("node-c")}, 3).term, 1u);  // node-a cannot see node-b
  ASSERT_EQ(elect(b, {plain("node-c")}, 3).term, 1u);  // node-b cannot see node-a
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
  const leader_decision before = elect(a, all, 5);
  ASSERT_TRUE(before.self_leads);
  EXPECT_EQ(elect(c, all, 5).leader, "node-a");
  c.observe_leader("node-a", before.term);  // node-a's announcement reached node-c

  const leader_decision minority = elect(a, {refit("node-b")}, 5);
  const leader_decision majority = elect(c, {refit("node-d"), refit("node-e")}, 5);
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
  ASSERT_TRUE(elect(l, {plain("node-b")}, 2).self_leads);
  l.step_down();
  EXPECT_FALSE(l.is_leader());
  EXPECT_FALSE(l.leader().has_value());
  EXPECT_EQ(elect(l, {plain("node-b")}, 2).term, 2u);
}

// known_members below the visible count is stale configuration: the visible count is used.
TEST(Leadership, KnownMembersBelowVisibleUsesVisible) {
  leadership l("node-a", true);
  EXPECT_TRUE(elect(l, {plain("node-b"), plain("node-c")}, 1).self_leads);
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

TEST(VoteBox, OneCandidatePerTerm) {
  vote_box v;
  EXPECT_TRUE(v.request("node-a", 3));
  EXPECT_FALSE(v.request("node-b", 3)) << "a second candidate of the same term";
  EXPECT_TRUE(v.request("node-a", 3)) << "the same candidate again (a retried request)";
  EXPECT_FALSE(v.request("node-b", 2)) << "an older term";
  EXPECT_TRUE(v.request("node-b", 4));
  EXPECT_EQ(v.voted_term(), 4u);
  EXPECT_EQ(v.voted_for(), "node-b");
  EXPECT_FALSE(v.request("", 9));
  EXPECT_FALSE(v.request("node-c", 0));
}

// A box restored from what it persisted refuses what it refused before the restart.
TEST(VoteBox, RestoredBoxKeepsItsVote) {
  vote_box before;
  ASSERT_TRUE(before.request("node-a", 7));
  vote_box after(before.voted_term(), before.voted_for());
  EXPECT_FALSE(after.request("node-b", 7));
  EXPECT_TRUE(after.request("node-a", 7));
  EXPECT_FALSE(after.request("node-b", 6));
}

// Two candidates of one term among five voters: at most one reaches a majority, whatever order
// the requests arrive in.
TEST(VoteBox, TwoCandidatesOfATermCannotBothWin) {
  for (unsigned order = 0; order < 32; ++order) {
    std::vector<vote_box> voters(5);
    int a = 0, b = 0;
    for (unsigned i = 0; i < voters.size(); ++i) {
      bool ga = false, gb = false;
      if ((order >> i) & 1) {
        ga = voters[i].request("node-a", 9);
        gb = voters[i].request("node-b", 9);
      } else {
        gb = voters[i].request("node-b", 9);
        ga = voters[i].request("node-a", 9);
      }
      a += ga;
      b += gb;
    }
    EXPECT_FALSE(2 * a > 5 && 2 * b > 5) << "order " << order;
    EXPECT_EQ(a + b, 5) << "every voter votes once";
  }
}

TEST(NextEpoch, EpochsAreNumberedInsideTheirTerm) {
  EXPECT_EQ(next_epoch(0, 0), 1u);
  EXPECT_EQ(next_epoch(41, 0), 42u) << "outside a cluster epochs simply count";
  EXPECT_EQ(next_epoch(0, 3), 3'000'001u);
  EXPECT_EQ(next_epoch(17, 3), 3'000'001u) << "a new term starts above every older epoch";
  EXPECT_EQ(next_epoch(2'999'999, 3), 3'000'001u);
  EXPECT_EQ(next_epoch(3'000'001, 3), 3'000'002u);
  EXPECT_EQ(term_of_epoch(3'000'002), 3u);
  EXPECT_EQ(term_of_epoch(42), 0u);
  EXPECT_FALSE(next_epoch(3'999'999, 3).has_value()) << "the term's range is used up";
  EXPECT_FALSE(next_epoch(4'000'001, 3).has_value()) << "a newer term's epoch is installed";
  EXPECT_FALSE(next_epoch(0, UINT64_MAX).has_value());
  // Leaders of different terms never hand out the same number.
  for (uint64_t installed : {0ull, 5ull, 2'000'003ull, 3'000'000ull})
    EXPECT_NE(next_epoch(installed, 3), next_epoch(installed, 4));
}

}  // namespace
}  // namespace eldr
