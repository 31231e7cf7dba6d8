// load_exchange: routers share load as cumulative per-worker totals and authorities publish one
// vector per interval (docs/cluster.md, "Scaling out"). Checked here: the authority's in_flight
// against the exact count of requests running; a lost or reordered delta converges at the next;
// a report resets the base and anchors every router; a router restart is folded into the base; a
// router sees its own decisions at once and its peers' one interval later; liveness; bad input.
#include "core/membership/load_exchange.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace eldr {
namespace {

constexpr auto applied = load_overlay::vector_outcome::applied;

load_delta delta(const std::string& router, uint64_t seq, const decision_ledger& l,
                 uint64_t incarnation = 1) {
  load_delta d;
  d.router = router;
  d.incarnation = incarnation;
  d.seq = seq;
  for (uint32_t w = 0; w < l.totals().size(); ++w)
    if (l.total(w) > 0) d.totals.emplace_back(w, l.total(w));
  return d;
}

TEST(DecisionLedger, CountsPerWorkerAndRefusesUnknownWorkers) {
  decision_ledger l(2);
  ASSERT_TRUE(l.on_route(1).ok());
  ASSERT_TRUE(l.on_route(1).ok());
  EXPECT_EQ(l.total(0), 0u);
  EXPECT_EQ(l.total(1), 2u);
  EXPECT_FALSE(l.on_route(2).ok());
  l.resize(3);
  EXPECT_TRUE(l.on_route(2).ok());
  l.resize(1);  // never shrinks
  EXPECT_EQ(l.totals().size(), 3u);
}

TEST(DecisionLedger, TellsTheWorkersRoutedToSinceItWasLastAskedEachOnce) {
  decision_ledger l(4);
  EXPECT_TRUE(l.take_routed().empty());
  for (uint32_t w : {3u, 1u, 3u, 3u})
    ASSERT_TRUE(l.on_route(w).ok());
  EXPECT_EQ(l.take_routed(), (std::vector<uint32_t>{3, 1}));
  EXPECT_TRUE(l.take_routed().empty());
  ASSERT_TRUE(l.on_route(1).ok());
  l.resize(6);
  ASSERT_TRUE(l.on_route(5).ok());
  EXPECT_FALSE(l.on_route(6).ok());
  EXPECT_EQ(l.take_routed(), (std::vector<uint32_t>{1, 5}));
  EXPECT_EQ(l.total(1), 2u);
  EXPECT_EQ(l.total(3), 3u);
}

using pairs = std::vector<std::pair<uint32_t, uint64_t>>;

const std::string* authority_a(uint32_t) {
  static const std::string a = "a";
  return &a;
}

// A delta carries the totals routed to since the authority last included one, and carries them
// again until it does; then only what was routed since.
TEST(DeltaOutbox, CarriesWhatChangedUntilTheAuthorityIncludesIt) {
  decision_ledger l(1000);
  delta_outbox out;
  for (uint32_t w : {7u, 7u, 900u})
    ASSERT_TRUE(l.on_route(w).ok());
  auto d = out.interval(l, l.take_routed(), authority_a);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d.at("a").seq, 1u);
  EXPECT_EQ(d.at("a").totals, (pairs{{7, 2}, {900, 1}}));
  // Not included yet (delta 1 lost, or its vector not here yet): sent again, with what is new.
  ASSERT_TRUE(l.on_route(3).ok());
  d = out.interval(l, l.take_routed(), authority_a);
  EXPECT_EQ(d.at("a").seq, 2u);
  EXPECT_EQ(d.at("a").totals, (pairs{{3, 1}, {7, 2}, {900, 1}}));
  // A vector includes delta 1 only: 3 is still owed (delta 2 carried it).
  out.acknowledged("a", 1);
  EXPECT_EQ(out.pending(), 1u);
  ASSERT_TRUE(l.on_route(7).ok());
  d = out.interval(l, l.take_routed(), authority_a);
  EXPECT_EQ(d.at("a").seq, 3u);
  EXPECT_EQ(d.at("a").totals, (pairs{{3, 1}, {7, 3}}));
  out.acknowledged("a", 3);
  EXPECT_EQ(out.pending(), 0u);
  EXPECT_TRUE(out.interval(l, l.take_routed(), authority_a).empty());  // nothing owed: no delta
  // Routed to between a send and its acknowledgement: still owed after it.
  ASSERT_TRUE(l.on_route(900).ok());
  d = out.interval(l, l.take_routed(), authority_a);
  EXPECT_EQ(d.at("a").totals, (pairs{{900, 2}}));
  ASSERT_TRUE(l.on_route(900).ok());
  out.acknowledged("a", d.at("a").seq);
  d = out.interval(l, l.take_routed(), authority_a);
  EXPECT_EQ(d.at("a").totals, (pairs{{900, 3}}));
  out.acknowledged("b", 99);  // an authority it never sent to
  EXPECT_EQ(out.pending(), 1u);
}

