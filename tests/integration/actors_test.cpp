// The node's actors under CAF's deterministic testing scheduler: messages are delivered one by one
// when the test runs the scheduler, time is a variable the test advances, answers are recorded
// by a fake reply sink instead of going to sockets. Only the signature cache's RocksDB is real
// (hence the integration label).
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/admin_actor.hpp"
#include "actors/cluster/cluster_protocol.hpp"
#include "actors/load_monitor_actor.hpp"
#include "actors/node_metrics.hpp"
#include "actors/refit_actor.hpp"
#include "actors/router/router_actor.hpp"
#include "actors/sigcache/sigcache_actor.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/membership/shard_plan.hpp"
#include "tests/support/actor_testing.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/toy_model.hpp"

namespace eldr {
namespace {

centroid_file toy_centroids(uint32_t rotate, signature_transform t = signature_transform::count) {
  return testing::toy_centroids("toy", testing::toy_workers, rotate, t);
}

route_request request_for(const std::string& id, uint32_t domain, uint64_t hash) {
  return testing::toy_request(id, "toy", domain, {hash});
}

class ActorsTest : public ::testing::Test, protected testing::actor_fixture {
 protected:
  ActorsTest() : actor_fixture("eldr-actors") {
    node_config c = default_node_config();
    c.data_dir = dir_.path();
    c.models[0].name = "toy";
    c.models[0].workers = 4;
    c.models[0].widen_single = false;
    c.models[0].worker_timeout_ms = 1000;
    auto ctx = make_context(c);
    metrics_ = ctx->metrics;
    auto caches = open_model_caches(c);
    EXPECT_TRUE(caches.ok());
    sigcache_ = spawn_sigcache(sys_, ctx, std::move(*caches), /*detached=*/false);
    router_ = spawn_router(sys_, ctx, sigcache_, std::vector<router_model_init>(1));
    monitor_ = spawn_load_monitor(sys_, ctx, router_, sigcache_);
    refit_ = spawn_refit(sys_, ctx, router_, /*detached=*/false);
    admin_ = spawn_admin(sys_, ctx, router_, sigcache_, refit_);
    sched_.run();
  }
  ~ActorsTest() override {
    for (auto* a : {&admin_, &refit_, &monitor_, &router_, &sigcache_})
      caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    sched_.run();
  }

  void admin(const std::string& command, nlohmann::json args) {
    auto job = std::make_shared<const admin_job>(
        admin_job{{frontend_channel::admin, "op", false}, {"a", command, std::move(args)}});
    caf::anon_send(admin_, admin_atom::value, admin_job_ptr(job));
  }
  void route(route_request r) {
    auto job = std::make_shared<const route_job>(
        route_job{{frontend_channel::route, "prefill", false}, std::move(r), 0, 0});
    caf::anon_send(router_, route_atom::value, route_job_ptr(job));
  }
  void worker(worker_message m) {
    auto job = std::make_shared<const worker_job>(
        worker_job{{frontend_channel::worker, "decode", false}, std::move(m)});
    caf::anon_send(monitor_, worker_atom::value, worker_job_ptr(job));
  }
  void register_all() {
    for (uint32_t w = 0; w < 4; ++w)
      worker(worker_register{"", "toy", w, "tcp://w" + std::to_string(w), 0, ""});
    sched_.run();
    sink_.take();
  }
  // Route replies recorded since the last call, in the order they were sent.
  std::vector<route_reply> route_replies() {
    std::vector<route_reply> out;
    for (auto& [to, bytes] : sink_.take()) {
      if (to.channel != frontend_channel::route) continue;
      auto r = decode_route_reply(bytes, {});
      EXPECT_TRUE(r.ok()) << "not a route_reply";
      if (r.ok()) out.push_back(*r);
    }
    return out;
  }
  admin_reply last_admin_reply() {
    admin_reply out;
    for (auto& [to, bytes] : sink_.take())
      if (to.channel == frontend_channel::admin) out = *decode_admin_reply(bytes, {});
    return out;
  }
  void import(const centroid_file& f) {
    admin("centroids.import",
          {{"model", "toy"}, {"file", nlohmann::json::binary(encode_centroid_file(f))}});
  }

