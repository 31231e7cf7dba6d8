// load_view: counting on route and finish, once per id; reports overriding the count and their
// ordering; liveness timeouts driven by injected time; drain, capacity and registration; the
// bounded id table; resize; and the spans handed to routing.
#include "core/load_view.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "core/routing.hpp"

#include "tests/support/allocation_counter.hpp"  // once per test binary

namespace eldr {
namespace {

load_view make_or_die(uint32_t k, const load_view_options& o = {}) {
  auto v = load_view::make(k, o);
  EXPECT_TRUE(v.ok()) << v.error().to_string();
  return std::move(v).value();
}

// A pool of k registered workers at time 0, endpoints "w0", "w1", ...
load_view registered_pool(uint32_t k, const load_view_options& o = {}, uint32_t capacity = 0) {
  load_view v = make_or_die(k, o);
  for (uint32_t w = 0; w < k; ++w)
    EXPECT_TRUE(v.register_worker(w, "w" + std::to_string(w), capacity, 0).ok());
  return v;
}

std::vector<uint32_t> loads(const load_view& v) {
  return {v.load().begin(), v.load().end()};
}

std::vector<uint8_t> mask(load_view& v, int64_t now) {
  auto e = v.eligible(now);
  return {e.begin(), e.end()};
}

TEST(LoadView, MakeRejectsBadOptions) {
  EXPECT_FALSE(load_view::make(0).ok());
  load_view_options o;
  o.report_timeout_ms = -1;
  EXPECT_FALSE(load_view::make(2, o).ok());
  o = {};
  o.max_tracked = 0;
  EXPECT_FALSE(load_view::make(2, o).ok());
  o = {};
  o.tracked_ttl_ms = 0;
  EXPECT_FALSE(load_view::make(2, o).ok());
  o = {};
  o.max_id_bytes = 0;
  EXPECT_FALSE(load_view::make(2, o).ok());
}

TEST(LoadView, StateNames) {
  EXPECT_EQ(to_string(worker_state::unregistered), "unregistered");
  EXPECT_EQ(to_string(worker_state::active), "active");
  EXPECT_EQ(to_string(worker_state::draining), "draining");
  EXPECT_EQ(to_string(worker_state::dead), "dead");
  EXPECT_EQ(to_string(worker_state::full), "full");
}

TEST(LoadView, UnregisteredSlotsAreNotEligibleAndRefuseRoutesAndReports) {
  load_view v = make_or_die(3);
  EXPECT_EQ(mask(v, 0), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(v.eligible_count(0), 0u);
  ASSERT_TRUE(v.register_worker(1, "tcp://b:1", 0, 0).ok());
  EXPECT_EQ(mask(v, 0), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(v.eligible_count(0), 1u);

  auto r = v.on_route("a", 0, 0);
  EXPECT_EQ(r.code(), status_code::failed_precondition);
  EXPECT_EQ(v.on_report(2, 1, 1, 0).code(), status_code::failed_precondition);
  EXPECT_EQ(v.on_route("a", 3, 0).code(), status_code::invalid_argument);
  EXPECT_EQ(v.register_worker(3, "x", 0, 0).code(), status_code::invalid_argument);
  EXPECT_EQ(v.register_worker(0, "", 0, 0).code(), status_code::invalid_argument);
  EXPECT_EQ(v.drain(0).code(), status_code::failed_precondition);
  EXPECT_EQ(v.counters().routed, 0u);
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{0, 0, 0}));
}

TEST(LoadView, RouteIncrementsAndFinishDecrementsOncePerId) {
  load_view v = registered_pool(2);
  ASSERT_TRUE(v.on_route("r1", 0, 10).ok());
  ASSERT_TRUE(v.on_route("r2", 0, 11).ok());
  ASSERT_TRUE(v.on_route("r3", 1, 12).ok());
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(v.tracked(), 3u);

  EXPECT_TRUE(v.on_finished("r1", 20));
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{1, 1}));
  EXPECT_FALSE(v.on_finished("r1", 21));     // duplicate
  EXPECT_FALSE(v.on_finished("nope", 21));   // unknown
  EXPECT_FALSE(v.on_finished(0, "r3", 21));  // r3 went to worker 1, not 0: left tracked
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{1, 1}));
  EXPECT_TRUE(v.on_finished(1, "r3", 22));
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{1, 0}));

  const auto& c = v.counters();
  EXPECT_EQ(c.routed, 3u);
  EXPECT_EQ(c.finished, 2u);
  EXPECT_EQ(c.finished_unknown, 3u);
  EXPECT_EQ(v.tracked(), 1u);
  auto s0 = v.snapshot(0, 22);
  ASSERT_TRUE(s0.ok());
  EXPECT_EQ(s0->routed, 2u);
  EXPECT_EQ(s0->finished, 1u);
}