// Three routers, one authority of 1,000 workers, a few decisions per router per interval, a fifth
// of the deltas and of the vectors lost: whenever every router's totals are applied (nothing owed),
// the authority's in_flight and every router's composed load equal the requests really running;
// and a delta carries what was routed lately, never the thousand workers.
TEST(DeltaOutbox, LostDeltasAndVectorsConvergeAndDeltasStaySmall) {
  constexpr uint32_t workers = 1000;
  load_authority auth("a", 0);
  for (uint32_t w = 0; w < workers; ++w)
    auth.add_worker(w, 0);
  struct router {
    std::string name;
    decision_ledger ledger{workers};
    delta_outbox outbox;
    load_overlay overlay;
  };
  std::vector<router> routers(3);
  for (size_t r = 0; r < routers.size(); ++r)
    routers[r].name = "r" + std::to_string(r);
  std::vector<int64_t> running(workers, 0);
  std::mt19937 rng(11);
  size_t largest = 0, checked = 0;
  for (int round = 0; round < 400; ++round) {
    const bool lossless = round >= 395;  // the last rounds deliver everything
    for (auto& r : routers)
      for (int i = 0; i < 3; ++i) {
        const uint32_t w = rng() % 40 == 0 ? rng() % workers : rng() % 50;  // mostly hot ones
        ASSERT_TRUE(r.ledger.on_route(w).ok());
        ++running[w];
      }
    for (uint32_t w = 0; w < 50; ++w)
      if (running[w] > 0 && rng() % 4 == 0) {
        auth.on_finished(w, 1);
        --running[w];
      }
    for (auto& r : routers)
      for (auto& [a, d] : r.outbox.interval(r.ledger, r.ledger.take_routed(), authority_a)) {
        d.router = r.name;
        d.incarnation = 1;
        r.overlay.sent(a, d.seq, d.totals);
        largest = std::max(largest, d.totals.size());
        if (lossless || rng() % 5 != 0) auth.on_delta(d);
      }
    const load_vector v = auth.publish(0);
    for (auto& r : routers)
      if ((lossless || rng() % 5 != 0) && r.overlay.on_vector(v, r.name, 1) == applied)
        r.outbox.acknowledged("a", r.overlay.included("a"));
    bool owed = false;
    for (const auto& r : routers)
      owed = owed || r.outbox.pending() != 0;
    if (owed) continue;
    ++checked;
    for (uint32_t w = 0; w < workers; ++w)
      ASSERT_EQ(auth.in_flight(w), static_cast<uint64_t>(running[w])) << "worker " << w;
    for (const auto& r : routers) {
      std::vector<uint32_t> load(workers, 0);
      std::vector<uint8_t> covered(workers, 0);
      r.overlay.compose(r.ledger, load, covered);
      for (uint32_t w = 0; w < workers; ++w)
        ASSERT_EQ(load[w], static_cast<uint64_t>(running[w])) << r.name << " worker " << w;
    }
  }
  EXPECT_GT(checked, 20u);  // the loss left enough complete rounds to check
  // Three decisions per interval, carried again while lost: tens of workers, not 1,000.
  EXPECT_LT(largest, 60u);
  EXPECT_GT(largest, 3u);  // some were carried again
}

// Workers that change authority: resend_all owes every total to the worker's authority now, and
// nothing to the one it had.
TEST(DeltaOutbox, ResendAllOwesEveryTotalWhereItsWorkerNowIs) {
  decision_ledger l(4);
  std::vector<std::string> of = {"a", "a", "b", "a"};
  auto authority_of = [&of](uint32_t w) -> const std::string* {
    return of[w].empty() ? nullptr : &of[w];
  };
  delta_outbox out;
  for (uint32_t w : {0u, 1u, 2u})
    ASSERT_TRUE(l.on_route(w).ok());
  auto d = out.interval(l, l.take_routed(), authority_of);
  out.acknowledged("a", d.at("a").seq);
  out.acknowledged("b", d.at("b").seq);
  ASSERT_TRUE(l.on_route(1).ok());
  (void)out.interval(l, l.take_routed(), authority_of);  // a owes 1 now
  of[1] = "b";  // a left; b took 1 over; 2's authority is not known any more
  of[2] = "";
  out.resend_all(l, authority_of);
  d = out.interval(l, l.take_routed(), authority_of);
  EXPECT_EQ(d.at("a").totals, (pairs{{0, 1}}));
  EXPECT_EQ(d.at("b").totals, (pairs{{1, 2}}));
  EXPECT_EQ(d.size(), 2u);
}

