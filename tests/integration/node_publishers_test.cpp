// eldr-node following KV-event publishers registered over the worker protocol, as real
// processes: a Python stand-in for vLLM's PUB + ROUTER replay (tests/integration/py/
// kv_publisher.py), the C++ worker_client registering it, admin `status` and /metrics observing.
// Covers: a sequence gap filled from the registered replay endpoint; a replay endpoint that
// never answers (the gap counted unfilled, routes still answered); registrations surviving a
// restart; a silent publisher forgotten with its blocks; the max_publishers bound and ZeroMQ's
// refusal answered as errors, not `subscribed`. Every wait polls an observable with a deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "cluster/zmq/client.hpp"
#include "tests/support/cluster_status.hpp"
#include "tests/support/kv_publisher.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class py_publisher : public testing::kv_publisher {
 public:
  using kv_publisher::kv_publisher;
  bool wait_subscriber() { return cmd({{"cmd", "wait_subscriber"}}).value("ok", false); }
  void send(uint64_t seq, std::vector<uint64_t> hashes, bool lose = false) {
    const json stored = {{"type", "BlockStored"}, {"hashes", hashes}, {"group", 0}};
    const json r =
        cmd({{"cmd", "send"}, {"seq", seq}, {"events", json::array({stored})}, {"lose", lose}});
    EXPECT_EQ(r.value("ok", false), true) << r.dump();
  }
  int replays() { return cmd({{"cmd", "stats"}}).value("replays", -1); }
};

const char* models = "[[models]]\nname = \"toy\"\nworkers = 4\n";

std::string cache_section(const std::string& lines) {
  return "[signature_cache]\ncommit_interval_ms = 5\n" + lines;
}

// The model's entry of status.signature_cache ({} when the node does not answer).
json cache_of(const testing::node_process& node) {
  const json s = testing::admin_status(node.admin());
  if (!s.is_object() || !s.contains("signature_cache") || s["signature_cache"].empty()) return {};
  return s["signature_cache"][0];
}

uint64_t blocks(const testing::node_process& node) {
  return cache_of(node).value("blocks", uint64_t{0});
}
uint64_t ingest_counter(const testing::node_process& node, const std::string& key) {
  const json c = cache_of(node);
  return c.contains("ingest") ? c["ingest"].value(key, uint64_t{0}) : 0;
}

// One sample of /metrics: the value of an unlabelled series, -1 when absent.
double metric(const testing::node_process& node, const std::string& name) {
  const auto r = testing::run_command("curl -s --max-time 5 " + node.metrics());
  const std::string key = "\n" + name + " ";
  const auto at = ("\n" + r.output).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(("\n" + r.output).substr(at + key.size()));
}

bool eventually(const std::function<bool()>& done, std::chrono::seconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline)
    if (done()) return true;
  return done();
}

// publisher_register over the worker protocol: the ack's state, or "error <code>: <message>".
std::string register_publisher(const testing::node_process& node, const std::string& endpoint,
                               const std::string& replay = "") {
  auto c = worker_client::connect(node.worker());
  if (!c.ok()) return "connect: " + c.error().to_string();
  auto r = (*c)->call(publisher_register{"", "toy", endpoint, replay});
  if (!r.ok()) return "call: " + r.error().to_string();
  if (const auto* ack = std::get_if<worker_ack>(&*r)) return ack->state;
  const auto& e = std::get<error_reply>(*r);
  return std::string("error ") + to_string(e.code) + ": " + e.message;
}

