// client failover and CURVE: the C++ clients (cluster/zmq/client.hpp) given several endpoints,
// against fake nodes -- ROUTER sockets bound to port 0 on loopback, served by threads with a
// scripted handler -- and against a closed port. Checks that a timed-out call is resent with the
// same id to the next endpoint, that a late answer from an endpoint given up on never answers a
// later request (synchronous or pipelined), that the call fails after max_attempts, and that CURVE
// works with the right server key, times out with a wrong one and refuses malformed keys. The
// Python client's equivalent (tests/integration/py/client_failover.py) runs here too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/security/curve_keys.hpp"
#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "cluster/zmq/client.hpp"
#include "tests/support/fake_zmq_node.hpp"
#include "tests/support/process.hpp"

namespace eldr {
namespace {

using bytes_t = std::vector<uint8_t>;
using namespace std::chrono_literals;

using fake_node = testing::fake_zmq_node;

route_request request(std::string id) {
  route_request q;
  q.id = std::move(id);
  q.model = "m";
  q.block_hashes = {1, 2, 3};
  return q;
}

bytes_t route_answer(const std::string& id, uint32_t worker) {
  route_reply r;
  r.id = id;
  r.worker = worker;
  r.endpoint = "tcp://10.0.0." + std::to_string(worker) + ":5600";
  r.epoch = 1;
  r.total_blocks = 3;
  return encode_route_reply(r);
}

std::string id_of(std::span<const uint8_t> in) {
  std::vector<kv_decode_issue> issues;
  auto q = decode_route_request(in, {}, issues);
  return q.ok() ? q->id : "";
}

// Answers every route request as worker `worker`.
fake_node::handler answering(uint32_t worker) {
  return [worker](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    return {route_answer(id_of(in), worker)};
  };
}
// Never answers.
std::vector<bytes_t> silent(std::span<const uint8_t>) {
  return {};
}

// An endpoint nothing listens on: a port bound, read and released.
std::string closed_port(zmq::context_t& ctx) {
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  s.bind("tcp://127.0.0.1:*");
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  s.close();
  return ep;
}

client_options fast(zmq::context_t& ctx, int timeout_ms = 150) {
  client_options o;
  o.timeout_ms = timeout_ms;
  o.context = &ctx;
  return o;
}

const route_reply& as_reply(const result<route_outcome>& r) {
  static const route_reply none{};
  if (!r.ok() || !std::holds_alternative<route_reply>(*r)) {
    ADD_FAILURE() << (r.ok() ? std::string("an error_reply") : r.error().to_string());
    return none;
  }
  return std::get<route_reply>(*r);
}

// The resend is marked `retry: true` (docs/cluster.md, "Retries: ask, don't broadcast"), so that
// a router that does not know the id asks its peers; the first attempt is sent as given.
TEST(ClientFailover, TheResendIsMarkedRetry) {
  zmq::context_t ctx(1);
  fake_node a(ctx, silent), b(ctx, answering(2));
  auto c = route_client::connect({a.endpoint(), b.endpoint()}, fast(ctx));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(as_reply((*c)->route(request("req-r"))).worker, 2u);
  auto decode = [](const bytes_t& payload) {
    std::vector<kv_decode_issue> issues;
    return decode_route_request(payload, {}, issues);
  };
  const auto first = decode(a.wait_received(1).at(0));
  const auto resent = decode(b.wait_received(1).at(0));
  ASSERT_TRUE(first.ok() && resent.ok());
  EXPECT_EQ(first->id, "req-r");
  EXPECT_FALSE(first->retry);
  EXPECT_EQ(resent->id, "req-r");
  EXPECT_TRUE(resent->retry);
}

TEST(ClientFailover, SilentFirstEndpointFailsOverWithTheSameId) {
  zmq::context_t ctx(1);
  fake_node a(ctx, silent), b(ctx, answering(2));
  auto c = route_client::connect({a.endpoint(), b.endpoint()}, fast(ctx));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ((*c)->last_endpoint(), "");

  auto r = (*c)->route(request("req-1"));
  EXPECT_EQ(as_reply(r).id, "req-1");
  EXPECT_EQ(as_reply(r).worker, 2u);
  EXPECT_EQ((*c)->failovers(), 1u);
  EXPECT_EQ((*c)->last_endpoint(), b.endpoint());
  // Both nodes saw the same request id.
  EXPECT_EQ(id_of(a.wait_received(1).at(0)), "req-1");
  EXPECT_EQ(id_of(b.wait_received(1).at(0)), "req-1");

  // The next call starts at the endpoint that answered: no failover.
  auto r2 = (*c)->route(request("req-2"));
  EXPECT_EQ(as_reply(r2).id, "req-2");
  EXPECT_EQ((*c)->failovers(), 1u);
  EXPECT_EQ(a.wait_received(1).size(), 1u);

  // A generated id is resent unchanged too.
  fake_node a2(ctx, silent), b2(ctx, answering(3));
  auto c2 = route_client::connect({a2.endpoint(), b2.endpoint()}, fast(ctx));
  ASSERT_TRUE(c2.ok());
  auto r3 = (*c2)->route(request(""));
  const std::string gen = as_reply(r3).id;
  EXPECT_EQ(gen.rfind("c", 0), 0u) << gen;
  EXPECT_EQ(id_of(a2.wait_received(1).at(0)), gen);
  EXPECT_EQ(id_of(b2.wait_received(1).at(0)), gen);
}

TEST(ClientFailover, ClosedPortFailsOver) {
  zmq::context_t ctx(1);
  fake_node b(ctx, answering(5));
  auto c = route_client::connect({closed_port(ctx), b.endpoint()}, fast(ctx));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  auto r = (*c)->route(request("x"));
  EXPECT_EQ(as_reply(r).worker, 5u);
  EXPECT_EQ((*c)->failovers(), 1u);
  EXPECT_EQ((*c)->last_endpoint(), b.endpoint());

  // Pipelined use goes to the current endpoint (the one that answered).
  ASSERT_TRUE((*c)->send(request("p1")).ok());
  auto p = (*c)->receive(5000);
  EXPECT_EQ(as_reply(p).id, "p1");
}

TEST(ClientFailover, LateRepliesNeverAnswerLaterRequests) {
  // A holds r1 and answers it late, when r2 comes (before r2's own answer); B holds r2 and
  // answers it late, in front of p1's answer. The calls: r1 (A times out, B answers), r2 (B times
  // out, A answers: r1's late answer is dropped), r3 (A holds it, B answers), then pipelined p1 on
  // B, whose receive() must skip r2's late answer.
  zmq::context_t ctx(1);
  fake_node a(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    const std::string id = id_of(in);
    if (id == "r2") return {route_answer("r1", 100), route_answer("r2", 1)};
    return {};  // r1, r3: silent
  });
  fake_node b(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    const std::string id = id_of(in);
    if (id == "r2") return {};
    if (id == "p1") return {route_answer("r2", 200), route_answer("p1", 2)};
    return {route_answer(id, 2)};
  });
  auto c = route_client::connect({a.endpoint(), b.endpoint()}, fast(ctx));
  ASSERT_TRUE(c.ok()) << c.error().to_string();