// Two routers that both know the authority from the start (first deltas at totals 0), random
// decisions and finishes, a delta lost now and then: after each complete round the authority's
// in_flight equals the requests really running.
TEST(LoadAuthority, InFlightIsExactAfterEachRoundDespiteLostDeltas) {
  load_authority auth("a", 0);
  for (uint32_t w = 0; w < 3; ++w)
    auth.add_worker(w, 0);
  std::vector<decision_ledger> ledgers(2, decision_ledger(3));
  std::vector<uint64_t> seq(2, 0);
  const std::vector<std::string> names = {"r1", "r2"};
  for (size_t r = 0; r < 2; ++r)
    auth.on_delta(delta(names[r], ++seq[r], ledgers[r]));
  std::vector<int64_t> running(3, 0);
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < 10; ++i) {
      const size_t r = rng() % 2;
      const uint32_t w = rng() % 3;
      ASSERT_TRUE(ledgers[r].on_route(w).ok());
      ++running[w];
    }
    for (uint32_t w = 0; w < 3; ++w) {
      const uint32_t done = running[w] > 0 ? rng() % (running[w] + 1) : 0;
      auth.on_finished(w, done);
      running[w] -= done;
    }
    // One delta in five is lost; the last round delivers everything.
    for (size_t r = 0; r < 2; ++r) {
      const auto d = delta(names[r], ++seq[r], ledgers[r]);
      if (round == 199 || rng() % 5 != 0) auth.on_delta(d);
    }
    if (round % 10 == 9 || round == 199) {
      // After a round whose deltas all arrived, the figure is exact.
      bool complete = true;
      for (size_t r = 0; r < 2; ++r)
        complete = complete && auth.publish(0).included.at(names[r]).seq == seq[r];
      if (!complete) continue;
      for (uint32_t w = 0; w < 3; ++w)
        EXPECT_EQ(auth.in_flight(w), running[w]) << "round " << round << " worker " << w;
    }
  }
  for (uint32_t w = 0; w < 3; ++w)
    EXPECT_EQ(auth.in_flight(w), running[w]) << "worker " << w;
}

// The authority keeps each worker's sum over routers as deltas arrive: with reports (of the real
// count, taken when every router's totals are in), router restarts, lost deltas and finishes mixed
// at random, in_flight equals the requests really running after every complete round, and a
// vector says the same.
TEST(LoadAuthority, InFlightStaysExactThroughReportsRestartsAndLosses) {
  constexpr uint32_t workers = 12;
  load_authority auth("a", 0);
  for (uint32_t w = 0; w < workers; ++w)
    auth.add_worker(w, 0);
  const std::vector<std::string> names = {"r1", "r2", "r3"};
  std::vector<decision_ledger> ledgers(3, decision_ledger(workers));
  std::vector<uint64_t> seq(3, 0), incarnation(3, 1);
  std::vector<int64_t> running(workers, 0);
  std::vector<uint64_t> report_seq(workers, 0);
  std::mt19937 rng(23);
  int complete = 0;
  for (int round = 0; round < 500; ++round) {
    for (int i = 0; i < 8; ++i) {
      const uint32_t w = rng() % workers;
      ASSERT_TRUE(ledgers[rng() % 3].on_route(w).ok());
      ++running[w];
    }
    const size_t restarting = rng() % 40 == 0 ? rng() % 3 : 3;
    bool all_in = true;
    for (size_t r = 0; r < 3; ++r) {
      if (r == restarting) {  // its totals restart at 0; its running requests go on
        auto d = delta(names[r], ++seq[r], ledgers[r], incarnation[r]);
        auth.on_delta(d);  // what it had sent before going down
        ledgers[r] = decision_ledger(workers);
        seq[r] = 0;
        ++incarnation[r];
      }
      const auto d = delta(names[r], ++seq[r], ledgers[r], incarnation[r]);
      if (round % 7 == 3 && r == 1) {  // lost
        all_in = false;
        continue;
      }
      auth.on_delta(d);
    }
    for (uint32_t w = 0; w < workers; ++w) {
      const uint32_t done = running[w] > 0 ? rng() % (running[w] + 1) / 2 : 0;
      auth.on_finished(w, done);
      running[w] -= done;
    }
    if (!all_in) continue;
    ++complete;
    if (rng() % 3 == 0) {  // a worker reports its real count
      const uint32_t w = rng() % workers;
      auth.on_report(w, static_cast<uint32_t>(running[w]), ++report_seq[w], 0);
    }
    const load_vector v = auth.publish(0);
    for (uint32_t w = 0; w < workers; ++w) {
      ASSERT_EQ(auth.in_flight(w), static_cast<uint64_t>(running[w])) << "round " << round;
      ASSERT_EQ(v.workers[w].in_flight, static_cast<uint64_t>(running[w]));
    }
  }
  EXPECT_GT(complete, 400);
  EXPECT_GT(auth.counters().incarnations, 5u);
  EXPECT_GT(auth.counters().reports, 50u);
}

