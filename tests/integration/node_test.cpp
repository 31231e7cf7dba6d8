// eldr-node end to end: real node processes on loopback ports chosen at run time, driven through
// the C++ client library (route, worker and admin protocols).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "cluster/zmq/client.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/node_fixture.hpp"
#include "tests/support/toy_model.hpp"

namespace eldr {
namespace {

// The toy pool routes by locality alone: no widening of a one-worker band (the artifact's
// recipe widens it to the top two, which would make the expected worker depend on loads).
const model_geometry& toy = testing::toy_geometry;
constexpr uint32_t toy_k = testing::toy_workers;

centroid_file toy_centroids(uint32_t rotate = 0) {
  return testing::toy_centroids("toy", toy_k, rotate);
}

route_request request_for(const std::string& id, uint32_t w, std::vector<uint64_t> blocks,
                          bool send_counts) {
  return testing::toy_request(id, "toy", w, std::move(blocks), send_counts);
}

std::vector<uint8_t> as_bytes(const centroid_file& f) {
  return encode_centroid_file(f);
}

const char* toy_model_toml =
    "[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 600000\nmin_sample = 16\n"
    "sample_size = 256\nwiden_single = false\n";

class NodeTest : public testing::node_fixture {
 protected:
  NodeTest() : node_fixture("eldr-node-test") {}

  void start(const std::string& models = toy_model_toml, const std::string& extra = "") {
    start_node(models, extra);
  }

  void register_workers(uint32_t k = toy_k) { node_fixture::register_workers("toy", k); }

  // The paper's band instead of the default eldr-adaptive, for tests whose subject (the load
  // view, a refit's alignment) shows in that rule's decisions: a request goes to its home worker
  // however loaded.
  void use_paper_band() {
    auto r = admin_->call("policy", {{"model", "toy"}, {"policy", "eldr"}});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }

  uint64_t import(const centroid_file& f) {
    auto r = admin_->call("centroids.import",
                          {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(f))}});
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? r->value("epoch", uint64_t{0}) : 0;
  }
};

TEST_F(NodeTest, StatusReportsRolesEndpointsAndModels) {
  start();
  auto s = admin_->call("status");
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ((*s)["node"]["roles"].size(), 4u);
  EXPECT_EQ((*s)["endpoints"]["route"], node_->route());
  ASSERT_EQ((*s)["models"].size(), 1u);
  EXPECT_EQ((*s)["models"][0]["name"], "toy");
  EXPECT_EQ((*s)["models"][0]["k"], toy_k);
  EXPECT_EQ((*s)["models"][0]["epoch"], 0);
}

TEST_F(NodeTest, RoutesByLocalityWithCountsAndThenFromTheCache) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  for (uint32_t w = 0; w < toy_k; ++w) {
    auto req = request_for("first-" + std::to_string(w), w, {100 + w * 10, 101 + w * 10}, true);
    req.explain = true;
    const auto r = must_route(req);
    EXPECT_EQ(r.worker, w);
    EXPECT_EQ(r.epoch, 1u);
    EXPECT_EQ(r.covered_blocks, 2u);
    EXPECT_EQ(r.total_blocks, 2u);
    EXPECT_EQ(r.endpoint, "tcp://10.0.0." + std::to_string(w) + ":9");
    ASSERT_TRUE(r.explain.has_value());
    EXPECT_EQ(r.explain->policy, "eldr-adaptive");  // the default for models with centroids
  }
  // The same prompts again without counts (prefix hits on the prefill side): the signature comes
  // from the cache, so the decision and the coverage are the same. Tau 0.1 and equal loads (each
  // worker holds one request) keep each request on its home worker.
  for (uint32_t w = 0; w < toy_k; ++w) {
    const auto r = must_route(
        request_for("again-" + std::to_string(w), w, {100 + w * 10, 101 + w * 10}, false));
    EXPECT_EQ(r.worker, w);
    EXPECT_EQ(r.covered_blocks, 2u);
  }
  // Unknown blocks: still routed (by load), coverage 0.
  const auto unknown = must_route(request_for("unknown", 0, {999999}, false));
  EXPECT_EQ(unknown.covered_blocks, 0u);
  EXPECT_EQ(unknown.total_blocks, 1u);
  // explain reproduces a decision.
  auto ex = admin_->call("explain", {{"model", "toy"}, {"request", "first-2"}});
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  EXPECT_EQ((*ex)["worker"], 2);
  EXPECT_EQ((*ex)["policy"], "eldr-adaptive");
  EXPECT_EQ((*ex)["epoch"], 1);
}