  caf::actor sigcache_, router_, monitor_, refit_, admin_;
  std::shared_ptr<node_metrics> metrics_;
};

TEST_F(ActorsTest, EachDecisionSeesOneSetAndItsEpoch) {
  register_all();
  import(toy_centroids(0));
  sched_.run();
  ASSERT_TRUE(last_admin_reply().ok);
  // Requests of all four domains interleaved with a swap to a rotated set (worker w serves
  // domain (w + 1) % 4 under epoch 2): every decision must match the set of the epoch it reports.
  for (uint32_t i = 0; i < 8; ++i)
    route(request_for("a" + std::to_string(i), i % 4, 100 + i));
  import(toy_centroids(1));
  for (uint32_t i = 0; i < 8; ++i)
    route(request_for("b" + std::to_string(i), i % 4, 200 + i));
  sched_.run();
  route(request_for("after", 1, 300));
  sched_.run();
  const auto replies = route_replies();
  ASSERT_EQ(replies.size(), 17u);
  uint64_t last_epoch = 0;
  for (const auto& r : replies) {
    const uint32_t domain =
        r.id == "after" ? 1 : static_cast<uint32_t>(std::stoul(r.id.substr(1))) % 4;
    ASSERT_TRUE(r.epoch == 1 || r.epoch == 2) << r.id;
    EXPECT_EQ(r.worker, r.epoch == 1 ? domain : (domain + 3) % 4) << r.id << " epoch " << r.epoch;
    EXPECT_GE(r.epoch, last_epoch) << "epochs went back at " << r.id;
    last_epoch = r.epoch;
  }
  EXPECT_EQ(replies.back().epoch, 2u);
}

TEST_F(ActorsTest, ASwapWithANewSpecReSignsTheRequestsInFlight) {
  register_all();
  import(toy_centroids(0));
  sched_.run();
  last_admin_reply();
  // The router asks the cache to store a set with a new spec (admin, then router, one message
  // each), then a request arrives and is signed under the old spec; the install lands between
  // its signature and its decision, so the request is signed again under the new spec.
  import(toy_centroids(0, signature_transform::binary));
  sched_.run_once();  // admin forwards the import
  sched_.run_once();  // router asks the cache to store it
  route(request_for("r", 2, 21));
  sched_.run();
  const auto replies = route_replies();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].epoch, 2u);
  EXPECT_EQ(replies[0].worker, 2u);
  admin("status", nlohmann::json::object());
  sched_.run();
  const auto status = last_admin_reply();
  ASSERT_TRUE(status.ok);
  EXPECT_EQ(status.result["models"][0]["resigned_after_swap"], 1);
}

// The one rule for member lists (cluster_protocol.hpp, "Trust"): the four actors that take them
// accept one from an actor of this node and count and drop any other (here anonymous: a peer's
// message is not local either).
TEST_F(ActorsTest, MemberListsAreTakenFromThisNodeOnlyAndOthersAreCounted) {
  const auto untrusted = [this] {
    const std::string text = metrics_->render();
    const std::string name = "eldr_cluster_events_total{event=\"untrusted\"} ";
    const size_t at = text.find(name);
    return at == std::string::npos
               ? std::string("0")
               : text.substr(at + name.size(), text.find('\n', at) - at - name.size());
  };
  const std::vector<member_info> none;
  caf::scoped_actor local{sys_};
  for (const auto* a : {&router_, &monitor_, &sigcache_, &refit_})
    local->send(*a, members_atom::value, none, uint32_t{1});
  sched_.run();
  EXPECT_EQ(untrusted(), "0");
  for (const auto* a : {&router_, &monitor_, &sigcache_, &refit_})
    caf::anon_send(*a, members_atom::value, none, uint32_t{1});
  sched_.run();
  EXPECT_EQ(untrusted(), "4");
}