TEST(LoadAuthority, AReorderedDeltaIsIgnoredAndTheNextOneCatchesUp) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger l(1);
  auth.on_delta(delta("r", 1, l));
  (void)l.on_route(0);
  const auto d2 = delta("r", 2, l);
  (void)l.on_route(0);
  const auto d3 = delta("r", 3, l);
  auth.on_delta(d3);
  EXPECT_EQ(auth.in_flight(0), 2u);
  auth.on_delta(d2);  // late: older than the one applied
  EXPECT_EQ(auth.in_flight(0), 2u);
  EXPECT_EQ(auth.counters().deltas_stale, 1u);
}

// A report is authoritative: the base becomes its in_flight, every router is anchored at its
// current total, and finished events count from there; a stale report is only a heartbeat.
TEST(LoadAuthority, AReportResetsTheBaseAndAnchorsEveryRouter) {
  load_authority auth("a", 1000);
  auth.add_worker(0, 0);
  decision_ledger l(1);
  auth.on_delta(delta("r", 1, l));
  for (int i = 0; i < 5; ++i)
    (void)l.on_route(0);
  auth.on_delta(delta("r", 2, l));
  EXPECT_EQ(auth.in_flight(0), 5u);
  auth.on_report(0, 3, 10, 500);  // the worker says 3 (two finished events were lost)
  EXPECT_EQ(auth.in_flight(0), 3u);
  (void)l.on_route(0);
  auth.on_delta(delta("r", 3, l));
  auth.on_finished(0, 1);
  EXPECT_EQ(auth.in_flight(0), 3u);
  auth.on_report(0, 9, 9, 600);  // older seq: not applied
  EXPECT_EQ(auth.in_flight(0), 3u);
  EXPECT_EQ(auth.counters().reports_stale, 1u);
  auth.on_finished(0, 10);  // more finished than running: never below zero
  EXPECT_EQ(auth.in_flight(0), 0u);
  // Liveness follows the reports, stale ones included (a heartbeat).
  EXPECT_TRUE(auth.publish(1600).workers.at(0).alive);
  EXPECT_FALSE(auth.publish(1601).workers.at(0).alive);
}

TEST(LoadAuthority, ARouterRestartKeepsItsRunningRequestsInTheBase) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger before(1);
  auth.on_delta(delta("r", 1, before, 1));
  for (int i = 0; i < 4; ++i)
    (void)before.on_route(0);
  auth.on_delta(delta("r", 2, before, 1));
  EXPECT_EQ(auth.in_flight(0), 4u);
  decision_ledger after(1);  // restarted: totals from 0, a new incarnation, seq from 1
  (void)after.on_route(0);
  auth.on_delta(delta("r", 1, after, 2));
  EXPECT_EQ(auth.in_flight(0), 5u);
  EXPECT_EQ(auth.counters().incarnations, 1u);
}

// A router seen for the first time after it made decisions (an authority that took over): those
// are left to the worker's next report, not counted twice.
TEST(LoadAuthority, ARouterFirstSeenLateIsAnchoredAtItsFirstTotals) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger l(1);
  for (int i = 0; i < 7; ++i)
    (void)l.on_route(0);
  auth.on_report(0, 7, 1, 0);
  auth.on_delta(delta("r", 40, l));
  EXPECT_EQ(auth.in_flight(0), 7u);
  (void)l.on_route(0);
  auth.on_delta(delta("r", 41, l));
  EXPECT_EQ(auth.in_flight(0), 8u);
}

// Routers and authority start together and the worker never reports (a pushed report or scrape
// may come late): every decision counts from the first delta on.
// Deltas carry only changed totals, so a router first seen after a report may name a worker only in
// a later delta than its first: it is anchored at its first total for that worker all the same.
TEST(LoadAuthority, ARouterFirstSeenLateIsAnchoredAtItsFirstTotalForEachWorker) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  auth.add_worker(1, 0);
  auth.on_report(0, 4, 1, 0);
  auth.on_report(1, 6, 1, 0);
  auth.on_delta({"late", 1, 1, {{0, 10}}});
  EXPECT_EQ(auth.in_flight(0), 4u);
  auth.on_delta({"late", 1, 2, {{1, 20}}});  // worker 1's first total from it
  EXPECT_EQ(auth.in_flight(1), 6u);
  auth.on_delta({"late", 1, 3, {{1, 22}}});
  EXPECT_EQ(auth.in_flight(0), 4u);
  EXPECT_EQ(auth.in_flight(1), 8u);
}

TEST(LoadAuthority, BeforeAnyReportARouterFirstSeenCountsFromZero) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger l(1);
  (void)l.on_route(0);
  auth.on_delta(delta("r", 1, l));
  EXPECT_EQ(auth.in_flight(0), 1u);
}