TEST(LoadView, RejectsEmptyAndOverlongIdsWithoutCounting) {
  load_view_options o;
  o.max_id_bytes = 4;
  load_view v = registered_pool(1, o);
  EXPECT_EQ(v.on_route("", 0, 0).code(), status_code::invalid_argument);
  EXPECT_EQ(v.on_route("12345", 0, 0).code(), status_code::invalid_argument);
  EXPECT_TRUE(v.on_route("1234", 0, 0).ok());
  EXPECT_EQ(v.counters().routed, 1u);
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{1}));
}

TEST(LoadView, RerouteOfATrackedIdReleasesTheEarlierRoute) {
  load_view v = registered_pool(2);
  ASSERT_TRUE(v.on_route("r", 0, 0).ok());
  ASSERT_TRUE(v.on_route("r", 1, 1).ok());
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(v.counters().rerouted, 1u);
  EXPECT_EQ(v.tracked(), 1u);
  EXPECT_TRUE(v.on_finished("r", 2));
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{0, 0}));
}

TEST(LoadView, ReportOverridesTheCountAndStaleReportsAreIgnored) {
  load_view v = registered_pool(2);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(v.on_route("r" + std::to_string(i), 0, 0).ok());
  EXPECT_EQ(loads(v)[0], 5u);

  ASSERT_TRUE(v.on_report(0, 2, 7, 100).ok());  // first report applies whatever its seq
  EXPECT_EQ(loads(v)[0], 2u);
  ASSERT_TRUE(v.on_report(0, 9, 7, 101).ok());  // duplicate seq
  ASSERT_TRUE(v.on_report(0, 9, 3, 102).ok());  // older seq
  EXPECT_EQ(loads(v)[0], 2u);
  EXPECT_EQ(v.counters().reports, 1u);
  EXPECT_EQ(v.counters().reports_stale, 2u);
  ASSERT_TRUE(v.on_report(0, 4, 8, 103).ok());
  EXPECT_EQ(loads(v)[0], 4u);

  auto s = v.snapshot(0, 110);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->has_reported_seq);
  EXPECT_EQ(s->reported_seq, 8u);
  EXPECT_EQ(s->last_report_age_ms, 7);

  // Finishes after a report that already excluded them never wrap below zero.
  ASSERT_TRUE(v.on_report(0, 0, 9, 120).ok());
  EXPECT_TRUE(v.on_finished("r0", 121));
  EXPECT_EQ(loads(v)[0], 0u);
}

TEST(LoadView, StaleReportIsStillAHeartbeat) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(1, o);
  ASSERT_TRUE(v.on_report(0, 3, 10, 50).ok());
  ASSERT_TRUE(v.on_report(0, 9, 10, 140).ok());  // repeated seq: load ignored, worker alive
  EXPECT_EQ(loads(v)[0], 3u);
  EXPECT_EQ(v.counters().reports_stale, 1u);
  EXPECT_EQ(v.state(0, 200), worker_state::active);  // 60 ms after the stale report
  EXPECT_EQ(mask(v, 200), (std::vector<uint8_t>{1}));
  EXPECT_EQ(v.state(0, 241), worker_state::dead);
  // A dead worker revives on a stale report too.
  ASSERT_TRUE(v.on_report(0, 9, 9, 300).ok());
  EXPECT_EQ(mask(v, 300), (std::vector<uint8_t>{1}));
}

