// eldr-node refusing what it cannot serve, end to end through real node processes: an invalid
// policy change changes nothing (issue 12 defect 7), a centroid file whose K is not the model's
// workers stops start-up and --check-config (a silent fallback to JSQ before), --check-config
// checks the files start-up reads (defect 13), and /readyz says when the node can route.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cluster/zmq/client.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/node_fixture.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/toy_model.hpp"

namespace eldr {
namespace {

using testing::node_process;
using testing::node_toml;
using testing::run_command;
using testing::temp_dir;

// The toy model (tests/support/toy_model.hpp): worker w's centroid puts its mass on experts 2w
// and 2w+1, so a request whose tokens pick those experts belongs to worker w.
constexpr uint32_t toy_k = testing::toy_workers;

centroid_file toy_centroids(uint32_t k = toy_k) {
  return testing::toy_centroids("toy", k);
}

route_request request_for(const std::string& id, uint32_t w, uint64_t block) {
  return testing::toy_request(id, "toy", w, {block});
}

const char* toy_model_toml =
    "[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 600000\nwiden_single = false\n";

class NodeValidationTest : public testing::node_fixture {
 protected:
  NodeValidationTest() : node_fixture("eldr-node-validation-test") {}

  void start(const std::string& models = toy_model_toml) { start_node(models); }

  void register_workers() { node_fixture::register_workers("toy", toy_k); }

  nlohmann::json model_status() {
    nlohmann::json s = status();
    return s.is_null() ? s : s["models"][0];
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
  EXPECT_EQ(m["policy"], "eldr-adaptive");       // the default, none of the refused ones
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

// One HTTP GET on loopback: (status code, body); code 0 when the exchange failed.
std::pair<int, std::string> http_get(uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {0, ""};
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string in;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
        in.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  if (in.rfind("HTTP/1.1 ", 0) != 0 || in.size() < 12) return {0, in};
  const size_t body = in.find("\r\n\r\n");
  return {std::stoi(in.substr(9, 3)), body == std::string::npos ? "" : in.substr(body + 4)};
}

uint16_t port_of(const std::string& url) {  // http://127.0.0.1:PORT/metrics
  const size_t colon = url.rfind(':');
  return static_cast<uint16_t>(std::stoi(url.substr(colon + 1)));
}

// Polls /readyz until it answers `code` (the router publishes right after it acks, so a probe
// may see the state of a moment before); the last answer either way.
std::pair<int, std::string> readyz_until(uint16_t port, int code) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto r = http_get(port, "/readyz");
  while (r.first != code && std::chrono::steady_clock::now() < deadline)
    r = http_get(port, "/readyz");
  return r;
}

TEST_F(NodeValidationTest, ReadyzIs503UntilAWorkerAndTheCentroidsTheEldrPolicyNeeds) {
  start();
  const uint16_t port = port_of(node_->metrics());
  auto r = http_get(port, "/readyz");
  ASSERT_EQ(r.first, 503) << r.second;
  auto body = nlohmann::json::parse(r.second);
  EXPECT_FALSE(body["ready"].get<bool>());
  EXPECT_EQ(body["reasons"][0]["model"], "toy");
  EXPECT_EQ(body["reasons"][0]["part"], "workers");
  EXPECT_EQ(http_get(port, "/healthz"), (std::pair<int, std::string>{200, "ok"}));

  register_workers();
  // Workers now, but policy eldr has no centroid set yet.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    r = http_get(port, "/readyz");
    body = nlohmann::json::parse(r.second, nullptr, false);
  } while (body.is_object() && body["reasons"].size() != 1 &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(r.first, 503) << r.second;
  ASSERT_EQ(body["reasons"].size(), 1u) << r.second;
  EXPECT_EQ(body["reasons"][0]["part"], "centroids");

  auto imp = admin_->call(
      "centroids.import",
      {{"model", "toy"}, {"file", nlohmann::json::binary(encode_centroid_file(toy_centroids()))}});
  ASSERT_TRUE(imp.ok()) << imp.error().to_string();
  r = readyz_until(port, 200);
  ASSERT_EQ(r.first, 200) << r.second;
  EXPECT_EQ(nlohmann::json::parse(r.second),
            (nlohmann::json{{"ready", true},
                            {"reasons", nlohmann::json::array()},
                            {"degraded", nlohmann::json::array()}}));

  // Draining every worker makes it unready again.
  for (uint32_t w = 0; w < toy_k; ++w)
    ASSERT_TRUE(admin_->call("drain", {{"model", "toy"}, {"worker", w}}).ok());
  EXPECT_EQ(readyz_until(port, 503).first, 503);
}

TEST_F(NodeValidationTest, ReadyzWithAPolicyThatNeedsNoSetWaitsForOneWorkerOnly) {
  start("[[models]]\nname = \"toy\"\nworkers = 4\npolicy = \"jsq\"\nworker_timeout_ms = 600000\n");
  const uint16_t port = port_of(node_->metrics());
  ASSERT_EQ(http_get(port, "/readyz").first, 503);
  auto r = worker_->call(worker_register{"", "toy", 2, "tcp://10.0.0.2:9", 0, ""});
  ASSERT_TRUE(r.ok());
  const auto ready = readyz_until(port, 200);
  EXPECT_EQ(ready.first, 200) << ready.second;
}

// --check-config and start-up, through the eldr-node binary.
class NodeConfigCheckTest : public ::testing::Test {
 protected:
  // eldr-node --config (written from `toml`) [--check-config], bounded by `timeout`: a node that
  // starts although it should not is killed after 30 s and the test fails on its exit code.
  testing::process_result run_node(const std::string& toml, bool check_only) {
    std::ofstream(dir_.sub("node.toml")) << toml;
    return run_command("timeout 30 " + testing::node_binary() + " --config " +
                       dir_.sub("node.toml") + (check_only ? " --check-config" : ""));
  }
  std::string toml(const std::string& models, const std::string& extra = "") {
    return node_toml(dir_.sub("data"), models, extra);
  }
  temp_dir dir_{"eldr-node-config-check"};
};

// Issue 12 defect 13: --check-config said valid for each of these, and the node then failed to
// start (or, for the secret directory, said "no key in the file").
TEST_F(NodeConfigCheckTest, CheckConfigFailsWhereStartUpWould) {
  const std::string model = "[[models]]\nname = \"m\"\n";
  auto r = run_node(toml(model), true);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string cluster =
      "[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"" + dir_.sub("secret") + "\"\n";
  r = run_node(toml(model, cluster), true);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cluster.secret_file: \"" + dir_.sub("secret") + "\": no such file"),
            std::string::npos)
      << r.output;

