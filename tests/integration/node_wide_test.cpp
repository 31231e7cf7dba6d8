// eldr-node serving a model of 512 experts (Qwen3-Next's width): a centroid set of E = 512
// imported, route requests whose counts travel as eldr-counts version 2 over ZeroMQ (from the C++
// client and from the Python client), signatures from the stored blocks when no counts come, and
// a warm restart that reads those blocks (signature-cache counts format 2) back from RocksDB.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cluster/zmq/client.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/node_fixture.hpp"
#include "tests/support/process.hpp"

namespace eldr {
namespace {

const model_geometry wide{4, 512, 10};
constexpr uint32_t wide_k = 4;

// Worker w's home experts: 10 consecutive ids from 128 * w + 60 (60..69, 188..197, 316..325,
// 444..453): two of the four homes lie above 255, where a one-byte id cannot reach.
expert_id home_expert(uint32_t w, uint32_t j) {
  return static_cast<expert_id>(128 * w + 60 + j);
}

centroid_file wide_centroids() {
  centroid_file f;
  f.model_name = "wide";
  f.spec = *signature_spec::make(wide, signature_transform::count, {}, {});
  f.workers = wide_k;
  f.centroids.assign(wide_k * f.spec.width(), 0.0f);
  for (uint32_t w = 0; w < wide_k; ++w)
    for (uint32_t l = 0; l < wide.layers; ++l)
      for (uint32_t j = 0; j < wide.top_k; ++j)
        f.centroids[w * f.spec.width() + l * wide.experts + home_expert(w, j)] = 1.0f;
  for (float& v : f.centroids)
    v /= std::sqrt(static_cast<float>(wide.layers * wide.top_k));
  f.epoch = 1;
  f.provenance.source = "node_wide_test";
  f.provenance.kmeans_variant = "balanced";
  return f;
}

// One block of 8 tokens that all pick worker w's home experts at every layer.
block_counts block_for(uint32_t w) {
  std::vector<expert_id> ids;
  for (int t = 0; t < 8; ++t)
    for (uint32_t l = 0; l < wide.layers; ++l)
      for (uint32_t j = 0; j < wide.top_k; ++j)
        ids.push_back(home_expert(w, j));
  return *block_counts::from_tokens(wide, ids, 0, 8);
}

route_request request_for(const std::string& id, uint32_t w, std::vector<uint64_t> blocks,
                          bool send_counts) {
  route_request r;
  r.id = id;
  r.model = "wide";
  r.block_hashes = blocks;
  if (send_counts) {
    counts_message c;
    c.geometry = wide;  // encoded as version 2: E > 256
    std::optional<uint64_t> parent;
    for (uint64_t h : blocks) {
      c.blocks.push_back({h, parent, block_for(w)});
      parent = h;
    }
    r.counts = std::move(c);
  }
  return r;
}

const char* wide_model_toml =
    "[[models]]\nname = \"wide\"\nworkers = 4\nworker_timeout_ms = 600000\nwiden_single = false\n";

class NodeWide : public testing::node_fixture {
 protected:
  NodeWide() : node_fixture("eldr-node-wide") {}

  void start() {
    ASSERT_NO_FATAL_FAILURE(start_node(wide_model_toml));
    register_workers("wide", wide_k, "tcp://10.2.0.");
  }
};

TEST_F(NodeWide, RoutesA512ExpertModelFromCountsThenFromStoredBlocksAcrossARestart) {
  start();
  auto imported =
      admin_->call("centroids.import",
                   {{"model", "wide"},
                    {"file", nlohmann::json::binary(encode_centroid_file(wide_centroids()))}});
  ASSERT_TRUE(imported.ok()) << imported.error().to_string();
  EXPECT_EQ(imported->value("epoch", uint64_t{0}), 1u);

  // Counts with the request (eldr-counts v2): each request lands on its home worker.
  for (uint32_t w = 0; w < wide_k; ++w) {
    const auto r = must_route(
        request_for("counts-" + std::to_string(w), w, {7000 + w * 10, 7001 + w * 10}, true));
    EXPECT_EQ(r.worker, w);
    EXPECT_EQ(r.covered_blocks, 2u);
    EXPECT_TRUE(r.fallback.empty()) << r.fallback;
    EXPECT_TRUE(r.warnings.empty());
  }
  // The same blocks again without counts: the signature comes from the stored blocks.
  for (uint32_t w = 0; w < wide_k; ++w) {
    const auto r = must_route(
        request_for("cached-" + std::to_string(w), w, {7000 + w * 10, 7001 + w * 10}, false));
    EXPECT_EQ(r.worker, w);
    EXPECT_EQ(r.covered_blocks, 2u);
  }

  // The Python client's encoder (version 2 for E > 256) against the same node.
  const auto py = testing::run_command("/usr/bin/python3 " + std::string(ELDR_SOURCE_DIR) +
                                       "/tests/integration/py/node_wide_e2e.py " + node_->route());
  EXPECT_EQ(py.exit_code, 0) << py.output;
  EXPECT_NE(py.output.find("ok"), std::string::npos) << py.output;

  auto status = admin_->call("status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["models"][0]["counts_geometry"], 0) << status->dump();

  // Warm restart: the stored blocks are read back from RocksDB.
  EXPECT_EQ(node_->stop(), 0);
  start();
  for (uint32_t w = 0; w < wide_k; ++w) {
    const auto r = must_route(
        request_for("restart-" + std::to_string(w), w, {7000 + w * 10, 7001 + w * 10}, false));
    EXPECT_EQ(r.worker, w);
    EXPECT_EQ(r.covered_blocks, 2u);
    EXPECT_EQ(r.epoch, 1u);
  }
}

}  // namespace
}  // namespace eldr
