// runtime.log_format = "json" on a real eldr-node: after its ready line, every line it logs is one
// JSON object, and a worker's registration comes out with the model it names.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "cluster/zmq/client.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

TEST(NodeLogFormat, JsonLinesNameTheModelAWorkerRegisteredFor) {
  testing::temp_dir dir{"node-log-format"};
  // The node's stderr (its log) joins its stdout, where the test reads lines.
  // node_toml's [runtime] says log_level "warn": this config is written out whole instead.
  const std::string toml = "[node]\nname = \"log-node\"\ndata_dir = \"" + dir.sub("data") +
                           "\"\n[endpoints]\nroute = \"tcp://127.0.0.1:0\"\n"
                           "worker = \"tcp://127.0.0.1:0\"\nadmin = \"tcp://127.0.0.1:0\"\n"
                           "metrics = \"\"\n[runtime]\nlog_level = \"info\"\n"
                           "log_format = \"json\"\n[[models]]\nname = \"m\"\nworkers = 2\n";
  testing::node_process node(dir.sub("node.toml"), toml,
                             {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"});
  ASSERT_TRUE(node.ok()) << "the node did not start";
  auto c = worker_client::connect(node.worker());
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  worker_register r{"", "m", 1, "tcp://127.0.0.1:7001", 0, ""};
  auto ack = (*c)->call(r);
  ASSERT_TRUE(ack.ok()) << ack.error().to_string();
  ASSERT_TRUE(std::holds_alternative<worker_ack>(*ack));
  bool seen = false;
  int lines = 0;
  while (!seen) {
    auto line = node.read_line(std::chrono::seconds(30));
    ASSERT_TRUE(line) << "no log line naming the registration within 30 s (" << lines << " lines)";
    ++lines;
    const auto j = nlohmann::json::parse(*line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << *line;
    for (const char* key : {"time", "level", "component", "message"})
      ASSERT_TRUE(j.contains(key)) << key << " missing: " << *line;
    const std::string message = j["message"];
    if (message.find("decode worker 1 registered") == std::string::npos) continue;
    EXPECT_EQ(j["level"], "info") << *line;
    EXPECT_EQ(j["component"], "model") << *line;
    EXPECT_EQ(j["model"], "m") << *line;
    seen = true;
  }
}

}  // namespace
}  // namespace eldr
