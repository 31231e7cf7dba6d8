// eldr-node taking decode workers' load from their vLLM /metrics (issue 13, item 2) and binding
// a SUB socket that KV-event publishers connect to (item 6), as real processes: local HTTP
// servers (cpp-httplib, port 0) serve /metrics in vLLM's format, workers register with a
// metrics_url over the worker protocol, routes follow the scraped load, and a worker whose
// metrics endpoint dies leaves the candidate set after worker_timeout_ms. Every wait polls an
// observable with a deadline.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/zmq/client.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_status.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/vllm_metrics_server.hpp"

namespace eldr {
namespace {

using testing::vllm_metrics_server;

using json = nlohmann::json;
using namespace std::chrono_literals;

bool eventually(const std::function<bool()>& done, std::chrono::seconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline)
    if (done()) return true;
  return done();
}

// worker_register over the worker protocol: the ack's state, or "error <code>: <message>".
std::string register_worker(const testing::node_process& node, uint32_t worker,
                            const std::string& metrics_url) {
  auto c = worker_client::connect(node.worker());
  if (!c.ok()) return "connect: " + c.error().to_string();
  worker_register r;
  r.model = "m";
  r.worker = worker;
  r.endpoint = "tcp://127.0.0.1:" + std::to_string(7000 + worker);
  r.metrics_url = metrics_url;
  auto out = (*c)->call(r);
  if (!out.ok()) return "call: " + out.error().to_string();
  if (const auto* ack = std::get_if<worker_ack>(&*out)) return ack->state;
  const auto& e = std::get<error_reply>(*out);
  return std::string("error ") + to_string(e.code) + ": " + e.message;
}

json worker_row(const testing::node_process& node, uint32_t worker) {
  const json rows = testing::admin_workers(node.admin(), "m");
  if (!rows.is_array()) return {};
  for (const auto& r : rows)
    if (r.value("worker", 999u) == worker) return r;
  return {};
}

// Routes a request with no blocks (load only) and returns the chosen worker, -1 on error.
int route_once(const testing::node_process& node, const std::string& id) {
  auto c = route_client::connect(node.route());
  if (!c.ok()) return -1;
  route_request r;
  r.id = id;
  r.model = "m";
  auto out = (*c)->route(r);
  if (!out.ok()) return -1;
  if (const auto* reply = std::get_if<route_reply>(&*out)) return static_cast<int>(reply->worker);
  return -1;
}

std::string scrape_model(uint32_t timeout_ms) {
  return "[[models]]\nname = \"m\"\nworkers = 2\npolicy = \"jsq\"\nworker_timeout_ms = " +
         std::to_string(timeout_ms) + "\nscrape_interval_ms = 50\n";
}

TEST(NodeScrape, RoutingFollowsScrapedLoadAndADeadEndpointLeavesTheCandidateSet) {
  testing::temp_dir dir("eldr-scrape");
  vllm_metrics_server w0, w1;
  w0.set_load(30, 20);  // 50 in flight on worker 0
  w1.set_load(0, 0);
  testing::node_process node(dir.sub("node.toml"),
                             testing::node_toml(dir.sub("data"), scrape_model(1000)));
  ASSERT_TRUE(node.ok());
  ASSERT_EQ(register_worker(node, 0, w0.url()), "active");
  ASSERT_EQ(register_worker(node, 1, w1.url()), "active");

  // The scraped load becomes the router's: worker 0 shows 50, and JSQ sends everything to 1.
  ASSERT_TRUE(eventually([&] { return worker_row(node, 0).value("load", 0u) == 50u; }))
      << worker_row(node, 0).dump();
  EXPECT_EQ(worker_row(node, 0).value("metrics_url", ""), w0.url());
  EXPECT_GE(worker_row(node, 0).value("scrapes", 0u), 1u);
  // The engine's own split of it, as the workers listing (and the operator page) shows it.
  EXPECT_EQ(worker_row(node, 0).value("running", 0u), 30u);
  EXPECT_EQ(worker_row(node, 0).value("waiting", 0u), 20u);
  EXPECT_FLOAT_EQ(worker_row(node, 0).value("kv_usage", 0.0f), 0.25f);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(route_once(node, "a" + std::to_string(i)), 1);

  // The engines' loads change: worker 1 is now the busy one.
  w0.set_load(0, 0);
  w1.set_load(60, 40);
  ASSERT_TRUE(eventually([&] { return worker_row(node, 1).value("load", 0u) >= 100u; }))
      << worker_row(node, 1).dump();
  ASSERT_TRUE(eventually([&] { return worker_row(node, 0).value("load", 99u) == 0u; }));
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(route_once(node, "b" + std::to_string(i)), 0);

  // Worker 0's metrics endpoint dies: its scrapes fail, and after worker_timeout_ms it is dead
  // and no longer picked although its last scraped load was the lowest.
  w0.stop();
  ASSERT_TRUE(eventually([&] { return worker_row(node, 0).value("state", "") == "dead"; }))
      << worker_row(node, 0).dump();
  EXPECT_GE(worker_row(node, 0).value("scrapes_failed", 0u), 1u);
  EXPECT_NE(worker_row(node, 0).value("scrape_error", ""), "");
  EXPECT_EQ(worker_row(node, 1).value("state", ""), "active");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(route_once(node, "c" + std::to_string(i)), 1);

  // The node's /metrics counts scrapes by result.
  const auto m = testing::run_command("curl -s --max-time 5 " + node.metrics());
  EXPECT_NE(m.output.find("eldr_worker_scrapes_total{"), std::string::npos);
  EXPECT_NE(m.output.find("result=\"failed\""), std::string::npos);
  EXPECT_NE(m.output.find("eldr_worker_scraped_load{"), std::string::npos);
  EXPECT_NE(m.output.find("eldr_worker_scrape_age_seconds{"), std::string::npos);
}

TEST(NodeScrape, ABadMetricsUrlIsRefusedNamingTheField) {
  testing::temp_dir dir("eldr-scrape-bad");
  testing::node_process node(dir.sub("node.toml"),
                             testing::node_toml(dir.sub("data"), scrape_model(1000)));
  ASSERT_TRUE(node.ok());
  const std::string r = register_worker(node, 0, "https://10.0.0.1:8000/metrics");
  EXPECT_EQ(r.rfind("error ", 0), 0u) << r;
  EXPECT_NE(r.find("worker_register.metrics_url"), std::string::npos) << r;
  // Without a metrics_url the worker pushes load_reports, as before.
  EXPECT_EQ(register_worker(node, 0, ""), "active");
  EXPECT_EQ(worker_row(node, 0).count("metrics_url"), 0u);
}

TEST(NodeScrape, KvEventPublishersConnectToABoundEndpoint) {
  testing::temp_dir dir("eldr-kv-bind");
  // Port 0: the node binds a free port and names it in its ready line (a port picked here and
  // released for the node could be taken by another test in between).
  testing::node_process node(
      dir.sub("node.toml"),
      testing::node_toml(dir.sub("data"),
                         "[[models]]\nname = \"toy\"\nworkers = 4\n[models.kv_events]\nbind = "
                         "\"tcp://127.0.0.1:0\"\n",
                         "[signature_cache]\ncommit_interval_ms = 5\n"));
  ASSERT_TRUE(node.ok());
  const std::string bind = node.kv_events("toy");
  ASSERT_EQ(bind.rfind("tcp://127.0.0.1:", 0), 0u) << bind;
  ASSERT_NE(bind, "tcp://127.0.0.1:0");
  // Two vLLM-like publishers connect (as vLLM does with endpoint "tcp://host:port"), each under
  // its own topic, with their own sequences.
  auto publisher = [&](const std::string& topic) {
    return std::make_unique<testing::child_process>(std::vector<std::string>{
        "/usr/bin/python3", std::string(ELDR_SOURCE_DIR) + "/tests/integration/py/kv_publisher.py",
        "new", "--connect", bind, "--topic", topic});
  };
  auto a = publisher("w0");
  auto b = publisher("w1");
  for (auto* p : {a.get(), b.get()}) {
    ASSERT_TRUE(p->read_line(20s).has_value());
    p->write_line(json{{"cmd", "wait_subscriber"}}.dump());
    auto ok = p->read_line(30s);
    ASSERT_TRUE(ok.has_value());
    ASSERT_TRUE(json::parse(*ok, nullptr, false).value("ok", false)) << *ok;
  }
  auto send = [](testing::child_process& p, uint64_t seq, std::vector<uint64_t> hashes) {
    const json stored = {{"type", "BlockStored"}, {"hashes", hashes}, {"group", 0}};
    p.write_line(json{{"cmd", "send"}, {"seq", seq}, {"events", json::array({stored})}}.dump());
    auto line = p.read_line(30s);
    EXPECT_TRUE(line.has_value());
  };
  send(*a, 0, {1, 2});
  send(*b, 0, {10});
  send(*a, 1, {3});
  send(*b, 1, {11, 12});
  auto cache = [&] {
    const json s = testing::admin_status(node.admin());
    if (!s.is_object() || !s.contains("signature_cache") || s["signature_cache"].empty())
      return json();
    return s["signature_cache"][0];
  };
  // Six blocks from two publishers on one socket: neither's sequence looks like a gap or a
  // restart of the other's.
  ASSERT_TRUE(eventually([&] { return cache().value("blocks", uint64_t{0}) == 6; }))
      << cache().dump();
  const json ingest = cache().value("ingest", json::object());
  EXPECT_EQ(ingest.value("gaps", uint64_t{99}), 0u) << ingest.dump();
  EXPECT_EQ(ingest.value("restarts", uint64_t{99}), 0u) << ingest.dump();
  for (auto* p : {a.get(), b.get()})
    p->write_line(json{{"cmd", "exit"}}.dump());
}

}  // namespace
}  // namespace eldr
