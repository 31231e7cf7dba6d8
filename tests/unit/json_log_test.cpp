// json_log: the fields taken from the node's own log lines, the line's JSON (parsed back), the
// time stamp, bytes that are not UTF-8, and the formatter as spdlog drives it.
#include "cluster/config/json_log.hpp"

#include <gtest/gtest.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace eldr {
namespace {

using json = nlohmann::json;

// Messages as the node writes them (router_actor, ingest, cluster_actor, node).
TEST(JsonLog, FieldsComeFromTheSubjectOfTheMessage) {
  auto f = log_fields_of("model toy: request probe-96 routed by load only (no_counts)");
  EXPECT_EQ(f.component, "model");
  EXPECT_EQ(f.model, "toy");
  EXPECT_EQ(f.request, "probe-96");
  EXPECT_EQ(f.publisher, "");
  f = log_fields_of("ingest tcp://127.0.0.1:44303: dropped (bad_batch, 1 so far): seq 4");
  EXPECT_EQ(f.component, "ingest");
  EXPECT_EQ(f.publisher, "tcp://127.0.0.1:44303");
  EXPECT_EQ(f.model, "");
  f = log_fields_of("replay from tcp://10.0.0.1:5558: no answer within 2000 ms");
  EXPECT_EQ(f.component, "replay");
  EXPECT_EQ(f.publisher, "tcp://10.0.0.1:5558");
  f = log_fields_of("cluster: node-2 joined (term 3)");
  EXPECT_EQ(f.component, "cluster");
  f = log_fields_of("eldr-node ready");
  EXPECT_EQ(f.component, "node");
  EXPECT_EQ(f.request, "");
  // "request" only as a word: "subrequest x" names no request; trailing punctuation is cut.
  EXPECT_EQ(log_fields_of("model m: subrequest x").request, "");
  EXPECT_EQ(log_fields_of("model m: finished for request r-1.").request, "r-1");
}

TEST(JsonLog, ALineIsOneJsonObjectWithTimeLevelAndTheWholeMessage) {
  using namespace std::chrono;
  const system_clock::time_point t{milliseconds(1796203841088)};  // 2026-12-02T09:30:41.088Z
  const std::string line =
      json_log_line(t, "warning", "model toy: request probe-96 routed by load only (no_counts)");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const json j = json::parse(line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << line;
  EXPECT_EQ(j["time"], "2026-12-02T09:30:41.088Z");
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["component"], "model");
  EXPECT_EQ(j["model"], "toy");
  EXPECT_EQ(j["request"], "probe-96");
  EXPECT_EQ(j["message"], "model toy: request probe-96 routed by load only (no_counts)");
  EXPECT_FALSE(j.contains("publisher"));
  // Quotes, newlines and bytes that are not UTF-8 (a peer's endpoint) keep the line one object.
  const std::string hostile = json_log_line(t, "error", "ingest tcp://\xff\"x\n:1: dropped");
  EXPECT_EQ(hostile.find('\n'), std::string::npos);
  const json h = json::parse(hostile, nullptr, false);
  ASSERT_TRUE(h.is_object()) << hostile;
  EXPECT_EQ(h["message"], "ingest tcp://\xef\xbf\xbd\"x\n:1: dropped");
}

TEST(JsonLog, TheFormatterWritesOneLinePerRecordThroughSpdlog) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger log("test", sink);
  log.set_formatter(std::make_unique<json_log_formatter>());
  log.warn("model {}: request {} routed by load only", "toy", "r-7");
  log.info("eldr-node ready");
  std::istringstream in(out.str());
  std::string first, second, none;
  ASSERT_TRUE(std::getline(in, first));
  ASSERT_TRUE(std::getline(in, second));
  EXPECT_FALSE(std::getline(in, none));
  const json a = json::parse(first, nullptr, false), b = json::parse(second, nullptr, false);
  ASSERT_TRUE(a.is_object() && b.is_object()) << out.str();
  EXPECT_EQ(a["level"], "warning");
  EXPECT_EQ(a["request"], "r-7");
  EXPECT_EQ(b["level"], "info");
  EXPECT_EQ(b["component"], "node");
}

}  // namespace
}  // namespace eldr