// A node takes worker 0 over from an authority that left (adopt_worker), already holding worker 1
// of its own: it starts from the departed authority's last load, whatever the routers' totals,
// which it already counted; their decisions from then on count, and a report rebases it as
// usual, a router that sends its first total only after that report included.
TEST(LoadAuthority, AnAdoptedWorkerStartsFromTheDepartedLoadAndCountsOnlyNewDecisions) {
  load_authority auth("a", 0);
  auth.add_worker(1, 0);
  decision_ledger r1(2), r2(2), r3(2);
  for (int i = 0; i < 50; ++i) {
    (void)r1.on_route(0);
    (void)r2.on_route(0);
    (void)r3.on_route(0);
  }
  (void)r1.on_route(1);
  auth.on_delta(delta("r1", 1, r1));  // r1 known before the takeover (worker 1)
  auth.adopt_worker(0, 9, 100);
  EXPECT_TRUE(auth.holds(0));
  EXPECT_EQ(auth.in_flight(0), 9u);
  auth.on_delta(delta("r1", 2, r1));
  auth.on_delta(delta("r2", 1, r2));  // r2 first seen after the takeover
  EXPECT_EQ(auth.in_flight(0), 9u);
  EXPECT_EQ(auth.in_flight(1), 1u);  // worker 1 as before
  (void)r1.on_route(0);
  (void)r2.on_route(0);
  auth.on_delta(delta("r1", 3, r1));
  auth.on_delta(delta("r2", 2, r2));
  EXPECT_EQ(auth.in_flight(0), 11u);
  auth.on_report(0, 4, 1, 200);
  EXPECT_EQ(auth.in_flight(0), 4u);
  auth.on_delta(delta("r3", 1, r3));  // r3 sends its first total only now
  EXPECT_EQ(auth.in_flight(0), 4u);
  (void)r3.on_route(0);
  auth.on_delta(delta("r3", 2, r3));
  EXPECT_EQ(auth.in_flight(0), 5u);
  auth.adopt_worker(0, 99, 300);  // idempotent
  EXPECT_EQ(auth.in_flight(0), 5u);
}

TEST(LoadAuthority, MessagesForWorkersItDoesNotHoldAreCountedAndIgnored) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger l(3);
  (void)l.on_route(2);
  auth.on_delta(delta("r", 1, l));
  auth.on_report(5, 1, 1, 0);
  auth.on_finished(5, 1);
  EXPECT_EQ(auth.counters().unknown_worker, 3u);
  EXPECT_EQ(auth.publish(0).workers.size(), 1u);
}

TEST(LoadOverlay, AnEntryOfAVectorIsFoundUntilItsAuthorityIsForgotten) {
  load_overlay o;
  load_vector v;
  v.authority = "a";
  v.seq = 1;
  v.workers = {{3, 7, true, 2}};
  ASSERT_EQ(o.on_vector(v, "r", 1), applied);
  ASSERT_TRUE(o.entry("a", 3).has_value());
  EXPECT_EQ(o.entry("a", 3)->in_flight, 7u);
  EXPECT_EQ(o.entry("a", 3)->claim, 2u);
  EXPECT_FALSE(o.entry("a", 4).has_value());
  EXPECT_FALSE(o.entry("b", 3).has_value());
  o.forget("a");
  EXPECT_FALSE(o.entry("a", 3).has_value());
  decision_ledger l(4);
  std::vector<uint32_t> out(4, 0);
  std::vector<uint8_t> covered(4, 0);
  o.compose(l, out, covered);
  EXPECT_EQ(covered[3], 0);
}

// The router's side: its own decisions count at once, its peer's once the authority's next vector
// includes them; an older vector is ignored.
TEST(LoadOverlay, OwnDecisionsAtOncePeersWithinOneInterval) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  auth.add_worker(1, 0);
  decision_ledger mine(2), peer(2);
  load_overlay view;
  uint64_t my_seq = 0, peer_seq = 0;
  auto send_mine = [&] {
    const auto d = delta("me", ++my_seq, mine);
    view.sent("a", my_seq, d.totals);
    auth.on_delta(d);
  };
  send_mine();
  auth.on_delta(delta("peer", ++peer_seq, peer));
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);
  std::vector<uint32_t> load(2, 99);
  std::vector<uint8_t> covered(2, 0);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(covered, (std::vector<uint8_t>{1, 1}));

  (void)mine.on_route(0);
  (void)peer.on_route(1);
  (void)peer.on_route(1);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{1, 0}));  // the peer's not yet
  send_mine();
  auth.on_delta(delta("peer", ++peer_seq, peer));
  const auto v = auth.publish(0);
  (void)mine.on_route(0);  // after the send: not in the vector, added by the overlay
  ASSERT_EQ(view.on_vector(v, "me", 1), applied);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{2, 2}));
  auto older = v;
  older.seq = 1;
  older.workers[1].in_flight = 50;
  EXPECT_EQ(view.on_vector(older, "me", 1), load_overlay::vector_outcome::stale);
  view.compose(mine, load, covered);
  EXPECT_EQ(load[1], 2u);
}