// Issue 12 defect 10: one report with seq = 2^64-1 made every later report stale, so the worker
// went dead while it reported.
TEST(LoadView, MaximalSeqDoesNotKillAWorker) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(1, o);
  ASSERT_TRUE(v.on_report(0, 1, 1, 0).ok());
  ASSERT_TRUE(v.on_report(0, 7, UINT64_MAX, 10).ok());
  EXPECT_EQ(loads(v)[0], 7u);
  int64_t now = 10;
  for (uint64_t seq = 2; seq < 12; ++seq) {
    now += 80;  // every report inside the timeout of the previous one
    ASSERT_TRUE(v.on_report(0, static_cast<uint32_t>(seq), seq, now).ok());
    EXPECT_EQ(v.state(0, now + 50), worker_state::active) << "seq " << seq;
  }
  // The first report after the huge one started a new sequence; the ones after it applied.
  EXPECT_EQ(v.counters().seq_resets, 1u);
  EXPECT_EQ(v.counters().reports_stale, 0u);
  EXPECT_EQ(loads(v)[0], 11u);
  auto s = v.snapshot(0, now);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reported_seq, 11u);
}

TEST(LoadView, FarBackwardsSeqIsANewSequenceNearBackwardsIsReordered) {
  load_view_options o;
  o.seq_reorder_window = 4;
  load_view v = registered_pool(1, o);
  ASSERT_TRUE(v.on_report(0, 5, 100, 0).ok());
  ASSERT_TRUE(v.on_report(0, 6, 96, 1).ok());  // 4 behind: reordered
  EXPECT_EQ(loads(v)[0], 5u);
  EXPECT_EQ(v.counters().reports_stale, 1u);
  ASSERT_TRUE(v.on_report(0, 2, 95, 2).ok());  // 5 behind: the worker restarted its counter
  EXPECT_EQ(loads(v)[0], 2u);
  EXPECT_EQ(v.counters().seq_resets, 1u);
  ASSERT_TRUE(v.on_report(0, 3, 96, 3).ok());  // and counts on from there
  EXPECT_EQ(loads(v)[0], 3u);
  // Wrapping from the largest seq to 0 is a new sequence too.
  ASSERT_TRUE(v.on_report(0, 1, UINT64_MAX, 4).ok());
  ASSERT_TRUE(v.on_report(0, 4, 0, 5).ok());
  EXPECT_EQ(loads(v)[0], 4u);
  EXPECT_EQ(v.counters().seq_resets, 2u);
}

TEST(LoadView, RoutableSummaryCountsLiveUndrainedWorkersAndTheirLastDeadline) {
  load_view_options o;
  o.report_timeout_ms = 100;
  auto v = make_or_die(3, o);
  EXPECT_EQ(v.routable(0).workers, 0u);
  ASSERT_TRUE(v.register_worker(0, "tcp://a:1", 0, 0).ok());
  ASSERT_TRUE(v.register_worker(1, "tcp://b:1", 1, 50).ok());
  ASSERT_TRUE(v.on_route("r", 1, 50).ok());  // full, still routable for readiness
  auto r = v.routable(60);
  EXPECT_EQ(r.workers, 2u);
  EXPECT_EQ(r.live_until_ms, 150);
  ASSERT_TRUE(v.drain(1).ok());
  r = v.routable(60);
  EXPECT_EQ(r.workers, 1u);
  EXPECT_EQ(r.live_until_ms, 100);
  EXPECT_EQ(v.routable(101).workers, 0u);
  auto never = make_or_die(1);
  ASSERT_TRUE(never.register_worker(0, "tcp://a:1", 0, 0).ok());
  EXPECT_EQ(never.routable(5).live_until_ms, std::numeric_limits<int64_t>::max());
}

