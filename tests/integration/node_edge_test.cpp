// A real eldr-node against hostile clients at its edge (issue 12, defects 1, 8 and 9): frame
// shapes no client library sends cannot switch routing off, admin arguments of the wrong type or
// range are refused naming the argument and change nothing, and strings are checked where they
// arrive (endpoints, ids) so that what the node later shows and echoes stays readable.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/zmq/client.hpp"
#include "tests/support/node_fixture.hpp"
#include "tests/support/process.hpp"
#include "tests/support/refused_registrations.hpp"
#include "tests/support/zmq_frames.hpp"

namespace eldr {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const char* model_toml =
    "[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 600000\nwiden_single = false\n";

class NodeEdgeTest : public testing::node_fixture {
 protected:
  NodeEdgeTest() : node_fixture("eldr-node-edge") {}

  void start(const std::string& extra = "") {
    ASSERT_NO_FATAL_FAILURE(start_node(model_toml, extra));
    register_workers("toy", 4, "tcp://10.0.0.", "");
  }

  route_request request(const std::string& id) {
    route_request r;
    r.id = id;
    r.model = "toy";
    r.block_hashes = {1, 2};
    return r;
  }

  void expect_routed(const std::string& id) {
    auto r = route_->route(request(id));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    if (auto* e = std::get_if<error_reply>(&*r))
      FAIL() << id << ": error reply " << to_string(e->code) << ": " << e->message;
    EXPECT_EQ(std::get<route_reply>(*r).id, id);
  }

  json counters() {
    json s = status();
    return s.is_null() ? s : s["counters"];
  }

  // Polls status until `done` holds for its counters, or the deadline passes.
  bool counters_reach(const std::function<bool(const json&)>& done) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < until)
      if (done(counters())) return true;
    return false;
  }

  // The worker states `eldrctl workers` shows, by index.
  std::vector<std::string> worker_states() {
    std::vector<std::string> out;
    auto ws = admin_->call("workers", {{"model", "toy"}});
    EXPECT_TRUE(ws.ok()) << ws.error().to_string();
    if (ws.ok())
      for (const auto& w : *ws)
        out.push_back(w.value("state", ""));
    return out;
  }
};

using testing::receive;
using testing::send_frames;

TEST_F(NodeEdgeTest, NoFrameShapeSwitchesRoutingOff) {
  start("[limits]\nmax_pending = 4\n");
  zmq::context_t ctx;
  const auto payload = encode_route_request(request("shape"));
  const std::vector<uint8_t> empty;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect(node_->route());
  // Each is answered (malformed) and took no slot; before the fix, each answer released one.
  const std::vector<std::vector<std::vector<uint8_t>>> shapes = {{payload, payload},
                                                                 {payload, payload, payload},
                                                                 {empty, empty, payload},
                                                                 {empty, payload, payload}};
  int sent = 0;
  for (int round = 0; round < 4; ++round)
    for (const auto& frames : shapes) {
      send_frames(d, frames);
      ++sent;
    }
  for (int i = 0; i < sent; ++i)
    ASSERT_FALSE(receive(d).empty()) << "answer " << i;
  zmq::socket_t req(ctx, zmq::socket_type::req);  // a multipart REQ
  req.set(zmq::sockopt::linger, 0);
  req.connect(node_->route());
  send_frames(req, {payload, payload});
  auto answer = receive(req);
  ASSERT_EQ(answer.size(), 1u) << "a REQ peer gets its error behind the delimiter";
  auto e =
      decode_error_reply({static_cast<const uint8_t*>(answer[0].data()), answer[0].size()}, {});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->code, wire_error_code::malformed);

  for (int i = 0; i < 20; ++i)
    expect_routed("after-" + std::to_string(i));
  EXPECT_TRUE(counters_reach([&](const json& c) {
    return c.value("pending", -1) == 0 && c.value("bad_frames", 0) == sent + 1;
  })) << counters().dump();
  EXPECT_EQ(counters().value("overloaded", -1), 0);
  // /metrics reads the same counts the status shows (the frontend's counters, one registry).
  const json c = counters();
  const std::string text = testing::run_command("curl -s --max-time 5 " + node_->metrics()).output;
  const auto shows = [&](const std::string& series, const json& value) {
    return text.find("\n" + series + " " + value.dump() + "\n") != std::string::npos;
  };
  EXPECT_TRUE(shows("eldr_frontend_refused_total{reason=\"bad_frames\"}", c["bad_frames"])) << text;
  EXPECT_TRUE(shows("eldr_frontend_refused_total{reason=\"overloaded\"}", c["overloaded"])) << text;
  EXPECT_TRUE(shows("eldr_frontend_pending", c["pending"])) << text;
  EXPECT_NE(text.find("eldr_frontend_received_total{channel=\"route\"} "), std::string::npos);
}