TEST_F(NodeTest, FinishedEventsAndLoadReportsDriveTheLoadView) {
  start();
  register_workers();
  use_paper_band();
  EXPECT_EQ(import(toy_centroids()), 1u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(must_route(request_for("r" + std::to_string(i), 1, {500u + i}, true)).worker, 1u)
        << "without widening, worker 1 is the band's only member";
  auto workers = admin_->call("workers", {{"model", "toy"}});
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ((*workers)[1]["load"], 3);
  // Finished once per id: the duplicate changes nothing.
  auto f = worker_->call(finished_requests{"", "toy", 1, {"r0", "r1", "r0"}});
  ASSERT_TRUE(f.ok());
  workers = admin_->call("workers", {{"model", "toy"}});
  EXPECT_EQ((*workers)[1]["load"], 1);
  // The worker's own report is authoritative.
  ASSERT_TRUE(worker_->call(load_report{"", "toy", 1, 7, 7, 0, 0.5f, 1}).ok());
  workers = admin_->call("workers", {{"model", "toy"}});
  EXPECT_EQ((*workers)[1]["load"], 7);
  // An older report is ignored.
  ASSERT_TRUE(worker_->call(load_report{"", "toy", 1, 0, 0, 0, 0.0f, 1}).ok());
  workers = admin_->call("workers", {{"model", "toy"}});
  EXPECT_EQ((*workers)[1]["load"], 7);
}

TEST_F(NodeTest, DrainedWorkersGetNoRequestsUntilUndrained) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  auto d = admin_->call("drain", {{"model", "toy"}, {"worker", 2}});
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ((*d)["state"], "draining");
  for (int i = 0; i < 8; ++i)
    EXPECT_NE(must_route(request_for("d" + std::to_string(i), 2, {700u + i}, true)).worker, 2u);
  // A worker may drain itself too; undrain brings it back.
  ASSERT_TRUE(admin_->call("undrain", {{"model", "toy"}, {"worker", 2}}).ok());
  auto self_drain = worker_->call(worker_drain{"", "toy", 3, true});
  ASSERT_TRUE(self_drain.ok());
  EXPECT_EQ(std::get<worker_ack>(*self_drain).state, "draining");
  EXPECT_EQ(must_route(request_for("back", 2, {800}, true)).worker, 2u);
}

TEST_F(NodeTest, SilentWorkerLeavesTheCandidateSetAndReturnsWhenItReports) {
  start("[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 200\nwiden_single = false\n");
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  // Workers 0, 1, 3 keep reporting; worker 2 falls silent. Poll the node's view (bounded) rather
  // than assume how long the timeout takes to show.
  uint64_t seq = 1;
  bool dead = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!dead && std::chrono::steady_clock::now() < deadline) {
    ++seq;
    for (uint32_t w : {0u, 1u, 3u})
      ASSERT_TRUE(worker_->call(load_report{"", "toy", w, 0, 0, 0, 0.0f, seq}).ok());
    auto ws = admin_->call("workers", {{"model", "toy"}});
    ASSERT_TRUE(ws.ok());
    dead = (*ws)[2]["state"] == "dead";
  }
  ASSERT_TRUE(dead) << "worker 2 never timed out";
  EXPECT_NE(must_route(request_for("t1", 2, {900}, true)).worker, 2u);
  ASSERT_TRUE(worker_->call(load_report{"", "toy", 2, 0, 0, 0, 0.0f, 1}).ok());
  EXPECT_EQ(must_route(request_for("t2", 2, {901}, true)).worker, 2u);
}

TEST_F(NodeTest, InvalidCentroidImportsAreRefusedAndChangeNothing) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  // Not a centroid file at all.
  auto bad = admin_->call("centroids.import",
                          {{"model", "toy"}, {"file", nlohmann::json::binary({1, 2, 3})}});
  EXPECT_FALSE(bad.ok());
  // A valid file with the wrong K for the pool.
  auto wrong_k = toy_centroids();
  wrong_k.workers = 3;
  wrong_k.centroids.resize(3 * 16);
  auto refused = admin_->call(
      "centroids.import", {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(wrong_k))}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("decode workers"), std::string::npos)
      << refused.error().message();
  auto show = admin_->call("centroids.show", {{"model", "toy"}});
  ASSERT_TRUE(show.ok());
  EXPECT_EQ((*show)["epoch"], 1);
  EXPECT_EQ((*show)["history"].size(), 1u);
}

