// authority_map: a departed load authority's workers go to one survivor per worker, the same at
// every router that sees the same members, spread over the survivors; two claims on one worker
// settle on one (generation, registration over succession, rendezvous score), whatever order the
// claims arrive in (docs/cluster.md, "When an authority leaves").
#include "core/membership/authority_map.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/membership/hash_ring.hpp"
#include "core/membership/load_exchange.hpp"

namespace eldr {
namespace {

using verdict = authority_map::verdict;

TEST(RendezvousScore, IsAFunctionOfMemberAndItemAlone) {
  EXPECT_EQ(rendezvous_score("n1", "m", 3), rendezvous_score("n1", "m", 3));
  EXPECT_NE(rendezvous_score("n1", "m", 3), rendezvous_score("n2", "m", 3));
  EXPECT_NE(rendezvous_score("n1", "m", 3), rendezvous_score("n1", "m", 4));
  EXPECT_NE(rendezvous_score("n1", "m", 3), rendezvous_score("n1", "q", 3));
}

TEST(SuccessorAuthority, NoneWithoutRoutersAndTheOnlyOneWithOne) {
  EXPECT_FALSE(successor_authority({}, "m", 0).has_value());
  EXPECT_EQ(successor_authority({"n2"}, "m", 0).value(), "n2");
}

// The order routers are listed in does not matter, the picks spread over every survivor, and
// removing a router moves only the workers it had (each router computes the same without asking).
TEST(SuccessorAuthority, SameForAnyOrderSpreadAndStableWhenAnotherLeaves) {
  const std::vector<std::string> four = {"n1", "n2", "n3", "n4"};
  const std::vector<std::string> reversed = {"n4", "n3", "n2", "n1"};
  const std::vector<std::string> without_n3 = {"n1", "n2", "n4"};
  std::map<std::string, int> picks;
  int moved = 0;
  for (uint32_t w = 0; w < 400; ++w) {
    const std::string s = *successor_authority(four, "m", w);
    EXPECT_EQ(*successor_authority(reversed, "m", w), s) << w;
    ++picks[s];
    const std::string t = *successor_authority(without_n3, "m", w);
    if (s != "n3")
      EXPECT_EQ(t, s) << "worker " << w << " moved although its router stayed";
    else
      ++moved;
  }
  ASSERT_EQ(picks.size(), 4u);
  for (const auto& [r, n] : picks)
    EXPECT_GT(n, 60) << r << " got " << n << " of 400";
  EXPECT_EQ(moved, picks["n3"]);
}

authority_claim reg(const std::string& node, uint64_t g) {
  return {node, g, true};
}
authority_claim succ(const std::string& node, uint64_t g) {
  return {node, g, false};
}

TEST(ClaimBeats, GenerationThenRegistrationThenScoreNeverItself) {
  EXPECT_TRUE(claim_beats(succ("n1", 2), reg("n2", 1), "m", 0));
  EXPECT_FALSE(claim_beats(reg("n2", 1), succ("n1", 2), "m", 0));
  EXPECT_FALSE(claim_beats(reg("n1", 2), reg("n1", 2), "m", 0));
  for (uint32_t w = 0; w < 50; ++w) {
    // A registration beats a succession of the same generation, whatever the scores.
    EXPECT_TRUE(claim_beats(reg("n1", 2), succ("n2", 2), "m", w)) << w;
    EXPECT_TRUE(claim_beats(reg("n2", 2), succ("n1", 2), "m", w)) << w;
    // Same kind and generation: exactly one of the two wins, by the rendezvous score.
    EXPECT_NE(claim_beats(succ("n1", 2), succ("n2", 2), "m", w),
              claim_beats(succ("n2", 2), succ("n1", 2), "m", w));
    EXPECT_EQ(claim_beats(reg("n1", 2), reg("n2", 2), "m", w),
              rendezvous_score("n1", "m", w) > rendezvous_score("n2", "m", w));
  }
}

TEST(ClaimEncoding, RoundTripsGenerationAndKind) {
  for (const auto& c : {reg("n1", 0), reg("n1", 7), succ("n1", 7), succ("n1", 1ull << 40)}) {
    const auto d = decode_claim("n9", encode_claim(c));
    EXPECT_EQ(d.node, "n9");
    EXPECT_EQ(d.generation, c.generation);
    EXPECT_EQ(d.registered, c.registered);
  }
}

TEST(AuthorityMap, ARegistrationClaimsAboveEveryGenerationSeen) {
  authority_map m("n1", "m");
  EXPECT_EQ(m.on_registered(0).generation, 1u);
  EXPECT_TRUE(m.on_registered(0).registered);
  EXPECT_TRUE(m.mine(0));
  EXPECT_EQ(m.on_registered(0).generation, 3u);  // registered again (a restarted proxy)
  // Another node registered worker 1 at generation 5: a registration here goes above it.
  EXPECT_EQ(m.on_claim(1, reg("n2", 5)), verdict::follow);
  EXPECT_FALSE(m.mine(1));
  EXPECT_EQ(m.claims().at(1).node, "n2");
  EXPECT_EQ(m.on_registered(1).generation, 6u);
  EXPECT_EQ(m.claims().at(1).node, "n1");
}

TEST(AuthorityMap, AClaimIsFollowedKeptOrYieldedToByTheOrder) {
  authority_map m("n1", "m");
  ASSERT_EQ(m.on_registered(0).generation, 1u);
  // An older claim elsewhere loses to ours, and so does a succession of our generation (n2 only
  // thinks we left); a newer one wins and we give the worker up.
  EXPECT_EQ(m.on_claim(0, reg("n2", 0)), verdict::keep_mine);
  EXPECT_EQ(m.on_claim(0, succ("n2", 1)), verdict::keep_mine);
  EXPECT_TRUE(m.mine(0));
  EXPECT_EQ(m.on_claim(0, reg("n2", 2)), verdict::yield);
  EXPECT_FALSE(m.mine(0));
  EXPECT_EQ(m.claim(0)->node, "n2");
  // The same authority again (a late vector of a lower generation does not lower it).
  EXPECT_EQ(m.on_claim(0, reg("n2", 1)), verdict::follow);
  EXPECT_EQ(m.claim(0)->generation, 2u);
  // A third node's weaker claim is ignored, a stronger one followed.
  EXPECT_EQ(m.on_claim(0, reg("n3", 1)), verdict::ignore);
  EXPECT_EQ(m.claims().at(0).node, "n2");
  EXPECT_EQ(m.on_claim(0, succ("n3", 3)), verdict::follow);
  EXPECT_EQ(m.claims().at(0).node, "n3");
  m.erase(0);
  EXPECT_EQ(m.claim(0), nullptr);
  EXPECT_TRUE(m.claims().empty());
}

// A router's totals go to each worker's authority as its claims name it, only for workers it
// routed to, ascending by worker; a worker without a known authority goes nowhere.
TEST(AuthorityMap, DeltasGoToTheAuthorityEachClaimNames) {
  authority_map m("n1", "m");
  m.on_registered(2);
  m.on_claim(0, reg("n2", 1));
  m.on_claim(1, reg("n2", 1));
  m.on_claim(3, succ("n3", 1));
  decision_ledger l(5);
  for (uint32_t w : {0u, 0u, 2u, 3u, 4u})
    ASSERT_TRUE(l.on_route(w).ok());
  auto of = [&m](uint32_t w) -> const std::string* {
    const auto* c = m.claim(w);
    return c == nullptr ? nullptr : &c->node;
  };
  delta_outbox outbox;
  const auto routed = l.take_routed();
  const auto out = outbox.interval(l, routed, of);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out.at("n1").totals, (std::vector<std::pair<uint32_t, uint64_t>>{{2, 1}}));
  EXPECT_EQ(out.at("n2").totals, (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}}));
  EXPECT_EQ(out.at("n3").totals, (std::vector<std::pair<uint32_t, uint64_t>>{{3, 1}}));
}

