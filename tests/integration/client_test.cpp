// client: the C++ client library against real ZeroMQ sockets on loopback. A fake node -- a ROUTER
// bound to port 0 and a thread answering with a test-chosen handler -- checks the wire framing
// (one frame per message), and the tests check synchronous calls, pipelining with many requests
// outstanding matched by id, late and undecodable replies, timeouts, error replies and an admin
// call carrying a binary blob both ways.
#include "cluster/zmq/client.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "tests/support/fake_zmq_node.hpp"

namespace eldr {
namespace {

using nlohmann::json;
using bytes_t = std::vector<uint8_t>;

using fake_node = testing::fake_zmq_node;

route_reply answer(const route_request& q) {
  route_reply r;
  r.id = q.id;
  r.worker = static_cast<uint32_t>(q.block_hashes.size());
  r.endpoint = "tcp://10.0.0.1:5600";
  r.epoch = 7;
  r.total_blocks = static_cast<uint32_t>(q.block_hashes.size());
  return r;
}

// Answers every route request with answer(); an undecodable one with an anonymous error_reply.
std::vector<bytes_t> route_handler(std::span<const uint8_t> in) {
  std::vector<kv_decode_issue> issues;
  auto q = decode_route_request(in, {}, issues);
  if (!q.ok())
    return {
        encode_error_reply({std::nullopt, wire_error_for_decode(q.error()), q.error().message()})};
  return {encode_route_reply(answer(*q))};
}

route_request request(std::string id, size_t blocks) {
  route_request q;
  q.id = std::move(id);
  q.model = "m";
  for (size_t i = 0; i < blocks; ++i)
    q.block_hashes.push_back(1000 + i);
  return q;
}

TEST(Client, RouteSyncCall) {
  zmq::context_t ctx(1);
  fake_node node(ctx, route_handler);
  auto c = route_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok()) << c.error().to_string();

  auto r = (*c)->route(request("req-1", 3));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(std::holds_alternative<route_reply>(*r));
  EXPECT_EQ(std::get<route_reply>(*r), answer(request("req-1", 3)));

  // A request without an id gets one from the client, echoed back.
  auto r2 = (*c)->route(request("", 2));
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  ASSERT_TRUE(std::holds_alternative<route_reply>(*r2));
  EXPECT_FALSE(std::get<route_reply>(*r2).id.empty());
  EXPECT_EQ(std::get<route_reply>(*r2).worker, 2u);
  EXPECT_EQ(node.bad_frames(), 0u);
}

TEST(Client, PipelinedRepliesMatchedById) {
  // The node holds every request until it has all of them, then answers in reverse order.
  constexpr size_t n = 300;
  std::vector<route_request> held;
  zmq::context_t ctx(1);
  fake_node node(ctx, [&](std::span<const uint8_t> in) {
    std::vector<kv_decode_issue> issues;
    auto q = decode_route_request(in, {}, issues);
    EXPECT_TRUE(q.ok());
    if (q.ok()) held.push_back(*q);
    std::vector<bytes_t> out;
    if (held.size() == n) {
      for (auto it = held.rbegin(); it != held.rend(); ++it)
        out.push_back(encode_route_reply(answer(*it)));
    }
    return out;
  });
  auto c = route_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  for (size_t i = 0; i < n; ++i)
    ASSERT_TRUE((*c)->send(request("r" + std::to_string(i), i % 17)).ok());

  std::map<std::string, route_reply> got;
  for (size_t i = 0; i < n; ++i) {
    auto r = (*c)->receive(5000);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    ASSERT_TRUE(std::holds_alternative<route_reply>(*r));
    const auto& reply = std::get<route_reply>(*r);
    EXPECT_TRUE(got.emplace(reply.id, reply).second) << reply.id;
    if (i == 0) {
      EXPECT_EQ(reply.id, "r" + std::to_string(n - 1));  // reverse order arrives
    }
  }
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(got.count(id)) << id;
    EXPECT_EQ(got[id].worker, i % 17) << id;
  }
}