TEST_F(NodeTest, SwapRollbackAndExportKeepEpochsMonotonic) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  EXPECT_EQ(import(toy_centroids(1)), 2u);  // worker w now serves home (w + 1) % 4
  EXPECT_EQ(must_route(request_for("s1", 1, {1000}, true)).worker, 0u);
  auto rb = admin_->call("centroids.rollback", {{"model", "toy"}});
  ASSERT_TRUE(rb.ok()) << rb.error().to_string();
  EXPECT_EQ((*rb)["epoch"], 1);
  const auto r = must_route(request_for("s2", 1, {1001}, true));
  EXPECT_EQ(r.worker, 1u);
  EXPECT_EQ(r.epoch, 1u);
  auto sw = admin_->call("centroids.swap", {{"model", "toy"}, {"epoch", 2}});
  ASSERT_TRUE(sw.ok()) << sw.error().to_string();
  EXPECT_EQ(must_route(request_for("s3", 1, {1002}, true)).epoch, 2u);
  auto ex = admin_->call("centroids.export", {{"model", "toy"}, {"epoch", 1}});
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE(ex->is_binary());
  auto parsed = parse_centroid_file(ex->get_binary(), "export");
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  EXPECT_EQ(parsed->epoch, 1u);
  EXPECT_EQ(parsed->centroids.size(), toy_centroids().centroids.size());
  EXPECT_FALSE(admin_->call("centroids.swap", {{"model", "toy"}, {"epoch", 99}}).ok());
}

// Issue 16: "rollback" meant "a lower epoch number" -- after `swap 1` from 2 it said there was
// nothing older. It now undoes the newest change of the current set, walking back one change at a
// time, and the history survives a restart.
TEST_F(NodeTest, RollbackUndoesTheNewestChangeAcrossARestart) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  EXPECT_EQ(import(toy_centroids(1)), 2u);
  auto sw = admin_->call("centroids.swap", {{"model", "toy"}, {"epoch", 1}});
  ASSERT_TRUE(sw.ok()) << sw.error().to_string();
  EXPECT_EQ((*sw)["from_epoch"], 2);
  auto show = admin_->call("centroids.show", {{"model", "toy"}});
  ASSERT_TRUE(show.ok());
  ASSERT_EQ((*show)["changes"].size(), 3u) << show->dump();
  EXPECT_EQ((*show)["changes"][2]["cause"], "swap") << show->dump();
  EXPECT_EQ(must_route(request_for("h1", 1, {1100}, true)).epoch, 1u);
  EXPECT_EQ(node_->stop(), 0);
  start();
  register_workers();
  auto rb = admin_->call("centroids.rollback", {{"model", "toy"}});
  ASSERT_TRUE(rb.ok()) << rb.error().to_string();
  EXPECT_EQ((*rb)["epoch"], 2) << "the rollback should undo the swap to 1";
  auto r = must_route(request_for("h2", 1, {1101}, true));
  EXPECT_EQ(r.epoch, 2u);
  EXPECT_EQ(r.worker, 0u);  // epoch 2: worker w serves home (w + 1) % 4
  rb = admin_->call("centroids.rollback", {{"model", "toy"}});
  ASSERT_TRUE(rb.ok()) << rb.error().to_string();
  EXPECT_EQ((*rb)["epoch"], 1) << "the next rollback undoes the import of 2";
  rb = admin_->call("centroids.rollback", {{"model", "toy"}});
  ASSERT_FALSE(rb.ok());
  EXPECT_NE(rb.error().message().find("nothing to undo"), std::string::npos)
      << rb.error().message();
  EXPECT_EQ(must_route(request_for("h3", 1, {1102}, true)).epoch, 1u);
}