// nodes_version moves when, and only when, some worker's authority node changes.
TEST(AuthorityMap, TheNodesVersionMovesWhenAWorkersAuthorityChanges) {
  authority_map m("n1", "m");
  uint64_t v = m.nodes_version();
  auto moved = [&] {
    const bool changed = m.nodes_version() != v;
    v = m.nodes_version();
    return changed;
  };
  m.on_registered(0);
  EXPECT_TRUE(moved());
  m.on_registered(0);  // a higher generation, the same node
  EXPECT_FALSE(moved());
  m.on_claim(1, reg("n2", 1));
  EXPECT_TRUE(moved());
  m.on_claim(1, reg("n2", 2));  // the same authority's claim grows
  EXPECT_FALSE(moved());
  m.on_claim(1, reg("n3", 1));  // loses to n2's generation 2: ignored
  EXPECT_FALSE(moved());
  m.on_claim(0, reg("n2", 9));  // beats this node's: yield
  EXPECT_TRUE(moved());
  (void)m.on_members({"n2", "n3"});  // nobody left
  EXPECT_FALSE(moved());
  (void)m.on_members({"n3"});  // n2 left: both workers move
  EXPECT_TRUE(moved());
  m.erase(7);
  EXPECT_FALSE(moved());
  m.erase(1);
  EXPECT_TRUE(moved());
}