TEST_F(ActorsTest, SilentWorkersTimeOutOnTheInjectedClock) {
  register_all();
  import(toy_centroids(0));
  sched_.run();
  last_admin_reply();
  now_ += 900;
  for (uint32_t w : {0u, 1u, 2u})
    worker(load_report{"", "toy", w, 0, 0, 0, 0.0f, 1});
  sched_.run();
  sink_.take();
  now_ += 200;  // worker 3: 1100 ms silent > 1000 ms
  route(request_for("x", 3, 31));
  sched_.run();
  auto replies = route_replies();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_NE(replies[0].worker, 3u);
  worker(load_report{"", "toy", 3, 0, 0, 0, 0.0f, 1});
  route(request_for("y", 3, 32));
  sched_.run();
  replies = route_replies();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].worker, 3u);
}

TEST_F(ActorsTest, RejectedRefitKeepsTheCurrentSet) {
  register_all();
  import(toy_centroids(0));
  sched_.run();
  last_admin_reply();
  // Default min_sample (256) is far above the 8 signatures seen.
  for (uint32_t i = 0; i < 8; ++i)
    route(request_for("s" + std::to_string(i), i % 4, 100 + i));
  sched_.run();
  route_replies();
  admin("refit", {{"model", "toy"}});
  sched_.run();
  const auto r = last_admin_reply();
  ASSERT_TRUE(r.ok);
  EXPECT_FALSE(r.result["accepted"].get<bool>());
  admin("centroids.show", {{"model", "toy"}});
  sched_.run();
  EXPECT_EQ(last_admin_reply().result["epoch"], 1);
}

// The refit's sample holds what the router routed, and reaches back the configured horizon
// (automatic here: 8 x the default sample_size).
TEST_F(ActorsTest, StatusShowsTheRefitSampleAndItsHorizon) {
  register_all();
  import(toy_centroids(0));
  sched_.run();
  last_admin_reply();
  for (uint32_t i = 0; i < 8; ++i)
    route(request_for("h" + std::to_string(i), i % 4, 200 + i));
  sched_.run();
  route_replies();
  admin("status", nlohmann::json::object());
  sched_.run();
  const auto status = last_admin_reply();
  ASSERT_TRUE(status.ok);
  EXPECT_EQ(status.result["models"][0]["sample"], 8);
  EXPECT_EQ(status.result["models"][0]["sample_horizon"], 8 * model_config{}.sample_size);
}

TEST_F(ActorsTest, UnknownModelsAndCommandsAreAnswered) {
  auto r = request_for("u", 0, 1);
  r.model = "other";
  route(r);
  admin("frobnicate", nlohmann::json::object());
  worker(worker_register{"", "other", 0, "tcp://x", 0, ""});
  sched_.run();
  int errors = 0;
  for (auto& [to, bytes] : sink_.take()) {
    if (to.channel == frontend_channel::admin) {
      auto a = decode_admin_reply(bytes, {});
      ASSERT_TRUE(a.ok());
      EXPECT_FALSE(a->ok);
      EXPECT_EQ(a->code, wire_error_code::unknown_type);
    } else {
      auto e = decode_error_reply(bytes, {});
      ASSERT_TRUE(e.ok());
      EXPECT_EQ(e->code, wire_error_code::unknown_model);
    }
    ++errors;
  }
  EXPECT_EQ(errors, 3);
}