TEST_F(NodeTest, HotSwapUnderLoadFailsNoDecisionAndNeverGoesBack) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  // A second client keeps a window of requests in flight while the swap happens.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, failed{0}, went_back{0}, epoch2{0};
  std::thread load([&] {
    auto connected = route_client::connect(node_->route());
    if (!connected.ok()) return;
    auto client = std::move(*connected);
    uint64_t sent = 0, last_epoch = 0;
    auto send_one = [&] {
      auto req = request_for("h" + std::to_string(sent), sent % toy_k, {2000 + sent % 64}, true);
      ++sent;
      return client->send(req).ok();
    };
    for (int i = 0; i < 32; ++i)
      send_one();
    while (!stop.load() || ok.load() + failed.load() < sent) {
      auto r = client->receive(5000);
      if (!r.ok()) {
        failed += sent - ok.load() - failed.load();
        break;
      }
      if (auto* rep = std::get_if<route_reply>(&*r)) {
        ++ok;
        // Replies come in the order the router decided, so epochs never go back.
        if (rep->epoch < last_epoch) ++went_back;
        last_epoch = rep->epoch;
        if (rep->epoch == 2) ++epoch2;
      } else {
        ++failed;
      }
      if (!stop.load()) send_one();
    }
  });
  // Let some traffic flow on epoch 1 first (bounded wait on observed progress).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ok.load() < 200 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(import(toy_centroids(1)), 2u);
  const uint64_t at_swap = ok.load();
  while (ok.load() < at_swap + 200 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  stop = true;
  load.join();
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_EQ(went_back.load(), 0u);
  EXPECT_GT(epoch2.load(), 100u);
}

TEST_F(NodeTest, RefitIsRejectedOnATooSmallSampleOrWithoutGainAndAcceptedWhenItImproves) {
  start();
  register_workers();
  use_paper_band();
  EXPECT_EQ(import(toy_centroids()), 1u);
  auto early = admin_->call("refit", {{"model", "toy"}});
  ASSERT_TRUE(early.ok()) << early.error().to_string();
  EXPECT_FALSE((*early)["accepted"].get<bool>());
  EXPECT_NE((*early)["reason"].get<std::string>().find("sample too small"), std::string::npos);
  // Live traffic from the four domains; requests finish so loads stay even.
  for (uint32_t i = 0; i < 64; ++i) {
    const uint32_t w = i % toy_k;
    const auto id = "live" + std::to_string(i);
    must_route(request_for(id, w, {3000u + i}, true));
    ASSERT_TRUE(worker_->call(finished_requests{"", "toy", w, {id}}).ok());
  }
  // The fit finds the current set's grouping again: the same score is no improvement, and no new
  // epoch is made for it (issue 12: it was accepted as epoch 2).
  auto same = admin_->call("refit", {{"model", "toy"}});
  ASSERT_TRUE(same.ok()) << same.error().to_string();
  EXPECT_FALSE((*same)["accepted"].get<bool>()) << same->dump();
  EXPECT_NE((*same)["reason"].get<std::string>().find("distinct-expert score not better"),
            std::string::npos)
      << same->dump();
  EXPECT_EQ(must_route(request_for("still-1", 1, {3500u}, true)).epoch, 1u);

  // A set that lumps domains 1 and 2 together on worker 1 (worker 2's centroid ties for domain 2
  // and loses to the lower index): batches on worker 1 mix two domains. The refit undoes that.
  centroid_file lumped = toy_centroids();
  std::fill(lumped.centroids.begin(), lumped.centroids.end(), 0.0f);
  const float spread = 1.0f / std::sqrt(8.0f);
  const std::vector<std::vector<uint32_t>> homes = {{0}, {1, 2}, {2, 3}, {3}};
  for (uint32_t w = 0; w < toy_k; ++w)
    for (uint32_t d : homes[w])
      for (uint32_t l = 0; l < toy.layers; ++l)
        for (uint32_t e : {2 * d, 2 * d + 1})
          lumped.centroids[w * 16 + l * 8 + e] = homes[w].size() == 1 ? 0.5f : spread;
  EXPECT_EQ(import(lumped), 2u);
  auto refit = admin_->call("refit", {{"model", "toy"}});
  ASSERT_TRUE(refit.ok()) << refit.error().to_string();
  EXPECT_TRUE((*refit)["accepted"].get<bool>()) << refit->dump();
  EXPECT_EQ((*refit)["epoch"], 3);
  // Aligned to the workers: each domain goes to its home worker under epoch 3.
  for (uint32_t w = 0; w < toy_k; ++w) {
    const auto r = must_route(request_for("post" + std::to_string(w), w, {4000u + w}, true));
    EXPECT_EQ(r.epoch, 3u);
    EXPECT_EQ(r.worker, w);
  }
}