TEST(NodePublishers, AGapIsFilledFromTheRegisteredReplayEndpoint) {
  testing::temp_dir dir("eldr-pub-replay");
  py_publisher pub("new");
  ASSERT_TRUE(pub.ok());
  testing::node_process node(dir.sub("node.toml"),
                             testing::node_toml(dir.sub("data"), models, cache_section("")));
  ASSERT_TRUE(node.ok());
  // Registered first without its replay endpoint, then again with it: the second registration
  // opens no socket and gives the next gap its replay.
  ASSERT_EQ(register_publisher(node, pub.pub()), "subscribed");
  ASSERT_EQ(register_publisher(node, pub.pub(), pub.replay()), "subscribed");
  ASSERT_TRUE(pub.wait_subscriber());
  pub.send(0, {1, 2});
  ASSERT_TRUE(eventually([&] { return blocks(node) == 2; }));
  EXPECT_EQ(testing::admin_status(node.admin())["counters"].value("publisher_subscriptions", -1),
            1);
  pub.send(1, {3}, /*lose=*/true);  // kept in the replay buffer, never on the live socket
  pub.send(2, {4});
  // Without replay the gap resynchronises the worker: blocks 1..3 gone, 1 block left.
  ASSERT_TRUE(eventually([&] { return ingest_counter(node, "replayed") >= 1; }))
      << cache_of(node).dump();
  EXPECT_TRUE(eventually([&] { return blocks(node) == 4; })) << cache_of(node).dump();
  EXPECT_EQ(ingest_counter(node, "replayed"), 1u);
  EXPECT_EQ(ingest_counter(node, "gaps"), 1u);
  EXPECT_EQ(ingest_counter(node, "gaps_unfilled"), 0u);
  EXPECT_EQ(pub.replays(), 1);
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_ingest_replayed_total") == 1; }));
  pub.send(3, {5});  // the live stream goes on after the replay
  EXPECT_TRUE(eventually([&] { return blocks(node) == 5; })) << cache_of(node).dump();
}

TEST(NodePublishers, AReplayEndpointThatNeverAnswersLeavesTheGapUnfilled) {
  testing::temp_dir dir("eldr-pub-mute");
  py_publisher pub("mute");
  ASSERT_TRUE(pub.ok());
  testing::node_process node(
      dir.sub("node.toml"),
      testing::node_toml(dir.sub("data"), models, cache_section("replay_timeout_ms = 1500\n")));
  ASSERT_TRUE(node.ok());
  ASSERT_EQ(register_publisher(node, pub.pub(), pub.replay()), "subscribed");
  ASSERT_TRUE(pub.wait_subscriber());
  pub.send(0, {1, 2});
  ASSERT_TRUE(eventually([&] { return blocks(node) == 2; }));
  pub.send(1, {3}, /*lose=*/true);
  pub.send(2, {4});
  ASSERT_TRUE(eventually([&] { return pub.replays() == 1; }));
  // While the replay is outstanding the node answers everything else.
  auto rc = route_client::connect(node.route());
  ASSERT_TRUE(rc.ok());
  route_request req;
  req.id = "during-replay";
  req.model = "toy";
  req.block_hashes = {1};
  auto routed = (*rc)->route(req);
  ASSERT_TRUE(routed.ok()) << routed.error().to_string();
  ASSERT_TRUE(eventually([&] { return ingest_counter(node, "gaps_unfilled") == 1; }))
      << cache_of(node).dump();
  EXPECT_EQ(ingest_counter(node, "replayed"), 0u);
  EXPECT_TRUE(eventually([&] { return blocks(node) == 1; })) << cache_of(node).dump();  // {4}
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_publisher_replays_failed_total") == 1; }));
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_ingest_gaps_unfilled_total") == 1; }));
  pub.send(3, {5});
  EXPECT_TRUE(eventually([&] { return blocks(node) == 2; })) << cache_of(node).dump();
}

TEST(NodePublishers, RegistrationsSurviveARestart) {
  testing::temp_dir dir("eldr-pub-restart");
  py_publisher pub("new");
  ASSERT_TRUE(pub.ok());
  const std::string toml = testing::node_toml(dir.sub("data"), models, cache_section(""));
  {
    testing::node_process node(dir.sub("node.toml"), toml);
    ASSERT_TRUE(node.ok());
    ASSERT_EQ(register_publisher(node, pub.pub(), pub.replay()), "subscribed");
    ASSERT_TRUE(pub.wait_subscriber());
    pub.send(0, {1});
    ASSERT_TRUE(eventually([&] { return blocks(node) == 1; }));
    EXPECT_EQ(node.stop(), 0);
  }
  testing::node_process node(dir.sub("node.toml"), toml);
  ASSERT_TRUE(node.ok());
  // No registration this time: the node subscribes by itself.
  ASSERT_TRUE(pub.wait_subscriber());
  pub.send(1, {2});
  EXPECT_TRUE(eventually([&] { return blocks(node) == 2; })) << cache_of(node).dump();
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_publishers") == 1; }));
  // The replay endpoint came back too: a gap after the restart is filled.
  pub.send(2, {3}, /*lose=*/true);
  pub.send(3, {4});
  EXPECT_TRUE(eventually([&] { return blocks(node) == 4; })) << cache_of(node).dump();
  EXPECT_EQ(ingest_counter(node, "gaps_unfilled"), 0u);
}