// The peer estimate (peer_estimate): with R routers, each of this router's decisions the vector
// lacks counts R times -- its own and (R - 1) for its peers' in that time -- and once a vector
// includes them, the vector's own count replaces the estimate.
TEST(LoadOverlay, ThePeerEstimateCountsUnincludedDecisionsRTimesUntilAVectorIncludesThem) {
  EXPECT_EQ(peer_estimate(5, 1), 0u);
  EXPECT_EQ(peer_estimate(5, 0), 0u);
  EXPECT_EQ(peer_estimate(5, 4), 15u);
  EXPECT_EQ(peer_estimate(0, 4), 0u);
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  auth.add_worker(1, 0);
  decision_ledger mine(2), peer(2);
  load_overlay view;
  uint64_t my_seq = 0;
  auto send_mine = [&] {
    const auto d = delta("me", ++my_seq, mine);
    view.sent("a", my_seq, d.totals);
    auth.on_delta(d);
  };
  send_mine();
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);
  (void)mine.on_route(0);
  (void)mine.on_route(0);
  (void)peer.on_route(1);  // the peer's real decision: not in the vector either
  std::vector<uint32_t> load(2, 99);
  std::vector<uint8_t> covered(2, 0);
  view.compose(mine, load, covered, 3);
  EXPECT_EQ(load, (std::vector<uint32_t>{6, 0}));  // 2 own + 2 x 2 estimated
  view.compose(mine, load, covered, 1);
  EXPECT_EQ(load, (std::vector<uint32_t>{2, 0}));  // one router: own decisions only
  const auto one = view.compose_vector("a", mine, 3);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0].in_flight, 6u);
  EXPECT_EQ(one[0].estimated, 4u);
  EXPECT_EQ(one[1].in_flight, 0u);
  EXPECT_EQ(one[1].estimated, 0u);
  EXPECT_EQ(view.compose_vector("a", mine, 1)[0].estimated, 0u);
  // The vector that includes both routers' deltas: real counts, no estimate left.
  send_mine();
  auth.on_delta(delta("peer", 1, peer));
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);
  view.compose(mine, load, covered, 3);
  EXPECT_EQ(load, (std::vector<uint32_t>{2, 1}));
}

// A router's first delta crosses a vector on the way (the authority composed it before the delta
// arrived): until a vector includes a delta of this router, its decisions count in its view for
// a worker that has not reported (the authority counts them from 0, and the vector in hand has
// none), and those since its first send for one that has (the authority takes the first total
// as the report's). Found as a flaky integration test: eight requests at one router went 3, 2,
// 2, 1 over four idle workers, since the first decision vanished from the router's own view.
TEST(LoadOverlay, DecisionsBeforeTheFirstIncludedDeltaCountUnlessTheAuthorityAnchorsThem) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);  // never reports
  auth.add_worker(1, 0);
  auth.on_report(1, 0, 1, 0);  // reported idle
  decision_ledger mine(2);
  load_overlay view;
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);  // includes nothing of "me"
  const load_vector crossing = auth.publish(0);                  // composed before the delta
  (void)mine.on_route(0);
  (void)mine.on_route(1);
  view.sent("a", 1, delta("me", 1, mine).totals);  // on its way
  ASSERT_EQ(view.on_vector(crossing, "me", 1), applied);
  std::vector<uint32_t> load(2, 99);
  std::vector<uint8_t> covered(2, 0);
  view.compose(mine, load, covered);
  EXPECT_EQ(load[0], 1u) << "the unreported worker lost this router's decision";
  EXPECT_EQ(load[1], 0u) << "the reported worker: the authority counts the first total as its "
                            "report's, and so does the overlay (the designed approximation)";
  // Once the authority applied the delta and says so, both are exact against its sums.
  auth.on_delta(delta("me", 1, mine));
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{1, 0}));
  (void)mine.on_route(1);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{1, 1}));
}