TEST_F(NodeTest, RestartWithTheSameDataDirectoryIsWarm) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids(1)), 1u);
  EXPECT_EQ(must_route(request_for("before", 2, {5000, 5001}, true)).worker, 1u);
  EXPECT_EQ(node_->stop(), 0);
  start();
  register_workers();
  auto show = admin_->call("centroids.show", {{"model", "toy"}});
  ASSERT_TRUE(show.ok());
  EXPECT_EQ((*show)["epoch"], 1);
  // Same blocks, no counts: the signature comes from the persisted cache.
  const auto r = must_route(request_for("after", 2, {5000, 5001}, false));
  EXPECT_EQ(r.covered_blocks, 2u);
  EXPECT_EQ(r.worker, 1u);
  EXPECT_EQ(r.epoch, 1u);
}

nlohmann::json toy_status(admin_client& admin) {
  auto s = admin.call("status");
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return s.ok() ? (*s)["models"][0] : nlohmann::json();
}

// The router runs core's policies by name: with the same load and the same request, the paper's
// band ("eldr") queues the request on its busy home worker, and "eldr-adaptive" (the default)
// sends it to an idle worker, since the lightest load is 0 and so its slack is 0. The toy's
// centroids are orthogonal: a request of home 0 scores 0 on workers 1-3, which then tie on load
// and recency, and the lowest index, worker 1, wins.
TEST_F(NodeTest, RoutesWithTheAdaptiveBandByDefaultAndTheBandWhenSetToEldr) {
  start();
  register_workers();
  EXPECT_EQ(toy_status(*admin_)["policy"], "eldr-adaptive");
  EXPECT_EQ(import(toy_centroids()), 1u);
  // Two requests of home 0 on an idle pool: the first goes home, the second to an idle worker.
  EXPECT_EQ(must_route(request_for("a", 0, {100, 101}, true)).worker, 0u);
  auto second = request_for("b", 0, {100, 101}, false);
  second.explain = true;
  const auto r = must_route(second);
  EXPECT_EQ(r.worker, 1u);
  ASSERT_TRUE(r.explain.has_value());
  EXPECT_EQ(r.explain->policy, "eldr-adaptive");
  // Loads are now {1, 1, 0, 0}. The paper's band (tau 0.1, widen_single off in the toy config)
  // holds worker 0 alone and routes there although two workers idle.
  auto set = admin_->call("policy", {{"model", "toy"}, {"policy", "eldr"}});
  ASSERT_TRUE(set.ok()) << set.error().to_string();
  auto third = request_for("c", 0, {100, 101}, false);
  third.explain = true;
  const auto e = must_route(third);
  EXPECT_EQ(e.worker, 0u);
  ASSERT_TRUE(e.explain.has_value());
  EXPECT_EQ(e.explain->policy, "eldr");
  EXPECT_EQ(e.fallback, "");  // decided by locality, not a fallback
  // Back to the adaptive band: loads {2, 1, 0, 0}, an idle worker (2) wins again.
  ASSERT_TRUE(admin_->call("policy", {{"model", "toy"}, {"policy", "eldr-adaptive"}}).ok());
  EXPECT_EQ(must_route(request_for("d", 0, {100, 101}, false)).worker, 2u);
}

// Issue 12: counts of another geometry were dropped, the request routed by load with a reply that
// looked normal, nothing logged, counts_geometry 0. Now: a warning in the reply (the C++ client
// hands it to its callback), fallback named, counted under counts_geometry.
TEST_F(NodeTest, CountsOfAnotherGeometryAreAnsweredWithAWarningAndCounted) {
  start();
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  client_options co;
  std::vector<route_reply> warned;
  co.on_route_warning = [&](const route_reply& r) { warned.push_back(r); };
  auto client = route_client::connect(node_->route(), co);
  ASSERT_TRUE(client.ok());
  // A prefill worker of another model: 2 layers, 16 experts, top-2.
  const model_geometry other{2, 16, 2};
  route_request req;
  req.id = "wrong-geometry";
  req.model = "toy";
  req.block_hashes = {7001, 7002};
  counts_message c;
  c.geometry = other;
  std::vector<expert_id> ids;
  for (int t = 0; t < 4; ++t)
    for (uint32_t l = 0; l < other.layers; ++l)
      for (expert_id e : {expert_id{12}, expert_id{13}})
        ids.push_back(e);
  c.blocks.push_back({7001, std::nullopt, *block_counts::from_tokens(other, ids, 0, 4)});
  c.blocks.push_back({7002, 7001, *block_counts::from_tokens(other, ids, 0, 4)});
  req.counts = std::move(c);
  auto r = (*client)->route(req);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(std::holds_alternative<route_reply>(*r)) << std::get<error_reply>(*r).message;
  const auto& reply = std::get<route_reply>(*r);
  EXPECT_EQ(reply.covered_blocks, 0u);
  EXPECT_EQ(reply.fallback, "counts_geometry");
  ASSERT_EQ(reply.warnings.size(), 1u);
  EXPECT_EQ(reply.warnings[0],
            "counts_geometry: counts are L=2 E=16 k=2, the model is L=2 E=8 k=2; routed by load");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_EQ(warned[0].id, "wrong-geometry");
  EXPECT_EQ((*client)->warned_replies(), 1u);
  EXPECT_EQ((*client)->fallback_replies(), 1u);
  const auto m = toy_status(*admin_);
  EXPECT_EQ(m["counts_geometry"], 1) << m.dump();
  EXPECT_EQ(m["fallbacks"]["counts_geometry"], 1) << m.dump();
  // The refused counts never reached the store: the blocks stay unknown.
  const auto again = must_route(request_for("same-blocks", 0, {7001, 7002}, false));
  EXPECT_EQ(again.covered_blocks, 0u);
  EXPECT_EQ(again.fallback, "no_counts");
  // Good counts decide by locality, with no fallback and no warning.
  const auto good = must_route(request_for("good", 2, {7101}, true));
  EXPECT_EQ(good.worker, 2u);
  EXPECT_EQ(good.fallback, "");
  EXPECT_TRUE(good.warnings.empty());
  EXPECT_EQ(warned.size(), 1u);
}