TEST(LoadView, SilentWorkerTimesOutAndComesBackOnItsNextReport) {
  load_view_options o;
  o.report_timeout_ms = 1000;
  load_view v = registered_pool(3, o);  // registration at t = 0 counts as a report
  ASSERT_TRUE(v.on_report(0, 0, 1, 500).ok());
  ASSERT_TRUE(v.on_report(1, 0, 1, 800).ok());

  EXPECT_EQ(mask(v, 1000), (std::vector<uint8_t>{1, 1, 1}));  // age == timeout: still live
  EXPECT_EQ(mask(v, 1001), (std::vector<uint8_t>{1, 1, 0}));  // worker 2: no report since 0
  EXPECT_EQ(v.state(2, 1001), worker_state::dead);
  EXPECT_EQ(mask(v, 1501), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(v.eligible_count(1501), 1u);
  EXPECT_EQ(mask(v, 1801), (std::vector<uint8_t>{0, 0, 0}));

  ASSERT_TRUE(v.on_report(2, 0, 1, 1900).ok());
  EXPECT_EQ(mask(v, 1900), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(v.state(2, 1900), worker_state::active);
  // Asking about an earlier time than the cached one recomputes instead of trusting the cache.
  EXPECT_EQ(mask(v, 900), (std::vector<uint8_t>{1, 1, 1}));
}

TEST(LoadView, ZeroTimeoutNeverKillsAWorker) {
  load_view v = registered_pool(1);
  EXPECT_EQ(mask(v, int64_t{1} << 50), (std::vector<uint8_t>{1}));
}

TEST(LoadView, DrainedWorkerGetsNoNewRequestsButItsInFlightOnesFinish) {
  load_view v = registered_pool(2);
  ASSERT_TRUE(v.on_route("a", 1, 0).ok());
  ASSERT_TRUE(v.drain(1).ok());
  EXPECT_EQ(mask(v, 1), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(v.state(1, 1), worker_state::draining);
  EXPECT_TRUE(v.on_finished("a", 2));
  EXPECT_EQ(loads(v)[1], 0u);
  EXPECT_EQ(mask(v, 2), (std::vector<uint8_t>{1, 0}));
  ASSERT_TRUE(v.undrain(1).ok());
  EXPECT_EQ(mask(v, 3), (std::vector<uint8_t>{1, 1}));
}

TEST(LoadView, DeadWinsOverDrainingInTheState) {
  load_view_options o;
  o.report_timeout_ms = 10;
  load_view v = registered_pool(1, o);
  ASSERT_TRUE(v.drain(0).ok());
  EXPECT_EQ(v.state(0, 5), worker_state::draining);
  EXPECT_EQ(v.state(0, 11), worker_state::dead);
  auto s = v.snapshot(0, 11);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->draining);
}

TEST(LoadView, WorkerAtCapacityIsNotEligibleUntilItsLoadDrops) {
  load_view v = registered_pool(2, {}, /*capacity=*/2);
  ASSERT_TRUE(v.on_route("a", 0, 0).ok());
  EXPECT_EQ(mask(v, 0), (std::vector<uint8_t>{1, 1}));
  ASSERT_TRUE(v.on_route("b", 0, 0).ok());
  EXPECT_EQ(mask(v, 0), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(v.state(0, 0), worker_state::full);
  EXPECT_TRUE(v.on_finished("a", 1));
  EXPECT_EQ(mask(v, 1), (std::vector<uint8_t>{1, 1}));
  ASSERT_TRUE(v.on_report(1, 5, 1, 2).ok());  // a report can also fill a worker
  EXPECT_EQ(mask(v, 2), (std::vector<uint8_t>{1, 0}));
}

TEST(LoadView, ReRegistrationResetsTheSlotAndIgnoresOlderFinishes) {
  load_view v = registered_pool(1);
  ASSERT_TRUE(v.on_route("old", 0, 0).ok());
  ASSERT_TRUE(v.on_report(0, 1, 50, 0).ok());
  ASSERT_TRUE(v.drain(0).ok());
  ASSERT_TRUE(v.register_worker(0, "tcp://new:1", 8, 10).ok());  // the worker restarted
  auto s = v.snapshot(0, 10);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->endpoint, "tcp://new:1");
  EXPECT_EQ(s->capacity, 8u);
  EXPECT_EQ(s->state, worker_state::active);
  EXPECT_EQ(s->load, 0u);
  EXPECT_FALSE(s->has_reported_seq);

  ASSERT_TRUE(v.on_route("new", 0, 11).ok());
  EXPECT_FALSE(v.on_finished("old", 12));  // routed to the previous instance
  EXPECT_EQ(loads(v)[0], 1u);
  ASSERT_TRUE(v.on_report(0, 1, 1, 13).ok());  // seq history restarted with the worker
  EXPECT_EQ(v.counters().reports_stale, 0u);
}

TEST(LoadView, UnregisterMakesTheSlotIneligibleAndZeroLoad) {
  load_view v = registered_pool(2);
  ASSERT_TRUE(v.on_route("a", 0, 0).ok());
  ASSERT_TRUE(v.unregister_worker(0).ok());
  EXPECT_TRUE(v.unregister_worker(0).ok());  // idempotent
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(mask(v, 1), (std::vector<uint8_t>{0, 1}));
  EXPECT_FALSE(v.on_finished("a", 1));
  auto s = v.snapshot(0, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, worker_state::unregistered);
  EXPECT_EQ(s->last_report_age_ms, -1);
  EXPECT_EQ(s->routed, 1u);  // totals survive
}

TEST(LoadView, TrackedIdsAreBoundedOldestEvictedFirst) {
  load_view_options o;
  o.max_tracked = 3;
  load_view v = registered_pool(1, o);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(v.on_route("r" + std::to_string(i), 0, i).ok());
  EXPECT_EQ(v.tracked(), 3u);
  EXPECT_EQ(v.counters().tracked_evicted, 2u);
  EXPECT_EQ(loads(v)[0], 5u);  // forgetting an id does not touch the load
  EXPECT_FALSE(v.on_finished("r0", 10));
  EXPECT_FALSE(v.on_finished("r1", 10));
  EXPECT_TRUE(v.on_finished("r2", 10));
  EXPECT_TRUE(v.on_finished("r4", 10));
  EXPECT_EQ(loads(v)[0], 3u);
}

TEST(LoadView, TrackedIdsExpireAfterTheirTtl) {
  load_view_options o;
  o.tracked_ttl_ms = 100;
  load_view v = registered_pool(1, o);
  ASSERT_TRUE(v.on_route("a", 0, 0).ok());
  ASSERT_TRUE(v.on_route("b", 0, 50).ok());
  v.expire_tracked(100);  // age == ttl: kept
  EXPECT_EQ(v.tracked(), 2u);
  v.expire_tracked(101);
  EXPECT_EQ(v.tracked(), 1u);
  EXPECT_EQ(v.counters().tracked_expired, 1u);
  EXPECT_FALSE(v.on_finished("a", 102));
  EXPECT_TRUE(v.on_finished("b", 102));
  ASSERT_TRUE(v.on_route("c", 0, 200).ok());
  EXPECT_FALSE(v.on_finished("c", 301));  // expired by the finish call itself
  EXPECT_EQ(v.counters().tracked_expired, 2u);
  EXPECT_EQ(v.tracked(), 0u);
}

TEST(LoadView, ResizeKeepsSurvivorsAndNeutralisesRemovedSlots) {
  load_view v = registered_pool(3);
  ASSERT_TRUE(v.on_route("a", 0, 0).ok());
  ASSERT_TRUE(v.on_route("c", 2, 0).ok());
  ASSERT_TRUE(v.resize(2).ok());
  EXPECT_EQ(v.k(), 2u);
  EXPECT_EQ(v.load().size(), 2u);
  EXPECT_EQ(mask(v, 1), (std::vector<uint8_t>{1, 1}));
  ASSERT_TRUE(v.resize(4).ok());
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{1, 0, 0, 0}));
  EXPECT_EQ(mask(v, 1), (std::vector<uint8_t>{1, 1, 0, 0}));
  ASSERT_TRUE(v.register_worker(2, "again", 0, 1).ok());
  EXPECT_FALSE(v.on_finished("c", 2));  // routed to the removed slot 2, not this one
  EXPECT_TRUE(v.on_finished("a", 2));
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{0, 0, 0, 0}));
  EXPECT_FALSE(v.resize(0).ok());
}