TEST(Client, LateAndUndecodableReplies) {
  // First request: a late reply to another id comes first, then the answer. Second: garbage.
  // Third: normal -- the client stays usable after a corrupt reply.
  std::atomic<int> calls{0};
  zmq::context_t ctx(1);
  fake_node node(ctx, [&](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    const int k = calls++;
    std::vector<kv_decode_issue> issues;
    auto q = decode_route_request(in, {}, issues);
    if (!q.ok()) return {};
    if (k == 0) {
      route_request old = *q;
      old.id = "old";
      return {encode_route_reply(answer(old)), encode_route_reply(answer(*q))};
    }
    if (k == 1) return {bytes_t{0xc1, 0x00, 0x01}};
    return {encode_route_reply(answer(*q))};
  });
  auto c = route_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok()) << c.error().to_string();

  auto r = (*c)->route(request("new", 4));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(std::get<route_reply>(*r).id, "new");

  auto bad = (*c)->route(request("x", 1));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), status_code::corrupt) << bad.error().to_string();

  auto again = (*c)->route(request("y", 5));
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ(std::get<route_reply>(*again).id, "y");
  EXPECT_EQ(std::get<route_reply>(*again).worker, 5u);
}

TEST(Client, TimeoutIsAnError) {
  // A node that never answers: the ROUTER is bound, nobody reads it.
  zmq::context_t ctx(1);
  zmq::socket_t silent(ctx, zmq::socket_type::router);
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  const std::string endpoint = silent.get(zmq::sockopt::last_endpoint);

  client_options o;
  o.timeout_ms = 100;
  o.context = &ctx;  // shared context
  auto c = route_client::connect(endpoint, o);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const auto start = std::chrono::steady_clock::now();
  auto r = (*c)->route(request("r", 1));
  const auto spent = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::failed_precondition);
  EXPECT_NE(r.error().message().find("timeout after 100 ms"), std::string::npos)
      << r.error().message();
  EXPECT_GE(spent, std::chrono::milliseconds(90));

  ASSERT_TRUE((*c)->send(request("r2", 1)).ok());
  auto p = (*c)->receive(30);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message().find("timeout"), std::string::npos);

  auto w = worker_client::connect(endpoint, o);
  ASSERT_TRUE(w.ok());
  auto wr = (*w)->call(worker_drain{"", "m", 1, true});
  ASSERT_FALSE(wr.ok());
  EXPECT_EQ(wr.error().code(), status_code::failed_precondition);

  auto a = admin_client::connect(endpoint, o);
  ASSERT_TRUE(a.ok());
  auto ar = (*a)->call("status");
  ASSERT_FALSE(ar.ok());
  EXPECT_EQ(ar.error().code(), status_code::failed_precondition);
}

TEST(Client, ErrorRepliesAreSurfaced) {
  zmq::context_t ctx(1);
  fake_node node(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    std::vector<kv_decode_issue> issues;
    auto q = decode_route_request(in, {}, issues);
    if (!q.ok()) return {};
    if (q->model == "anonymous")  // the node could not read the id
      return {encode_error_reply({std::nullopt, wire_error_code::malformed, "bad"})};
    return {encode_error_reply({q->id, wire_error_code::unknown_model, "no pool"})};
  });
  auto c = route_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok());
  auto r = (*c)->route(request("q", 1));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(std::holds_alternative<error_reply>(*r));
  EXPECT_EQ(std::get<error_reply>(*r),
            (error_reply{std::string("q"), wire_error_code::unknown_model, "no pool"}));

  route_request anon = request("q2", 1);
  anon.model = "anonymous";
  auto r2 = (*c)->route(anon);
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  ASSERT_TRUE(std::holds_alternative<error_reply>(*r2));
  EXPECT_FALSE(std::get<error_reply>(*r2).id);
  EXPECT_EQ(std::get<error_reply>(*r2).code, wire_error_code::malformed);
}