// Two authorities, each with its own workers: composing one arriving vector gives exactly what
// composing every vector gives for that vector's workers, and nothing for the others' -- what the
// router applies per vector, at a cost of that authority's workers only.
TEST(LoadOverlay, ComposingOneVectorAgreesWithComposingAll) {
  load_authority a("a", 0), b("b", 0);
  for (uint32_t w : {0u, 2u, 4u})
    a.add_worker(w, 0);
  for (uint32_t w : {1u, 3u})
    b.add_worker(w, 0);
  decision_ledger mine(5), peer(5);
  load_overlay view;
  uint64_t seq = 0;
  for (uint32_t w : {0u, 1u, 1u, 2u, 3u, 3u, 3u})
    (void)mine.on_route(w);
  for (uint32_t w : {0u, 4u, 1u})
    (void)peer.on_route(w);
  // Each authority gets only its workers' totals, as the router sends them.
  auto only = [](const load_delta& d, std::initializer_list<uint32_t> ws) {
    load_delta out = d;
    out.totals.clear();
    for (const auto& [w, t] : d.totals)
      if (std::find(ws.begin(), ws.end(), w) != ws.end()) out.totals.emplace_back(w, t);
    return out;
  };
  ++seq;
  const auto to_a = only(delta("me", seq, mine), {0, 2, 4});
  const auto to_b = only(delta("me", seq, mine), {1, 3});
  view.sent("a", seq, to_a.totals);
  view.sent("b", seq, to_b.totals);
  a.on_delta(to_a);
  b.on_delta(to_b);
  a.on_delta(only(delta("peer", 1, peer), {0, 2, 4}));
  b.on_delta(only(delta("peer", 1, peer), {1, 3}));
  a.on_report(2, 7, 1, 0);  // worker 2's own report: 7 running
  ASSERT_EQ(view.on_vector(a.publish(0), "me", 1), applied);
  ASSERT_EQ(view.on_vector(b.publish(0), "me", 1), applied);
  (void)mine.on_route(4);  // after the send: the overlay adds it
  (void)mine.on_route(1);

  std::vector<uint32_t> load(5, 0);
  std::vector<uint8_t> covered(5, 0);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{2, 4, 7, 3, 2}));
  for (const std::string name : {"a", "b"}) {
    const auto part = view.compose_vector(name, mine);
    EXPECT_EQ(part.size(), name == "a" ? 3u : 2u);
    for (const auto& e : part) {
      EXPECT_EQ(e.in_flight, load[e.worker]) << name << " worker " << e.worker;
      EXPECT_EQ(e.alive ? 1 : 2, covered[e.worker]) << name << " worker " << e.worker;
    }
  }
  EXPECT_TRUE(view.compose_vector("c", mine).empty());
}

// A vector lost on the way: the router keeps the older one plus its own decisions since that
// one's included delta, and the next vector puts it right.
TEST(LoadOverlay, ALostVectorConvergesAtTheNext) {
  load_authority auth("a", 0);
  auth.add_worker(0, 0);
  decision_ledger mine(1);
  load_overlay view;
  uint64_t seq = 0;
  auto send = [&] {
    ++seq;
    const auto d = delta("me", seq, mine);
    view.sent("a", seq, d.totals);
    auth.on_delta(d);
  };
  send();
  ASSERT_EQ(view.on_vector(auth.publish(0), "me", 1), applied);
  std::vector<uint32_t> load(1, 0);
  std::vector<uint8_t> covered(1, 0);
  for (int interval = 0; interval < 5; ++interval) {
    (void)mine.on_route(0);
    (void)mine.on_route(0);
    auth.on_finished(0, 1);
    send();
    const auto v = auth.publish(0);
    if (interval != 2) {
      ASSERT_EQ(view.on_vector(v, "me", 1), applied);  // interval 2's vector is lost
    }
    view.compose(mine, load, covered);
    if (interval != 2) {
      EXPECT_EQ(load[0], auth.in_flight(0)) << "interval " << interval;
    }
  }
  EXPECT_EQ(load[0], 5u);  // 10 routed, 5 finished
}

// An authority that restarts faster than the membership notices numbers its vectors from 1 again
// and holds none of a router's totals. Its first vector is taken at once (not ignored until its
// seq passes the old process's), the router owes it every total again, and once it includes them
// its load and the router's composed load are exact again.
TEST(LoadOverlay, ARestartedAuthorityIsHeardAtOnceAndGetsEveryTotalAgain) {
  constexpr uint32_t workers = 4;
  auto authority_a = [](uint32_t) -> const std::string* {
    static const std::string a = "a";
    return &a;
  };
  decision_ledger mine(workers);
  delta_outbox outbox;
  load_overlay view;
  auto run_interval = [&](load_authority& auth, uint64_t incarnation) {
    for (auto& [a, d] : outbox.interval(mine, mine.take_routed(), authority_a)) {
      d.router = "me";
      d.incarnation = 1;
      view.sent(a, d.seq, d.totals);
      auth.on_delta(d);
    }
    load_vector v = auth.publish(0);
    v.incarnation = incarnation;
    const auto outcome = view.on_vector(v, "me", 1);
    if (outcome != load_overlay::vector_outcome::stale)
      outbox.acknowledged("a", view.included("a"));
    return outcome;
  };
  auto old_process = std::make_unique<load_authority>("a", 0);
  for (uint32_t w = 0; w < workers; ++w)
    old_process->add_worker(w, 0);
  for (int i = 0; i < 50; ++i) {  // a long life: its vectors' seq reaches 50
    (void)mine.on_route(static_cast<uint32_t>(i) % workers);
    ASSERT_EQ(run_interval(*old_process, 7), applied);
  }
  EXPECT_EQ(outbox.pending(), 0u);
  old_process.reset();

  // The new process: its workers report what is running (5 each), as they do when they reach it.
  load_authority new_process("a", 0);
  for (uint32_t w = 0; w < workers; ++w) {
    new_process.add_worker(w, 0);
    new_process.on_report(w, 5, 1, 0);
  }
  EXPECT_EQ(run_interval(new_process, 8), load_overlay::vector_outcome::restarted);
  std::vector<uint32_t> load(workers, 0);
  std::vector<uint8_t> covered(workers, 0);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{5, 5, 5, 5}));  // its load, not the old one's
  // Nothing was routed since: without resend_all nothing would reach the new process, which would
  // then learn this router's totals only as it routes again, one worker at a time.
  outbox.resend_all(mine, authority_a);
  outbox.resync("a");
  EXPECT_EQ(outbox.pending(), workers);
  ASSERT_EQ(run_interval(new_process, 8), applied);
  EXPECT_EQ(outbox.pending(), 0u);
  // Anchored at the resent totals (the reports count what was routed before them): from now on
  // each decision counts once, at the authority and in the router's view alike.
  (void)mine.on_route(1);
  (void)mine.on_route(1);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{5, 7, 5, 5}));
  ASSERT_EQ(run_interval(new_process, 8), applied);
  EXPECT_EQ(new_process.in_flight(1), 7u);
  view.compose(mine, load, covered);
  EXPECT_EQ(load, (std::vector<uint32_t>{5, 7, 5, 5}));
  // A vector of the new process that is older than the newest is still stale.
  load_vector old = new_process.publish(0);
  old.incarnation = 8;
  old.seq = 1;
  EXPECT_EQ(view.on_vector(old, "me", 1), load_overlay::vector_outcome::stale);
  // So is a late one of the process it replaced, whatever its seq: not a restart back.
  old.incarnation = 7;
  old.seq = 51;
  old.workers[1].in_flight = 99;
  EXPECT_EQ(view.on_vector(old, "me", 1), load_overlay::vector_outcome::stale);
  view.compose(mine, load, covered);
  EXPECT_EQ(load[1], 7u);
  // A third process is a restart again.
  load_vector third = new_process.publish(0);
  third.incarnation = 9;
  third.seq = 1;
  EXPECT_EQ(view.on_vector(third, "me", 1), load_overlay::vector_outcome::restarted);
}