TEST(LoadView, SnapshotsListEveryWorker) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = make_or_die(3, o);
  ASSERT_TRUE(v.register_worker(0, "tcp://a:1", 4, 0).ok());
  ASSERT_TRUE(v.register_worker(2, "tcp://c:1", 0, 50).ok());
  ASSERT_TRUE(v.on_route("x", 2, 60).ok());
  auto all = v.snapshot_all(120);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].index, 0u);
  EXPECT_EQ(all[0].endpoint, "tcp://a:1");
  EXPECT_EQ(all[0].state, worker_state::dead);
  EXPECT_EQ(all[0].last_report_age_ms, 120);
  EXPECT_EQ(all[1].state, worker_state::unregistered);
  EXPECT_EQ(all[1].endpoint, "");
  EXPECT_EQ(all[2].state, worker_state::active);
  EXPECT_EQ(all[2].load, 1u);
  EXPECT_EQ(all[2].last_report_age_ms, 70);
  EXPECT_FALSE(v.snapshot(3, 0).ok());
}

TEST(LoadView, RoutingSideCallsDoNotAllocate) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(8, o, /*capacity=*/4);
  ASSERT_TRUE(v.on_route("a", 3, 0).ok());
  (void)v.eligible(0);  // warm
  const uint64_t before = allocations.load();
  uint64_t sum = 0;
  for (int64_t now = 0; now < 300; now += 7) {
    sum += v.eligible(now)[3] + v.eligible_count(now) + v.load()[3];
    ASSERT_TRUE(
        v.on_report(static_cast<uint32_t>(now % 8), 1, static_cast<uint64_t>(now) + 1, now).ok());
    v.expire_tracked(now);
  }
  EXPECT_EQ(allocations.load(), before);
  EXPECT_GT(sum, 0u);
  (void)v.snapshot_all(300);  // the admin listing allocates: proves the counter counts
  EXPECT_GT(allocations.load(), before);
}