// n1 registered workers 0..49 and left: at n2 and n3 (which both see the other survivor) every
// worker goes to the same successor, at n1's generation, and each takes over its share.
TEST(AuthorityMap, ADepartedAuthoritysWorkersGoToTheSameSuccessorEverywhere) {
  authority_map at2("n2", "m"), at3("n3", "m");
  for (uint32_t w = 0; w < 50; ++w) {
    ASSERT_EQ(at2.on_claim(w, reg("n1", 1)), verdict::follow);
    ASSERT_EQ(at3.on_claim(w, reg("n1", 1)), verdict::follow);
  }
  // A worker of a live authority stays where it is.
  ASSERT_EQ(at2.on_registered(50).generation, 1u);
  ASSERT_EQ(at3.on_claim(50, reg("n2", 1)), verdict::follow);
  const auto moved2 = at2.on_members({"n3"});
  const auto moved3 = at3.on_members({"n2"});
  ASSERT_EQ(moved2.size(), 50u);
  ASSERT_EQ(moved3.size(), 50u);
  int to2 = 0;
  for (size_t i = 0; i < moved2.size(); ++i) {
    EXPECT_EQ(moved2[i].worker, i);
    EXPECT_EQ(moved2[i].from, "n1");
    EXPECT_EQ(moved2[i].to, moved3[i].to) << "worker " << i;
    EXPECT_EQ(moved2[i].to, *successor_authority({"n2", "n3"}, "m", moved2[i].worker));
    EXPECT_EQ(at2.mine(moved2[i].worker), moved2[i].to == "n2");
    EXPECT_EQ(at2.claim(moved2[i].worker)->generation, 1u);
    EXPECT_FALSE(at2.claim(moved2[i].worker)->registered);
    to2 += moved2[i].to == "n2";
  }
  EXPECT_GT(to2, 10);
  EXPECT_LT(to2, 40);
  EXPECT_EQ(at2.claim(50)->node, "n2");
  // Nothing more moves while the members stay.
  EXPECT_TRUE(at2.on_members({"n3"}).empty());
}

// A partition: n2 and n3 each saw the other gone too, so each took every worker of the departed
// n1. When they meet again, each one's vector reaches the other: exactly one keeps each worker,
// whichever vector arrives first.
TEST(AuthorityMap, TwoSuccessorsOfAPartitionSettleOnOneWhenTheyMeet) {
  authority_map at2("n2", "m"), at3("n3", "m");
  for (uint32_t w = 0; w < 30; ++w) {
    at2.on_claim(w, reg("n1", 4));
    at3.on_claim(w, reg("n1", 4));
  }
  ASSERT_EQ(at2.on_members({}).size(), 30u);
  ASSERT_EQ(at3.on_members({}).size(), 30u);
  for (uint32_t w = 0; w < 30; ++w) {
    ASSERT_TRUE(at2.mine(w) && at3.mine(w));
    // n3's vector reaches n2 first for even workers, n2's reaches n3 first for odd ones.
    verdict v2, v3;
    if (w % 2 == 0) {
      v2 = at2.on_claim(w, *at3.claim(w));
      v3 = at3.on_claim(w, succ("n2", 4));
    } else {
      v3 = at3.on_claim(w, *at2.claim(w));
      v2 = at2.on_claim(w, succ("n3", 4));
    }
    EXPECT_NE(at2.mine(w), at3.mine(w)) << "worker " << w;
    EXPECT_EQ(at2.claim(w)->node, at3.claim(w)->node) << "worker " << w;
    EXPECT_EQ(v2 == verdict::yield, !at2.mine(w));
    EXPECT_EQ(v3 == verdict::yield, !at3.mine(w));
  }
}

// A registration after a takeover (the worker, or a restarted proxy, registers somewhere) beats
// the successor's claim, at the successor too.
TEST(AuthorityMap, ARegistrationAfterATakeoverBeatsTheSuccessor) {
  authority_map at2("n2", "m"), at3("n3", "m");
  at2.on_claim(0, reg("n1", 1));
  at3.on_claim(0, reg("n1", 1));
  at2.on_members({"n3"});
  at3.on_members({"n2"});
  const bool n2_took = at2.mine(0);
  authority_map& successor = n2_took ? at2 : at3;
  authority_map& other = n2_took ? at3 : at2;
  const authority_claim mine = *successor.claim(0);
  const authority_claim theirs = other.on_registered(0);
  EXPECT_EQ(theirs.generation, 2u);
  EXPECT_EQ(successor.on_claim(0, theirs), verdict::yield);
  EXPECT_EQ(other.on_claim(0, mine), verdict::keep_mine);
}

}  // namespace
}  // namespace eldr
