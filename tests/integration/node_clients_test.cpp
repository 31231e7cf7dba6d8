// eldr-node driven by the Python client library and by eldrctl, as real processes: the clients'
// own tests use fake servers, this one proves they speak to the real node.
#include <gtest/gtest.h>

#include "core/formats/centroid_file.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/toy_model.hpp"

namespace eldr {
namespace {

centroid_file toy_centroids() {
  return testing::toy_centroids("toy");
}

// The paper's band ("eldr", not the default eldr-adaptive): the Python script checks that a
// request goes to its domain's home worker however loaded, which is that rule's decision.
const char* models =
    "[[models]]\nname = \"toy\"\nworkers = 4\npolicy = \"eldr\"\nwiden_single = false\n"
    "worker_timeout_ms = 600000\n";

TEST(NodeClients, PythonClientDrivesARealNode) {
  testing::temp_dir dir("eldr-node-py");
  ASSERT_TRUE(write_centroid_file(toy_centroids(), dir.sub("toy.centroids")).ok());
  testing::node_process node(dir.sub("node.toml"), testing::node_toml(dir.sub("data"), models));
  ASSERT_TRUE(node.ok());
  const auto r = testing::run_command(
      "/usr/bin/python3 " + std::string(ELDR_SOURCE_DIR) + "/tests/integration/py/node_e2e.py " +
      node.route() + " " + node.worker() + " " + node.admin() + " " + dir.sub("toy.centroids"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ok"), std::string::npos) << r.output;
}

TEST(NodeClients, EldrctlAgainstARealNode) {
  testing::temp_dir dir("eldr-node-ctl");
  ASSERT_TRUE(write_centroid_file(toy_centroids(), dir.sub("toy.centroids")).ok());
  testing::node_process node(dir.sub("node.toml"), testing::node_toml(dir.sub("data"), models));
  ASSERT_TRUE(node.ok());
  const std::string ctl =
      std::string(ELDR_BINARY_DIR) + "/tools/eldrctl/eldrctl --node " + node.admin() + " ";
  auto status = testing::run_command(ctl + "status --json");
  ASSERT_EQ(status.exit_code, 0) << status.output;
  auto j = nlohmann::json::parse(status.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << status.output;
  EXPECT_EQ(j["endpoints"]["route"], node.route());
  EXPECT_EQ(j["models"][0]["epoch"], 0);

  auto imported = testing::run_command(ctl + "centroids import toy " + dir.sub("toy.centroids"));
  EXPECT_EQ(imported.exit_code, 0) << imported.output;
  auto show = testing::run_command(ctl + "centroids show toy --json");
  ASSERT_EQ(show.exit_code, 0) << show.output;
  EXPECT_EQ(nlohmann::json::parse(show.output, nullptr, false)["epoch"], 1);

  // A corrupt file is refused before anything reaches the node: the epoch stays.
  { std::ofstream(dir.sub("bad.centroids")) << "not a centroid file"; }
  auto bad = testing::run_command(ctl + "centroids import toy " + dir.sub("bad.centroids"));
  EXPECT_NE(bad.exit_code, 0);
  auto export_ = testing::run_command(ctl + "centroids export toy -o " + dir.sub("out.centroids"));
  EXPECT_EQ(export_.exit_code, 0) << export_.output;
  auto round = read_centroid_file(dir.sub("out.centroids"));
  ASSERT_TRUE(round.ok()) << round.error().to_string();
  EXPECT_EQ(round->epoch, 1u);

  // Node errors: exit 1 with the code's name.
  auto drain = testing::run_command(ctl + "drain toy 3");
  EXPECT_EQ(drain.exit_code, 1) << drain.output;  // worker 3 never registered
  auto unknown = testing::run_command(ctl + "centroids show nope");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("unknown_model"), std::string::npos) << unknown.output;
  auto policy = testing::run_command(ctl + "policy toy --set jsq --json");
  ASSERT_EQ(policy.exit_code, 0) << policy.output;
  EXPECT_EQ(nlohmann::json::parse(policy.output, nullptr, false)["policy"], "jsq");
}

}  // namespace
}  // namespace eldr