// Every other way "eldr" ends up routing by load says so in the reply and in status.
TEST_F(NodeTest, EveryLoadOnlyDecisionOfTheLocalityPolicyNamesItsReason) {
  start();
  register_workers();
  // No centroid set yet: JSQ, named.
  const auto before = must_route(request_for("no-set", 1, {8001}, true));
  EXPECT_EQ(before.fallback, "no_centroid_set");
  EXPECT_TRUE(before.warnings.empty());
  EXPECT_EQ(import(toy_centroids()), 1u);
  // No block known.
  EXPECT_EQ(must_route(request_for("cold", 1, {8101}, false)).fallback, "no_counts");
  EXPECT_EQ(must_route(request_for("warm", 1, {8201}, true)).fallback, "");
  auto m = toy_status(*admin_);
  EXPECT_EQ(m["fallbacks"]["no_centroid_set"], 1) << m.dump();
  EXPECT_EQ(m["fallbacks"]["no_counts"], 1) << m.dump();
  EXPECT_EQ(m["fallbacks"]["signature_unusable"], 0) << m.dump();
  // A load policy chosen on purpose is no fallback.
  ASSERT_TRUE(admin_->call("policy", {{"model", "toy"}, {"policy", "jsq"}}).ok());
  EXPECT_EQ(must_route(request_for("jsq", 1, {8301}, false)).fallback, "");
  auto ex = admin_->call("explain", {{"model", "toy"}, {"request", "cold"}});
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  EXPECT_EQ((*ex)["fallback"], "no_counts");
}

// Issue 12: importing another model's set only printed a note in eldrctl. The node refuses a set
// fitted for another model name or geometry unless the request says force.
TEST_F(NodeTest, ImportOfAnotherModelsSetIsRefusedUnlessForced) {
  start();
  register_workers();
  centroid_file other = toy_centroids();
  other.model_name = "synthetic, Qwen3-30B-A3B shape";
  auto refused = admin_->call(
      "centroids.import", {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(other))}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find(
                "the file was fitted for model \"synthetic, Qwen3-30B-A3B shape\", not \"toy\""),
            std::string::npos)
      << refused.error().message();
  EXPECT_EQ(toy_status(*admin_)["epoch"], 0);
  auto forced = admin_->call(
      "centroids.import",
      {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(other))}, {"force", true}});
  ASSERT_TRUE(forced.ok()) << forced.error().to_string();
  EXPECT_EQ((*forced)["epoch"], 1);
  // Another geometry than the current set's (16 experts instead of 8).
  centroid_file wide = toy_centroids();
  wide.spec = *signature_spec::make({2, 16, 2}, signature_transform::count, {}, {});
  wide.centroids.assign(toy_k * wide.spec.width(), 0.0f);
  for (uint32_t w = 0; w < toy_k; ++w)
    wide.centroids[w * wide.spec.width() + w] = 1.0f;
  auto geometry = admin_->call(
      "centroids.import", {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(wide))}});
  ASSERT_FALSE(geometry.ok());
  EXPECT_NE(geometry.error().message().find("geometry L=2 E=16 k=2 differs from the current "
                                            "set's L=2 E=8 k=2"),
            std::string::npos)
      << geometry.error().message();
  EXPECT_EQ(toy_status(*admin_)["epoch"], 1);
  auto bad_force = admin_->call(
      "centroids.import",
      {{"model", "toy"}, {"file", nlohmann::json::binary(as_bytes(wide))}, {"force", "yes"}});
  ASSERT_FALSE(bad_force.ok());
  EXPECT_NE(bad_force.error().message().find("'force' must be a bool"), std::string::npos);
}