TEST(LoadView, FeedsRoutingPolicies) {
  load_view v = registered_pool(3);
  ASSERT_TRUE(v.on_route("a", 0, 0).ok());
  ASSERT_TRUE(v.drain(1).ok());
  policy_config c;
  c.workers = 3;
  auto jsq = make_policy("jsq", c);
  ASSERT_TRUE(jsq.ok());
  auto d = (*jsq)->route({nullptr, v.load(), v.eligible(0), -1});
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->worker, 2u);  // 0 is busier, 1 is drained
}

// A scrape of the worker's engine (vLLM's running + waiting) sets the load like a report, and the
// router's routes since the scrape was issued are added on top.
TEST(LoadView, ScrapeSetsTheBaseAndAddsRoutesSinceIssued) {
  load_view v = registered_pool(2);
  ASSERT_TRUE(v.on_route("a", 0, 10).ok());
  ASSERT_TRUE(v.on_route("b", 0, 20).ok());
  ASSERT_TRUE(v.on_route("c", 1, 25).ok());
  ASSERT_TRUE(v.on_route("d", 0, 30).ok());
  // Issued at 20: "b" and "d" (routed at 20 and 30) may be unseen by the engine; "a" was seen.
  ASSERT_TRUE(v.on_scrape(0, 7, 20, 40).ok());
  EXPECT_EQ(loads(v), (std::vector<uint32_t>{9, 1}));
  EXPECT_EQ(v.counters().scrapes, 1u);
  // A finished route counted on top is released as usual.
  EXPECT_TRUE(v.on_finished("d", 41));
  EXPECT_EQ(loads(v)[0], 8u);
  // A later scrape replaces the base whole: nothing since it was issued.
  ASSERT_TRUE(v.on_scrape(0, 2, 50, 55).ok());
  EXPECT_EQ(loads(v)[0], 2u);
  auto snap = v.snapshot(0, 60);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->last_scrape_age_ms, 5);
  EXPECT_EQ(snap->scrapes, 2u);
  EXPECT_EQ(v.snapshot(1, 60)->last_scrape_age_ms, -1);
}