  auto r1 = (*c)->route(request("r1"));
  EXPECT_EQ(as_reply(r1).id, "r1");
  EXPECT_EQ(as_reply(r1).worker, 2u);
  EXPECT_EQ((*c)->last_endpoint(), b.endpoint());

  auto r2 = (*c)->route(request("r2"));
  EXPECT_EQ(as_reply(r2).id, "r2");
  EXPECT_EQ(as_reply(r2).worker, 1u);  // A's answer to r2, not its late answer to r1
  EXPECT_EQ((*c)->last_endpoint(), a.endpoint());

  auto r3 = (*c)->route(request("r3"));
  EXPECT_EQ(as_reply(r3).id, "r3");
  EXPECT_EQ((*c)->last_endpoint(), b.endpoint());
  EXPECT_EQ((*c)->failovers(), 3u);

  ASSERT_TRUE((*c)->send(request("p1")).ok());
  auto p1 = (*c)->receive(5000);
  EXPECT_EQ(as_reply(p1).id, "p1");  // r2's late answer from B was dropped
  EXPECT_EQ(as_reply(p1).worker, 2u);
}

TEST(ClientFailover, AllSilentTimesOutAfterMaxAttempts) {
  zmq::context_t ctx(1);
  fake_node a(ctx, silent), b(ctx, silent);
  client_options o = fast(ctx, 100);
  o.max_attempts = 4;  // more than the endpoints: A, B, closed, A again
  auto c = route_client::connect({a.endpoint(), b.endpoint(), closed_port(ctx)}, o);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const auto start = std::chrono::steady_clock::now();
  auto r = (*c)->route(request("lost"));
  const auto spent = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::failed_precondition);
  EXPECT_NE(r.error().message().find("timeout after 100 ms"), std::string::npos)
      << r.error().message();
  EXPECT_GE(spent, 4 * 95ms);
  EXPECT_EQ((*c)->failovers(), 3u);
  EXPECT_EQ((*c)->last_endpoint(), "");
  const auto at_a = a.wait_received(2);
  ASSERT_EQ(at_a.size(), 2u);
  EXPECT_EQ(id_of(at_a[0]), "lost");
  EXPECT_EQ(id_of(at_a[1]), "lost");
  EXPECT_EQ(id_of(b.wait_received(1).at(0)), "lost");

  // Default max_attempts: one per endpoint.
  auto d = route_client::connect({a.endpoint(), b.endpoint()}, fast(ctx, 50));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE((*d)->route(request("lost2")).ok());
  EXPECT_EQ((*d)->failovers(), 1u);
}