  std::filesystem::create_directory(dir_.sub("curve"));
  r = run_node(toml(model, "[security]\ncurve_secret_key_file = \"" + dir_.sub("curve") + "\"\n"),
               true);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a directory, not a file"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no key in the file"), std::string::npos) << r.output;

  r = run_node(toml(model + "centroids = \"" + dir_.sub("none.centroids") + "\"\n"), true);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("models[0].centroids"), std::string::npos) << r.output;

  std::ofstream(dir_.sub("data")) << "a file";
  r = run_node(toml(model), true);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("node.data_dir"), std::string::npos) << r.output;
  r = run_node(toml(model), false);  // and start-up says the same
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("node.data_dir"), std::string::npos) << r.output;

  r = run_node(toml(model, "[signature_cache]\ncommit_interval_ms = 0\n"), true);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("signature_cache.commit_interval_ms: must be >= 5, got 0"),
            std::string::npos)
      << r.output;
}

// The silent fallback: workers = 4 with a centroid file of K = 8 started, logged the file as
// loaded as epoch 1, and routed by load only with every score 0.
TEST_F(NodeConfigCheckTest, CentroidFileOfAnotherKIsRefusedAtCheckAndStartUp) {
  ASSERT_TRUE(write_centroid_file(toy_centroids(8), dir_.sub("k8.centroids")).ok());
  const std::string models =
      "[[models]]\nname = \"toy\"\nworkers = 4\ncentroids = \"" + dir_.sub("k8.centroids") + "\"\n";
  for (bool check_only : {true, false}) {
    auto r = run_node(toml(models), check_only);
    EXPECT_EQ(r.exit_code, 2) << r.output;  // a config error, at check or start-up
    EXPECT_NE(r.output.find("models[0].workers = 4"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("models[0].centroids"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("K = 8"), std::string::npos) << r.output;
  }
}

// The same mismatch found in the store on a warm restart: the config's workers changed.
TEST_F(NodeConfigCheckTest, StoredSetOfAnotherKIsRefusedAtStartUp) {
  {
    node_process node(dir_.sub("first.toml"),
                      toml("[[models]]\nname = \"toy\"\nworkers = 4\nwiden_single = false\n"));
    ASSERT_TRUE(node.ok());
    auto admin = admin_client::connect(node.admin());
    ASSERT_TRUE(admin.ok());
    auto imp =
        (*admin)->call("centroids.import",
                       {{"model", "toy"},
                        {"file", nlohmann::json::binary(encode_centroid_file(toy_centroids(4)))}});
    ASSERT_TRUE(imp.ok()) << imp.error().to_string();
    EXPECT_EQ(node.stop(), 0);
  }
  auto r = run_node(toml("[[models]]\nname = \"toy\"\nworkers = 8\n"), false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("models[0].workers = 8 but the current centroid set of model toy"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("has K = 4"), std::string::npos) << r.output;
}

// /readyz in a cluster: not ready while the node sees no majority of the members it knows (its
// seeds count), ready once it has joined. Signature-cache nodes, so that workers and centroid
// sets do not enter the verdict.
TEST_F(NodeConfigCheckTest, ReadyzWaitsForClusterMembership) {
  std::ofstream(dir_.sub("secret")) << "a-cluster-secret-of-enough-bytes\n";
  auto node_toml_for = [&](const std::string& name, const std::string& seed) {
    return "[node]\nname = \"" + name + "\"\ndata_dir = \"" + dir_.sub(name + "-data") +
           "\"\nroles = [\"signature-cache\"]\n[endpoints]\nroute = \"tcp://127.0.0.1:0\"\n"
           "worker = \"tcp://127.0.0.1:0\"\nadmin = \"tcp://127.0.0.1:0\"\n"
           "metrics = \"127.0.0.1:0\"\n[runtime]\nlog_level = \"warn\"\n[cluster]\n"
           "listen = \"127.0.0.1:0\"\nheartbeat_ms = 100\nconnection_timeout_ms = 600\n"
           "reconnect_ms = 100\nsecret_file = \"" +
           dir_.sub("secret") + "\"\nseeds = [" + (seed.empty() ? "" : "\"" + seed + "\"") +
           "]\n[[models]]\nname = \"m\"\n";
  };
  node_process first(dir_.sub("n1.toml"), node_toml_for("n1", ""));
  ASSERT_TRUE(first.ok());
  // Alone with no seed: a cluster of one is formed.
  auto r = readyz_until(port_of(first.metrics()), 200);
  EXPECT_EQ(r.first, 200) << r.second;

  // A seed that never answers (a port nothing listens on): one of two known members seen.
  node_process lost(dir_.sub("n2.toml"), node_toml_for("n2", "127.0.0.1:1"));
  ASSERT_TRUE(lost.ok());
  // The first verdict may predate the cluster actor's first count ("not formed yet").
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  nlohmann::json body;
  do {
    r = http_get(port_of(lost.metrics()), "/readyz");
    body = nlohmann::json::parse(r.second, nullptr, false);
  } while (r.second.find("sees 1 of 2") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(r.first, 503) << r.second;
  ASSERT_TRUE(body.is_object()) << r.second;
  ASSERT_EQ(body["reasons"].size(), 1u) << r.second;
  EXPECT_EQ(body["reasons"][0]["part"], "cluster");
  EXPECT_NE(body["reasons"][0]["reason"].get<std::string>().find("sees 1 of 2"), std::string::npos)
      << r.second;

  // Joining through a live seed: ready once the join is done.
  node_process joined(dir_.sub("n3.toml"), node_toml_for("n3", first.cluster()));
  ASSERT_TRUE(joined.ok());
  r = readyz_until(port_of(joined.metrics()), 200);
  EXPECT_EQ(r.first, 200) << r.second;
}

}  // namespace
}  // namespace eldr