TEST(LoadView, ScrapeIsAHeartbeatAndFailuresLetTheWorkerDie) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(2, o);
  ASSERT_TRUE(v.on_scrape(0, 0, 90, 100).ok());
  EXPECT_EQ(mask(v, 100), (std::vector<uint8_t>{1, 1}));
  // Worker 1 heard nothing since registration at 0; worker 0's last scrape was at 100.
  EXPECT_EQ(mask(v, 150), (std::vector<uint8_t>{1, 0}));
  // Failed scrapes are counted, never a heartbeat: worker 0 dies 100 ms after its last success.
  ASSERT_TRUE(v.on_scrape_failed(0).ok());
  ASSERT_TRUE(v.on_scrape_failed(0).ok());
  EXPECT_EQ(v.state(0, 200), worker_state::active);
  EXPECT_EQ(v.state(0, 201), worker_state::dead);
  EXPECT_EQ(v.counters().scrapes_failed, 2u);
  EXPECT_EQ(v.snapshot(0, 201)->scrapes_failed, 2u);
  // The next good scrape revives it.
  ASSERT_TRUE(v.on_scrape(0, 1, 300, 305).ok());
  EXPECT_EQ(v.state(0, 305), worker_state::active);
  EXPECT_FALSE(v.on_scrape_failed(2).ok());
}

// A load authority's vector (cluster.load_sharing = "authority") sets the load and, when the
// authority hears the worker, is a heartbeat; when it does not, the worker times out here too.
TEST(LoadView, SharedLoadSetsTheLoadAndIsAHeartbeatOnlyWhenAlive) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(2, o);
  ASSERT_TRUE(v.on_route("a", 0, 10).ok());
  ASSERT_TRUE(v.on_shared(0, 7, true, 90).ok());
  EXPECT_EQ(v.load()[0], 7u);
  ASSERT_TRUE(v.on_route("b", 0, 95).ok());
  EXPECT_EQ(v.load()[0], 8u);
  ASSERT_TRUE(v.on_shared(1, 3, false, 150).ok());
  EXPECT_EQ(v.load()[1], 3u);
  EXPECT_EQ(v.state(0, 150), worker_state::active);
  EXPECT_EQ(v.state(1, 150), worker_state::dead);
  EXPECT_EQ(v.counters().shared, 2u);
  EXPECT_FALSE(v.on_shared(2, 0, true, 150).ok());
}

// Peers' estimated decisions (cluster.peer_estimate): added to the load without an id or a
// heartbeat, counted, saturating, and replaced by the next shared load.
TEST(LoadView, AnEstimateAddsLoadUntilTheNextSharedLoadReplacesIt) {
  load_view_options o;
  o.report_timeout_ms = 100;
  load_view v = registered_pool(2, o);
  ASSERT_TRUE(v.on_shared(0, 4, true, 10).ok());
  ASSERT_TRUE(v.on_route("a", 0, 20).ok());
  ASSERT_TRUE(v.add_estimate(0, 2).ok());
  EXPECT_EQ(v.load()[0], 7u);
  EXPECT_EQ(v.counters().estimated, 2u);
  EXPECT_EQ(v.counters().routed, 1u);
  // Not a heartbeat: the worker last heard at 10 is dead at 150 whatever was estimated since.
  ASSERT_TRUE(v.add_estimate(0, 1).ok());
  EXPECT_EQ(v.state(0, 150), worker_state::dead);
  // The finished event of the tracked request takes one off; the estimate is not an id.
  EXPECT_TRUE(v.on_finished("a", 160));
  EXPECT_EQ(v.load()[0], 7u);
  ASSERT_TRUE(v.on_shared(0, 5, true, 170).ok());
  EXPECT_EQ(v.load()[0], 5u);
  ASSERT_TRUE(v.add_estimate(1, std::numeric_limits<uint32_t>::max()).ok());
  ASSERT_TRUE(v.add_estimate(1, 9).ok());
  EXPECT_EQ(v.load()[1], std::numeric_limits<uint32_t>::max());
  EXPECT_FALSE(v.add_estimate(2, 1).ok());
  ASSERT_TRUE(v.unregister_worker(1).ok());
  EXPECT_FALSE(v.add_estimate(1, 1).ok());
}