TEST_F(NodeEdgeTest, AdminUnsignedArgumentsAreRefusedNamingTheArgument) {
  start();
  // Each of these drained worker 0 or 1 before: converted, wrapped or truncated.
  for (const json& bad : {json(4294967296ull), json(4294967297ull), json(1.9), json(true), json(-1),
                          json("1"), json::array({1})}) {
    auto r = admin_->call("drain", {{"model", "toy"}, {"worker", bad}});
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_EQ(
        r.error().message(),
        "malformed: argument 'worker' must be an unsigned integer <= 4294967295, got " + bad.dump())
        << bad.dump();
  }
  EXPECT_EQ(worker_states(), (std::vector<std::string>{"active", "active", "active", "active"}));
  auto drained = admin_->call("drain", {{"model", "toy"}, {"worker", 1}});
  ASSERT_TRUE(drained.ok()) << drained.error().to_string();
  EXPECT_EQ(worker_states()[1], "draining");

  auto swap = admin_->call("centroids.swap", {{"model", "toy"}, {"epoch", -1}});
  ASSERT_FALSE(swap.ok());
  EXPECT_EQ(swap.error().message(),
            "malformed: argument 'epoch' must be an unsigned integer <= 18446744073709551615, "
            "got -1");
  auto exported = admin_->call("centroids.export", {{"model", "toy"}, {"epoch", -1}});
  ASSERT_FALSE(exported.ok());
  EXPECT_NE(exported.error().message().find("argument 'epoch'"), std::string::npos)
      << exported.error().message();
  for (const char* command : {"workers", "centroids.show", "refit", "centroids.export"}) {
    auto r = admin_->call(command, {{"model", 7}});
    ASSERT_FALSE(r.ok()) << command;
    EXPECT_EQ(r.error().message(), "malformed: argument 'model' must be a string, got 7")
        << command;
  }
  auto explain = admin_->call("explain", {{"model", "toy"}, {"request", 12}});
  ASSERT_FALSE(explain.ok());
  EXPECT_EQ(explain.error().message(), "malformed: argument 'request' must be a string, got 12");
}

TEST_F(NodeEdgeTest, ClientStringsAreCheckedWhereTheyArrive) {
  start();
  auto refused = [&](const worker_message& m) -> std::string {
    auto r = worker_->call(m);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok()) return "";
    auto* e = std::get_if<error_reply>(&*r);
    EXPECT_NE(e, nullptr) << worker_message_type(m) << " was accepted";
    if (!e) return "";
    EXPECT_EQ(e->code, wire_error_code::malformed);
    return e->message;
  };
  const auto cases = testing::refused_registrations("toy", 2);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(refused(cases[i].message), cases[i].error) << "case " << i;
  // Worker 2 kept its registration, and every route reply still decodes.
  auto ws = admin_->call("workers", {{"model", "toy"}});
  ASSERT_TRUE(ws.ok()) << ws.error().to_string();
  EXPECT_EQ((*ws)[2].value("endpoint", ""), "tcp://10.0.0.2");
  for (int i = 0; i < 8; ++i)
    expect_routed("r" + std::to_string(i));

  // A route id that is not UTF-8 is refused before anything echoes it.
  zmq::context_t ctx;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect(node_->route());
  const auto bad_id = encode_route_request(request("id-\xc0\xaf"));
  d.send(zmq::buffer(bad_id), zmq::send_flags::none);
  auto answer = receive(d);
  ASSERT_EQ(answer.size(), 1u);
  auto e =
      decode_error_reply({static_cast<const uint8_t*>(answer[0].data()), answer[0].size()}, {});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->code, wire_error_code::malformed);
  EXPECT_FALSE(e->id.has_value());
  EXPECT_EQ(e->message, "route_request.id: not valid UTF-8 at byte 3 (0xc0)");
}

}  // namespace
}  // namespace eldr