// Issue 12: a policy set with eldrctl policy was lost on a restart while the epoch was kept.
// Issue 16: widen_single is set the same way, shown in status, persisted and reset.
TEST_F(NodeTest, APolicySetByTheOperatorSurvivesARestartUntilReset) {
  start();
  auto m = toy_status(*admin_);
  EXPECT_EQ(m["policy"], "eldr-adaptive");
  EXPECT_EQ(m["policy_source"], "config");
  EXPECT_EQ(m["widen_single"], false) << m.dump();  // the toy config's
  auto bad = admin_->call("policy", {{"model", "toy"}, {"widen_single", "no"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("'widen_single': expected a bool"), std::string::npos);
  auto set = admin_->call("policy", {{"model", "toy"}, {"policy", "jsq"}, {"tau", 0.25}});
  ASSERT_TRUE(set.ok()) << set.error().to_string();
  EXPECT_EQ((*set)["policy_source"], "admin");
  EXPECT_EQ((*set)["persisted"], true) << set->dump();
  auto widen = admin_->call("policy", {{"model", "toy"}, {"widen_single", true}});
  ASSERT_TRUE(widen.ok()) << widen.error().to_string();
  EXPECT_EQ((*widen)["widen_single"], true) << widen->dump();
  EXPECT_EQ((*widen)["policy"], "jsq") << widen->dump();  // the other settings stay
  EXPECT_EQ(node_->stop(), 0);
  start();
  m = toy_status(*admin_);
  EXPECT_EQ(m["policy"], "jsq") << m.dump();
  EXPECT_FLOAT_EQ(m["tau"].get<float>(), 0.25f);
  EXPECT_EQ(m["widen_single"], true) << m.dump();
  EXPECT_EQ(m["policy_source"], "admin");
  auto reset = admin_->call("policy", {{"model", "toy"}, {"reset", true}});
  ASSERT_TRUE(reset.ok()) << reset.error().to_string();
  EXPECT_EQ((*reset)["policy"], "eldr-adaptive");
  EXPECT_EQ((*reset)["policy_source"], "config");
  EXPECT_EQ((*reset)["widen_single"], false);
  EXPECT_EQ(node_->stop(), 0);
  start();
  m = toy_status(*admin_);
  EXPECT_EQ(m["policy"], "eldr-adaptive");
  EXPECT_EQ(m["policy_source"], "config");
}

TEST_F(NodeTest, BadInputIsAnsweredCountedAndHarmless) {
  start();
  register_workers();
  // Raw DEALER so that the test can send bytes no client would.
  zmq::context_t ctx;
  auto raw = [&](const std::string& endpoint, const std::vector<uint8_t>& payload) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(endpoint);
    s.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(5000)), 1);
    zmq::message_t m;
    EXPECT_TRUE(s.recv(m).has_value());
    auto e = decode_error_reply({static_cast<const uint8_t*>(m.data()), m.size()}, {});
    EXPECT_TRUE(e.ok());
    return e.ok() ? e->code : wire_error_code::internal;
  };
  EXPECT_EQ(raw(node_->route(), {0xc1, 0x00}), wire_error_code::malformed);
  route_request big = request_for("big", 0, {}, false);
  big.block_hashes.assign(5000, 7);
  EXPECT_EQ(raw(node_->route(), encode_route_request(big)), wire_error_code::too_large);
  // A route request sent to the worker endpoint is an unknown type there.
  EXPECT_EQ(raw(node_->worker(), encode_route_request(request_for("x", 0, {1}, false))),
            wire_error_code::unknown_type);
  auto wrong_model = request_for("wm", 0, {1}, false);
  wrong_model.model = "no-such-model";
  auto r = route_->route(wrong_model);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(std::holds_alternative<error_reply>(*r));
  EXPECT_EQ(std::get<error_reply>(*r).code, wire_error_code::unknown_model);
  // The node goes on and counted every one.
  auto s = admin_->call("status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["counters"]["malformed"], 1);
  EXPECT_EQ((*s)["counters"]["too_large"], 1);
  EXPECT_EQ((*s)["counters"]["unknown_type"], 1);
  EXPECT_EQ(must_route(request_for("fine", 0, {1}, false)).total_blocks, 1u);
}