// A restarted authority whose workers have not reported yet: the resent totals come marked
// `resync`, so it anchors the router at them (the reports to come count those requests) instead
// of counting every decision the router ever made; the mark stops once a vector includes it.
TEST(LoadAuthority, AResyncDeltaIsAnchoredAtItsTotalsBeforeAnyReport) {
  auto authority_a = [](uint32_t) -> const std::string* {
    static const std::string a = "a";
    return &a;
  };
  decision_ledger mine(3);
  for (int i = 0; i < 300; ++i)
    (void)mine.on_route(static_cast<uint32_t>(i) % 3);  // 100 each, long finished
  delta_outbox outbox;
  load_authority new_process("a", 0);
  for (uint32_t w = 0; w < 3; ++w)
    new_process.add_worker(w, 0);
  outbox.resend_all(mine, authority_a);
  outbox.resync("a");
  std::vector<load_delta> sent;
  auto run_interval = [&] {
    for (auto& [a, d] : outbox.interval(mine, mine.take_routed(), authority_a)) {
      d.router = "me";
      d.incarnation = 1;
      new_process.on_delta(d);
      sent.push_back(d);
    }
    outbox.acknowledged("a", new_process.publish(0).included.at("me").seq);
  };
  run_interval();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].resync);
  EXPECT_EQ(sent[0].totals.size(), 3u);
  for (uint32_t w = 0; w < 3; ++w)
    EXPECT_EQ(new_process.in_flight(w), 0u) << "worker " << w;  // not 100
  (void)mine.on_route(2);
  run_interval();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_FALSE(sent[1].resync);  // the first was included: over
  EXPECT_EQ(new_process.in_flight(2), 1u);
  // Unmarked, a router first heard of before any report counts from 0, as for a new worker.
  load_authority fresh("a", 0);
  fresh.add_worker(0, 0);
  load_delta plain;
  plain.router = "me";
  plain.incarnation = 1;
  plain.seq = 1;
  plain.totals = {{0, 100}};
  fresh.on_delta(plain);
  EXPECT_EQ(fresh.in_flight(0), 100u);
}

// A router that restarted numbers its deltas from 1 again: an authority's vector that still names
// the old incarnation's seq (it has not heard the new one yet) must not count as including the new
// one's deltas, or the router would stop sending totals the authority never got.
TEST(LoadOverlay, AnotherIncarnationsIncludedSeqIncludesNothing) {
  load_overlay view;
  view.sent("a", 1, {{0, 3}});
  load_vector v;
  v.authority = "a";
  v.seq = 9;
  v.workers = {{0, 2, true, 0}};
  v.included["me"] = {1, 400};  // the old incarnation's 400th delta
  ASSERT_EQ(view.on_vector(v, "me", 2), applied);
  EXPECT_EQ(view.included("a"), 0u);
  v.seq = 10;
  v.included["me"] = {2, 1};
  ASSERT_EQ(view.on_vector(v, "me", 2), applied);
  EXPECT_EQ(view.included("a"), 1u);
}

}  // namespace
}  // namespace eldr