// An estimate never fills a worker: the capacity is checked against the load without it, so a
// guess about the peers steers the choice but cannot refuse a request.
TEST(LoadView, AnEstimateCountsForTheChoiceButNotAgainstTheCapacity) {
  load_view v = load_view::make(1).value();
  ASSERT_TRUE(v.register_worker(0, "w0", 8, 0).ok());
  ASSERT_TRUE(v.on_shared(0, 7, true, 1).ok());
  ASSERT_TRUE(v.add_estimate(0, 2).ok());
  EXPECT_EQ(v.load()[0], 9u);
  EXPECT_EQ(v.estimated(0), 2u);
  EXPECT_EQ(v.state(0, 1), worker_state::active);
  EXPECT_EQ(v.eligible_count(1), 1u);
  ASSERT_TRUE(v.on_route("a", 0, 2).ok());  // a real request: 8 counted
  EXPECT_EQ(v.state(0, 2), worker_state::full);
  EXPECT_EQ(v.eligible_count(2), 0u);
  // A shared load composed with an estimate (load_overlay): the same rule.
  ASSERT_TRUE(v.on_shared(0, 10, true, 3, 3).ok());
  EXPECT_EQ(v.estimated(0), 3u);
  EXPECT_EQ(v.state(0, 3), worker_state::active);
  // A report is a count: the estimate is gone.
  ASSERT_TRUE(v.on_report(0, 8, 1, 4).ok());
  EXPECT_EQ(v.estimated(0), 0u);
  EXPECT_EQ(v.state(0, 4), worker_state::full);
  // A finished request never leaves more estimated than load.
  ASSERT_TRUE(v.on_shared(0, 2, true, 5, 2).ok());
  EXPECT_TRUE(v.on_finished("a", 6));
  EXPECT_EQ(v.load()[0], 1u);
  EXPECT_EQ(v.estimated(0), 1u);
}

TEST(LoadView, ScrapeOfAnEarlierInstanceIsIgnored) {
  load_view v = registered_pool(1);
  ASSERT_TRUE(v.register_worker(0, "w0", 0, 50).ok());  // restarted at 50
  ASSERT_TRUE(v.on_route("x", 0, 60).ok());
  ASSERT_TRUE(v.on_scrape(0, 40, 45, 70).ok());  // issued before the restart
  EXPECT_EQ(loads(v)[0], 1u);
  EXPECT_EQ(v.counters().scrapes_stale, 1u);
  EXPECT_EQ(v.counters().scrapes, 0u);
  // Errors as on_report.
  EXPECT_FALSE(v.on_scrape(1, 0, 0, 0).ok());
  ASSERT_TRUE(v.unregister_worker(0).ok());
  EXPECT_EQ(v.on_scrape(0, 0, 80, 80).code(), status_code::failed_precondition);
}

TEST(LoadView, ScrapesAndReportsMix) {
  load_view v = registered_pool(1);
  ASSERT_TRUE(v.on_report(0, 5, 1, 10).ok());
  ASSERT_TRUE(v.on_scrape(0, 3, 15, 20).ok());
  EXPECT_EQ(loads(v)[0], 3u);
  ASSERT_TRUE(v.on_report(0, 4, 2, 30).ok());  // seq history untouched by the scrape
  EXPECT_EQ(loads(v)[0], 4u);
  EXPECT_EQ(v.counters().reports, 2u);
}

}  // namespace
}  // namespace eldr