TEST(ClientFailover, WorkerFinishedAndAdminFailOver) {
  zmq::context_t ctx(1);
  fake_node silent_node(ctx, silent);
  fake_node worker_node(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    auto m = decode_worker_message(in, {});
    if (!m.ok()) return {};
    return {encode_worker_ack({worker_message_id(*m), "active", 9})};
  });
  auto w = worker_client::connect({silent_node.endpoint(), worker_node.endpoint()}, fast(ctx));
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  auto a = (*w)->call(finished_requests{"fin-1", "m", 2, {"q1", "q2"}});
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  ASSERT_TRUE(std::holds_alternative<worker_ack>(*a));
  EXPECT_EQ(std::get<worker_ack>(*a).id, "fin-1");
  EXPECT_EQ((*w)->failovers(), 1u);
  auto first = decode_worker_message(silent_node.wait_received(1).at(0), {});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(worker_message_id(*first), "fin-1");

  fake_node admin_node(ctx, [](std::span<const uint8_t> in) -> std::vector<bytes_t> {
    auto q = decode_admin_request(in, {});
    if (!q.ok()) return {};
    admin_reply r;
    r.id = q->id;
    r.ok = true;
    r.result = {{"command", q->command}};
    return {encode_admin_reply(r)};
  });
  auto ad = admin_client::connect({closed_port(ctx), admin_node.endpoint()}, fast(ctx));
  ASSERT_TRUE(ad.ok()) << ad.error().to_string();
  auto s = (*ad)->call("status");
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ((*s)["command"], "status");
  EXPECT_EQ((*ad)->last_endpoint(), admin_node.endpoint());
}

TEST(ClientFailover, BadArgumentsAreRefused) {
  EXPECT_EQ(route_client::connect(std::vector<std::string>{}).error().code(),
            status_code::invalid_argument);
  client_options o;
  o.max_attempts = -1;
  auto c = worker_client::connect("tcp://127.0.0.1:1", o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("max_attempts"), std::string::npos);
  EXPECT_FALSE(admin_client::connect({"tcp://127.0.0.1:1", "not-an-endpoint"}).ok());
}

// ---- CURVE ------------------------------------------------------------------------------------

curve_keypair pair_or_empty() {
  auto p = generate_curve_keypair();
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.ok() ? *p : curve_keypair{};
}