TEST(Client, WorkerCallsAndPipelining) {
  zmq::context_t ctx(1);
  fake_node node(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    auto m = decode_worker_message(in, {});
    if (!m.ok())
      return {encode_error_reply({std::nullopt, wire_error_for_decode(m.error()), "bad"})};
    const std::string id = worker_message_id(*m);
    if (const auto* d = std::get_if<worker_drain>(&*m))
      return {encode_worker_ack({id, d->drain ? "draining" : "active", 4})};
    if (const auto* r = std::get_if<worker_register>(&*m)) {
      if (r->model != "m") return {encode_error_reply({id, wire_error_code::unknown_model, "?"})};
      return {encode_worker_ack({id, "active", 4})};
    }
    if (std::holds_alternative<publisher_register>(*m))
      return {encode_worker_ack({id, "subscribed", 4})};
    return {encode_worker_ack({id, "active", 4})};
  });
  auto c = worker_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok()) << c.error().to_string();

  auto a = (*c)->call(worker_register{"reg-1", "m", 2, "tcp://10.0.0.2:5600", 8, ""});
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  ASSERT_TRUE(std::holds_alternative<worker_ack>(*a));
  EXPECT_EQ(std::get<worker_ack>(*a), (worker_ack{"reg-1", "active", 4}));

  auto d = (*c)->call(worker_drain{"", "m", 2, true});  // the client assigns an id
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(std::get<worker_ack>(*d).state, "draining");
  EXPECT_FALSE(std::get<worker_ack>(*d).id.empty());

  auto e = (*c)->call(worker_register{"reg-2", "other", 2, "tcp://10.0.0.2:5600", 8, ""});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  ASSERT_TRUE(std::holds_alternative<error_reply>(*e));
  EXPECT_EQ(std::get<error_reply>(*e).code, wire_error_code::unknown_model);

  // Pipelined load reports and finished messages.
  for (uint64_t s = 1; s <= 50; ++s) {
    load_report l;
    l.id = "l" + std::to_string(s);
    l.model = "m";
    l.worker = 2;
    l.in_flight = 3;
    l.seq = s;
    ASSERT_TRUE((*c)->send(l).ok());
    ASSERT_TRUE((*c)->send(finished_requests{"f" + std::to_string(s), "m", 2, {"a", "b"}}).ok());
  }
  std::map<std::string, int> acks;
  for (int i = 0; i < 100; ++i) {
    auto r = (*c)->receive(5000);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    ++acks[std::get<worker_ack>(*r).id];
  }
  EXPECT_EQ(acks.size(), 100u);
  EXPECT_EQ(acks.count("l50"), 1u);
  EXPECT_EQ(acks.count("f1"), 1u);

  auto p = (*c)->call(publisher_register{"", "m", "tcp://10.0.0.9:5557", ""});
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(std::get<worker_ack>(*p).state, "subscribed");
  EXPECT_EQ(node.bad_frames(), 0u);
}

TEST(Client, AdminCallWithBinaryBlobRoundTrip) {
  zmq::context_t ctx(1);
  fake_node node(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    auto q = decode_admin_request(in, {});
    admin_reply r;
    if (!q.ok()) {
      r.code = wire_error_for_decode(q.error());
      r.error = q.error().message();
      return {encode_admin_reply(r)};
    }
    r.id = q->id;
    if (q->command == "centroids.import") {
      r.ok = true;
      // Echo the blob back with its size, as a result map.
      r.result = {
          {"epoch", 3}, {"bytes", q->args["file"].get_binary().size()}, {"file", q->args["file"]}};
    } else if (q->command == "drain") {
      r.code = wire_error_code::unknown_model;
      r.error = "no pool serves model \"" + q->args.value("model", "") + "\"";
    } else if (q->command == "refit") {
      r.code = wire_error_code::no_eligible_worker;
      r.error = "busy";
    } else if (q->command == "legacy") {
      return {encode_error_reply({q->id, wire_error_code::unknown_type, "unknown command"})};
    } else {
      r.ok = true;  // "status": no result
    }
    return {encode_admin_reply(r)};
  });
  auto c = admin_client::connect(node.endpoint());
  ASSERT_TRUE(c.ok()) << c.error().to_string();

  std::vector<uint8_t> blob(3u << 20);  // 3 MiB, like a large centroid file
  std::mt19937 rng(7);
  for (auto& b : blob)
    b = static_cast<uint8_t>(rng());
  auto r = (*c)->call("centroids.import", {{"model", "m"}, {"file", json::binary(blob)}});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ((*r)["epoch"], 3);
  EXPECT_EQ((*r)["bytes"], blob.size());
  ASSERT_TRUE((*r)["file"].is_binary());
  EXPECT_TRUE(static_cast<const std::vector<uint8_t>&>((*r)["file"].get_binary()) == blob);

  auto s = (*c)->call("status");
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_TRUE(s->is_null());

  auto d = (*c)->call("drain", {{"model", "x"}, {"worker", 1}});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), status_code::invalid_argument);
  EXPECT_EQ(d.error().message(), "unknown_model: no pool serves model \"x\"");

  auto f = (*c)->call("refit", {{"model", "m"}});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), status_code::failed_precondition);
  EXPECT_EQ(f.error().message(), "no_eligible_worker: busy");

  auto l = (*c)->call("legacy");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().message(), "unknown_type: unknown command");

  auto bad_args = (*c)->call("status", json::array({1}));
  ASSERT_FALSE(bad_args.ok());
  EXPECT_EQ(bad_args.error().code(), status_code::invalid_argument);
}

TEST(Client, BadEndpointIsRefused) {
  auto c = route_client::connect("not-an-endpoint");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), status_code::invalid_argument);
  EXPECT_FALSE(admin_client::connect("tcp://").ok());
}

}  // namespace
}  // namespace eldr