TEST_F(NodeTest, SlowClientDoesNotStallOthers) {
  start();
  register_workers();
  // A client that sends many requests and never reads its replies.
  zmq::context_t ctx;
  zmq::socket_t silent(ctx, zmq::socket_type::dealer);
  silent.set(zmq::sockopt::linger, 0);
  silent.set(zmq::sockopt::rcvhwm, 1);
  silent.connect(node_->route());
  for (int i = 0; i < 2000; ++i)
    silent.send(
        zmq::buffer(encode_route_request(request_for("s" + std::to_string(i), 0, {1}, false))),
        zmq::send_flags::none);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(must_route(request_for("o" + std::to_string(i), 0, {1}, false)).total_blocks, 1u);
}

TEST_F(NodeTest, ModelsHaveTheirOwnPoolsSetsAndEpochs) {
  start(std::string(toy_model_toml) +
        "[[models]]\nname = \"other\"\nworkers = 2\nwiden_single = false\n");
  register_workers();
  EXPECT_EQ(import(toy_centroids()), 1u);
  // "other" has no registered worker and no set: its requests fail, toy's are unaffected.
  auto req = request_for("o1", 0, {1}, true);
  req.model = "other";
  auto r = route_->route(req);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(std::holds_alternative<error_reply>(*r));
  EXPECT_EQ(std::get<error_reply>(*r).code, wire_error_code::no_eligible_worker);
  for (uint32_t w = 0; w < 2; ++w)
    ASSERT_TRUE(
        worker_->call(worker_register{"", "other", w, "tcp://o" + std::to_string(w), 0, ""}).ok());
  // A worker index outside other's pool of 2 is refused; toy's pool of 4 is not other's.
  auto outside = worker_->call(worker_register{"", "other", 3, "tcp://o3", 0, ""});
  ASSERT_TRUE(outside.ok());
  EXPECT_TRUE(std::holds_alternative<error_reply>(*outside));
  const auto o = must_route(req);
  EXPECT_LT(o.worker, 2u);
  EXPECT_EQ(o.epoch, 0u);  // no set for "other": routed by load, epoch 0
  EXPECT_EQ(o.endpoint.rfind("tcp://o", 0), 0u);
  EXPECT_EQ(must_route(request_for("t1", 3, {2}, true)).epoch, 1u);
  auto ws = admin_->call("workers", {{"model", "other"}});
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(ws->size(), 2u);
  auto status = admin_->call("status");
  ASSERT_TRUE(status.ok());
  for (const auto& m : (*status)["models"])
    EXPECT_EQ(m["routed"], 1) << m.dump();  // one request each, no cross counting
}

TEST_F(NodeTest, PendingLimitShedsLoadAndEveryRequestIsAnsweredOnce) {
  start(toy_model_toml, "[limits]\nmax_pending = 4\n");
  register_workers();
  // A burst far above the limit, all sent before any answer is read.
  const int n = 2000;
  for (int i = 0; i < n; ++i)
    ASSERT_TRUE(route_->send(request_for("p" + std::to_string(i), i % 4, {1}, false)).ok());
  std::set<std::string> answered;
  int overloaded = 0, routed = 0;
  for (int i = 0; i < n; ++i) {
    auto r = route_->receive(10000);
    ASSERT_TRUE(r.ok()) << "answer " << i << ": " << r.error().to_string();
    if (auto* e = std::get_if<error_reply>(&*r)) {
      ASSERT_EQ(e->code, wire_error_code::overloaded) << e->message;
      ++overloaded;
    } else {
      EXPECT_TRUE(answered.insert(std::get<route_reply>(*r).id).second);
      ++routed;
    }
  }
  EXPECT_EQ(routed + overloaded, n);
  EXPECT_GT(overloaded, 0);
  EXPECT_GT(routed, 0);
  auto s = admin_->call("status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["counters"]["overloaded"], overloaded);
  EXPECT_EQ((*s)["counters"]["pending"], 0);
}

}  // namespace
}  // namespace eldr