TEST(ClientCurve, RightServerKeyTalksWrongKeyTimesOut) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  zmq::context_t ctx(1);
  const curve_keypair server = pair_or_empty();
  fake_node node(ctx, answering(4), &server);

  client_options o = fast(ctx, 2000);
  o.curve = curve_client_keys{server.public_key, "", ""};  // ephemeral client pair
  auto c = route_client::connect(node.endpoint(), o);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(as_reply((*c)->route(request("secure"))).worker, 4u);

  const curve_keypair mine = pair_or_empty();
  o.curve = curve_client_keys{server.public_key, mine.public_key, mine.secret_key};
  auto c2 = worker_client::connect(node.endpoint(), o);
  ASSERT_TRUE(c2.ok()) << c2.error().to_string();
  auto own = curve_public_key(mine.secret_key);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, mine.public_key);
  o.curve = curve_client_keys{server.public_key, "", mine.secret_key};  // public derived
  auto c3 = route_client::connect(node.endpoint(), o);
  ASSERT_TRUE(c3.ok()) << c3.error().to_string();
  EXPECT_EQ(as_reply((*c3)->route(request("derived"))).worker, 4u);

  // The wrong server key: the handshake never completes, nothing is sent, the call times out.
  client_options bad = fast(ctx, 150);
  bad.curve = curve_client_keys{pair_or_empty().public_key, "", ""};
  auto w = route_client::connect(node.endpoint(), bad);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  auto r = (*w)->route(request("intruder"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("timeout"), std::string::npos) << r.error().to_string();

  // Without CURVE at all: no answer either.
  auto plain = route_client::connect(node.endpoint(), fast(ctx, 150));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->route(request("plain")).ok());

  // Failover from a CURVE endpoint with the wrong server (another key) to the right one.
  const curve_keypair other = pair_or_empty();
  fake_node impostor(ctx, answering(66), &other);
  client_options fo = fast(ctx, 150);
  fo.curve = curve_client_keys{server.public_key, "", ""};
  auto f = route_client::connect({impostor.endpoint(), node.endpoint()}, fo);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(as_reply((*f)->route(request("f"))).worker, 4u);
  EXPECT_EQ((*f)->failovers(), 1u);
}

TEST(ClientCurve, InvalidKeysAreRefusedNamingTheField) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  const curve_keypair good = pair_or_empty();
  const curve_keypair other = pair_or_empty();
  auto refused = [](curve_client_keys k, const std::string& field) {
    client_options o;
    o.curve = std::move(k);
    auto c = route_client::connect("tcp://127.0.0.1:1", o);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.error().code(), status_code::invalid_argument) << c.error().to_string();
    EXPECT_NE(c.error().message().find("client_options.curve." + field), std::string::npos)
        << c.error().to_string();
  };
  refused({"", "", ""}, "server_public_key");
  refused({good.public_key.substr(0, 39), "", ""}, "server_public_key");
  refused({std::string(39, 'a') + "\"", "", ""}, "server_public_key");  // not Z85
  refused({good.public_key, "short", good.secret_key}, "public_key");
  refused({good.public_key, "", "not a key"}, "secret_key");
  refused({good.public_key, good.public_key, ""}, "secret_key");                // pair half missing
  refused({good.public_key, other.public_key, good.secret_key}, "public_key");  // not its pair
  // The secret key never appears in the message.
  client_options o;
  o.curve = curve_client_keys{good.public_key, other.public_key, good.secret_key};
  auto c = admin_client::connect("tcp://127.0.0.1:1", o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message().find(good.secret_key), std::string::npos);
}

// ---- the Python client --------------------------------------------------------------------------

TEST(ClientFailover, PythonClientFailoverAndCurve) {
  const std::string python = "/usr/bin/python3";
  const auto probe = testing::run_command(python + " -c 'import zmq, msgpack'");
  if (probe.exit_code != 0)
    GTEST_SKIP() << python
                 << " lacks zmq or msgpack (python3-zmq, python3-msgpack): " << probe.output;
  const auto r = testing::run_command(python + " " + ELDR_SOURCE_DIR +
                                      "/tests/integration/py/client_failover.py");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tests passed"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace eldr