// A signature-cache shard answers for the layers asked (those its store keeps), packed; with no
// layers, coverage only. The same for a remote router's request and this node's own (by pointer).
// The signature cache's commit tick (sigcache_actor.cpp): an idle cache ticks every
// metrics_refresh_ms (250 ms), not every commit_interval_ms (a fixed 10 ms tick woke every idle
// node 100 times a second); staged counts are committed at once after a quiet spell, and changes
// close together share one commit at most commit_interval_ms after the last.
TEST_F(ActorsTest, TheCommitTickRunsWhenCountsAreStagedAndSlowlyWhenIdle) {
  auto stats = [this] {
    nlohmann::json out;
    sys_.spawn([&out, this](caf::event_based_actor* self) {
      self->request(sigcache_, caf::infinite, cache_stats_atom::value)
          .then([&out](const std::string& s) { out = nlohmann::json::parse(s)[0]; });
    });
    sched_.run();
    return std::pair<uint64_t, uint64_t>(out.at("commit_ticks"), out.at("staged_commits"));
  };
  // Both clocks (the context's and CAF's timers) move one millisecond at a time.
  auto advance = [this](int ms) {
    for (int i = 0; i < ms; ++i) {
      now_ += 1;
      sched_.advance_time(std::chrono::milliseconds(1));
      sched_.run();
    }
  };
  advance(1000);
  const auto [ticks0, staged0] = stats();
  advance(1000);
  const auto [ticks1, staged1] = stats();
  EXPECT_EQ(staged1, staged0);
  EXPECT_GE(ticks1 - ticks0, 3u);  // health and metrics stay 250 ms fresh
  EXPECT_LE(ticks1 - ticks0, 5u);  // the fixed tick: 100

  route(request_for("a", 2, 77));  // signing stages the request's counts
  sched_.run();
  EXPECT_EQ(stats().second, staged1 + 1);  // at once: no time passed
  advance(3);
  route(request_for("b", 2, 78));
  sched_.run();
  EXPECT_EQ(stats().second, staged1 + 1);  // 3 ms after a commit: it waits
  advance(6);
  route(request_for("c", 2, 79));
  sched_.run();
  EXPECT_EQ(stats().second, staged1 + 1);
  advance(1);  // 10 ms after the first commit: "b" and "c" share one
  EXPECT_EQ(stats().second, staged1 + 2);
  advance(100);
  EXPECT_EQ(stats().second, staged1 + 2);
}

TEST_F(ActorsTest, AShardSumsOnlyTheLayersAskedForThatItKeeps) {
  // Store one block's counts (domain 2: experts 4 and 5, 4 tokens, in both layers).
  route(request_for("store", 2, 77));
  sched_.run();
  sink_.take();
  std::vector<shard_sign_reply> replies;
  auto ask = [&](caf::message msg) {
    sys_.spawn([&replies, msg, this](caf::event_based_actor* self) {
      self->request(sigcache_, caf::infinite, msg).then([&replies](const shard_sign_reply& r) {
        replies.push_back(r);
      });
    });
    sched_.run();
  };
  shard_sign_request req;
  req.model = "toy";
  req.blocks = {77, 78};  // 78 is unknown
  req.layers = {1, 5};    // the store has no layer 5
  ask(caf::make_message(shard_sign_atom::value, req));
  req.layers.clear();
  ask(caf::make_message(shard_sign_atom::value, req));
  auto job = std::make_shared<shard_job>();
  job->model = 0;
  job->layers = {0, 1};
  job->blocks = {77};
  ask(caf::make_message(sign_atom::value, shard_job_ptr(job)));
  ASSERT_EQ(replies.size(), 3u);

  std::vector<uint32_t> sums;
  EXPECT_EQ(replies[0].covered, 1u);
  EXPECT_EQ(replies[0].experts, 8u);
  EXPECT_EQ(replies[0].layer_mask, (std::vector<uint32_t>{1}));
  EXPECT_EQ(replies[0].value_bytes, 2);
  ASSERT_TRUE(unpack_sums(replies[0].sums, replies[0].value_bytes, sums));
  EXPECT_EQ(sums, (std::vector<uint32_t>{0, 0, 0, 0, 4, 4, 0, 0}));

  EXPECT_EQ(replies[1].covered, 1u);  // coverage only
  EXPECT_TRUE(replies[1].sums.empty());

  EXPECT_EQ(replies[2].covered, 1u);
  EXPECT_EQ(replies[2].layer_mask, (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(unpack_sums(replies[2].sums, replies[2].value_bytes, sums));
  EXPECT_EQ(sums, (std::vector<uint32_t>{0, 0, 0, 0, 4, 4, 0, 0, 0, 0, 0, 0, 4, 4, 0, 0}));
}

}  // namespace
}  // namespace eldr