TEST(NodePublishers, ASilentPublisherIsForgottenWithItsBlocks) {
  testing::temp_dir dir("eldr-pub-forget");
  py_publisher pub("new");
  ASSERT_TRUE(pub.ok());
  const std::string toml =
      testing::node_toml(dir.sub("data"), models, cache_section("publisher_forget_ms = 1500\n"));
  {
    testing::node_process node(dir.sub("node.toml"), toml);
    ASSERT_TRUE(node.ok());
    ASSERT_EQ(register_publisher(node, pub.pub()), "subscribed");
    ASSERT_TRUE(pub.wait_subscriber());
    pub.send(0, {1, 2});
    ASSERT_TRUE(eventually([&] { return blocks(node) == 2; }));
    // It sends nothing more: dropped with its blocks, counted.
    ASSERT_TRUE(eventually([&] { return metric(node, "eldr_publishers_forgotten_total") == 1; }));
    EXPECT_EQ(blocks(node), 0u);
    EXPECT_TRUE(eventually([&] { return metric(node, "eldr_publishers") == 0; }));
    EXPECT_EQ(node.stop(), 0);
  }
  // Its registration went with it: a restart does not follow it again.
  testing::node_process node(dir.sub("node.toml"), toml);
  ASSERT_TRUE(node.ok());
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_publishers") == 0; }));
  EXPECT_EQ(blocks(node), 0u);
}

TEST(NodePublishers, RegistrationsAreBoundedAndOnlyARealSubscriptionIsAcknowledged) {
  testing::temp_dir dir("eldr-pub-bound");
  testing::node_process node(
      dir.sub("node.toml"),
      testing::node_toml(dir.sub("data"), models, cache_section("max_publishers = 3\n")));
  ASSERT_TRUE(node.ok());
  // Publishers need not be up to be followed: ZeroMQ connects when they come.
  EXPECT_EQ(register_publisher(node, "tcp://127.0.0.1:1"), "subscribed");
  EXPECT_EQ(register_publisher(node, "tcp://127.0.0.1:2"), "subscribed");
  // An endpoint that passes the node's checks but that ZeroMQ refuses (no port): an error, and
  // it takes no slot.
  const std::string refused = register_publisher(node, "tcp://127.0.0.1");
  EXPECT_EQ(refused.rfind("error malformed: ZeroMQ refuses publisher endpoint", 0), 0u) << refused;
  EXPECT_EQ(register_publisher(node, "tcp://127.0.0.1:3"), "subscribed");
  // The same endpoint again: nothing new.
  EXPECT_EQ(register_publisher(node, "tcp://127.0.0.1:1"), "subscribed");
  const std::string over = register_publisher(node, "tcp://127.0.0.1:4");
  EXPECT_EQ(over.rfind("error overloaded: ", 0), 0u) << over;
  EXPECT_NE(over.find("signature_cache.max_publishers"), std::string::npos) << over;
  EXPECT_TRUE(eventually([&] { return metric(node, "eldr_publishers") == 3; }));
  EXPECT_TRUE(eventually([&] {
    return metric(node, "eldr_publisher_registrations_refused_total") == 1 &&
           metric(node, "eldr_publisher_subscribe_failed_total") == 1;
  }));
  const json s = testing::admin_status(node.admin());
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["counters"].value("publisher_subscriptions", -1), 3) << s["counters"].dump();
}

}  // namespace
}  // namespace eldr
