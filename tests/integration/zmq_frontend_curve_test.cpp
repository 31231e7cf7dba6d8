// zmq_frontend with CURVE, over real loopback sockets: a client that knows the server's public key
// is served on the admin and route channels; a plain client is not; with an allowlist, a listed
// client is served and an unlisted one is refused by the frontend's ZAP handler and counted. Bad
// keys fail start() naming the field. Handshakes are awaited through ZeroMQ socket monitors, not
// sleeps; "nothing arrives" is a bounded wait followed by checking the callback never ran.
#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/security/curve_keys.hpp"
#include "cluster/zmq/zmq_frontend.hpp"

namespace eldr {
namespace {

using namespace std::chrono_literals;

constexpr auto reply_timeout = 10s;
constexpr auto silence_window = 300ms;  // how long "nothing arrives" is watched

curve_keypair fresh_pair() {
  auto p = generate_curve_keypair();
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.ok() ? *p : curve_keypair{};
}

// A frontend whose callbacks answer at once through reply(), as the actors do, and count calls.
struct echo_frontend {
  std::atomic<zmq_frontend*> self{nullptr};
  std::atomic<int> admin_calls{0};
  std::atomic<int> route_calls{0};
  std::unique_ptr<zmq_frontend> f;

  status start(frontend_curve_options curve) {
    frontend_options o;
    o.endpoints[static_cast<size_t>(frontend_channel::route)] = "tcp://127.0.0.1:0";
    o.endpoints[static_cast<size_t>(frontend_channel::admin)] = "tcp://127.0.0.1:0";
    o.curve = std::move(curve);
    frontend_callbacks cb;
    cb.on_admin = [this](admin_job job) {
      admin_calls.fetch_add(1);
      admin_reply r;
      r.id = job.request.id;
      r.ok = true;
      r.result = "echo:" + job.request.command;
      self.load()->reply(job.from, encode_admin_reply(r));
    };
    cb.on_route = [this](route_job job) {
      route_calls.fetch_add(1);
      route_reply r;
      r.id = job.request.id;
      r.worker = 3;
      r.endpoint = "tcp://decode-3:5555";
      r.total_blocks = static_cast<uint32_t>(job.request.block_hashes.size());
      self.load()->reply(job.from, encode_route_reply(r));
    };
    cb.on_worker = [](worker_job) {};
    cb.on_publisher = [](publisher_frames) {};
    auto started = zmq_frontend::start(std::move(o), std::move(cb));
    if (!started.ok()) return started.error();
    f = std::move(*started);
    self.store(f.get());
    return {};
  }
  std::string endpoint(frontend_channel c) const { return f->bound(c); }
};

// A raw DEALER client, optionally with CURVE, and a monitor reporting its handshake's outcome.
class client {
 public:
  // server_public "" = a plain (NULL mechanism) client.
  client(zmq::context_t& ctx, const std::string& endpoint, const std::string& server_public,
         const curve_keypair& own)
      : sock_(ctx, zmq::socket_type::dealer), monitor_(ctx, zmq::socket_type::pair) {
    sock_.set(zmq::sockopt::linger, 0);
    if (!server_public.empty()) {
      sock_.set(zmq::sockopt::curve_serverkey, server_public);
      sock_.set(zmq::sockopt::curve_publickey, own.public_key);
      sock_.set(zmq::sockopt::curve_secretkey, own.secret_key);
    }
    static std::atomic<int> next{0};
    const std::string mon = "inproc://curve-test-monitor-" + std::to_string(next.fetch_add(1));
    const int rc = zmq_socket_monitor(
        sock_.handle(), mon.c_str(),
        ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
    EXPECT_EQ(rc, 0);
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(mon);
    sock_.connect(endpoint);
  }
  ~client() { zmq_socket_monitor(sock_.handle(), nullptr, 0); }

  // The next handshake event (ZMQ_EVENT_*), or nullopt when none comes within the timeout.
  std::optional<uint16_t> next_handshake_event() {
    zmq::pollitem_t item{monitor_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(reply_timeout)) ==
        0)
      return std::nullopt;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(monitor_, std::back_inserter(parts)) || parts.empty() ||
        parts[0].size() < 2)
      return std::nullopt;
    uint16_t event = 0;
    std::memcpy(&event, parts[0].data(), sizeof event);
    return event;
  }

  void send(const std::vector<uint8_t>& payload) {
    sock_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  }

  // The next reply payload within `wait`, or nullopt.
  std::optional<std::vector<uint8_t>> receive(std::chrono::milliseconds wait) {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, wait) == 0) return std::nullopt;
    zmq::message_t m;
    if (!sock_.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
    const auto* p = static_cast<const uint8_t*>(m.data());
    return std::vector<uint8_t>(p, p + m.size());
  }

 private:
  zmq::socket_t sock_;
  zmq::socket_t monitor_;
};

std::vector<uint8_t> admin_ping(const std::string& id) {
  admin_request q;
  q.id = id;
  q.command = "ping";
  return encode_admin_request(q);
}

std::vector<uint8_t> route_req(const std::string& id) {
  route_request q;
  q.id = id;
  q.model = "m";
  q.block_hashes = {1, 2, 3};
  return encode_route_request(q);
}

// Sends an admin ping and expects the echo back.
void expect_admin_echo(client& c, const std::string& id) {
  c.send(admin_ping(id));
  auto got = c.receive(std::chrono::duration_cast<std::chrono::milliseconds>(reply_timeout));
  ASSERT_TRUE(got.has_value()) << "no admin reply";
  auto r = decode_admin_reply(*got, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->id, id);
  EXPECT_TRUE(r->ok);
  EXPECT_EQ(r->result, "echo:ping");
}

class curve_frontend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  }
  zmq::context_t ctx{1};
};

TEST_F(curve_frontend, curve_client_with_the_server_key_is_served) {
  const auto server = fresh_pair();
  echo_frontend fe;
  ASSERT_TRUE(fe.start({server.secret_key, {}}).ok());
  EXPECT_EQ(fe.f->curve_public_key(), server.public_key);

  client admin(ctx, fe.endpoint(frontend_channel::admin), server.public_key, fresh_pair());
  EXPECT_EQ(admin.next_handshake_event(), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  expect_admin_echo(admin, "a-1");

  client route(ctx, fe.endpoint(frontend_channel::route), server.public_key, fresh_pair());
  route.send(route_req("r-1"));
  auto got = route.receive(std::chrono::duration_cast<std::chrono::milliseconds>(reply_timeout));
  ASSERT_TRUE(got.has_value()) << "no route reply";
  auto r = decode_route_reply(*got, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->id, "r-1");
  EXPECT_EQ(r->worker, 3u);
  EXPECT_EQ(r->total_blocks, 3u);
  // No allowlist: no ZAP handler, nothing counted.
  EXPECT_EQ(fe.f->counters().curve_accepted.load(), 0u);
  EXPECT_EQ(fe.f->counters().curve_refused.load(), 0u);
}

TEST_F(curve_frontend, plain_client_gets_nothing) {
  const auto server = fresh_pair();
  echo_frontend fe;
  ASSERT_TRUE(fe.start({server.secret_key, {}}).ok());

  client plain(ctx, fe.endpoint(frontend_channel::admin), "", {});
  // Mechanism mismatch: PROTOCOL when the client reads the server's greeting first, NO_DETAIL
  // when the server has already closed the connection.
  const auto event = plain.next_handshake_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_TRUE(*event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
              *event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
      << *event;
  plain.send(admin_ping("p-1"));
  EXPECT_FALSE(plain.receive(silence_window).has_value());
  EXPECT_EQ(fe.admin_calls.load(), 0);
  EXPECT_EQ(fe.f->counters().received[static_cast<size_t>(frontend_channel::admin)].load(), 0u);
}

TEST_F(curve_frontend, client_with_a_wrong_server_key_gets_nothing) {
  const auto server = fresh_pair();
  echo_frontend fe;
  ASSERT_TRUE(fe.start({server.secret_key, {}}).ok());

  client wrong(ctx, fe.endpoint(frontend_channel::route), fresh_pair().public_key, fresh_pair());
  wrong.send(route_req("w-1"));
  EXPECT_FALSE(wrong.receive(silence_window).has_value());
  EXPECT_EQ(fe.route_calls.load(), 0);
}

TEST_F(curve_frontend, plain_frontend_still_serves_plain_clients) {
  echo_frontend fe;
  ASSERT_TRUE(fe.start({}).ok());
  EXPECT_EQ(fe.f->curve_public_key(), "");
  client plain(ctx, fe.endpoint(frontend_channel::admin), "", {});
  expect_admin_echo(plain, "p-2");
}

TEST_F(curve_frontend, allowlist_admits_listed_and_refuses_other_clients) {
  const auto server = fresh_pair();
  const auto listed = fresh_pair();
  const auto other = fresh_pair();
  echo_frontend fe;
  ASSERT_TRUE(fe.start({server.secret_key, {listed.public_key, fresh_pair().public_key}}).ok());
  const auto& counters = fe.f->counters();

  client good(ctx, fe.endpoint(frontend_channel::admin), server.public_key, listed);
  EXPECT_EQ(good.next_handshake_event(), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  expect_admin_echo(good, "g-1");
  EXPECT_EQ(counters.curve_accepted.load(), 1u);
  EXPECT_EQ(counters.curve_refused.load(), 0u);

  client bad(ctx, fe.endpoint(frontend_channel::admin), server.public_key, other);
  // The handler refuses before the client hears back, so the count is already there.
  EXPECT_EQ(bad.next_handshake_event(), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  EXPECT_GE(counters.curve_refused.load(), 1u);  // the client reconnects and may be refused again
  bad.send(admin_ping("b-1"));
  EXPECT_FALSE(bad.receive(silence_window).has_value());
  EXPECT_EQ(fe.admin_calls.load(), 1);  // only the listed client's request
  EXPECT_EQ(counters.curve_accepted.load(), 1u);

  // The listed client is unaffected, also on the route channel.
  expect_admin_echo(good, "g-2");
  client route(ctx, fe.endpoint(frontend_channel::route), server.public_key, listed);
  EXPECT_EQ(route.next_handshake_event(), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  route.send(route_req("g-3"));
  auto got = route.receive(std::chrono::duration_cast<std::chrono::milliseconds>(reply_timeout));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(counters.curve_accepted.load(), 2u);
}

TEST_F(curve_frontend, bad_keys_fail_start_naming_the_field) {
  const auto server = fresh_pair();
  echo_frontend a;
  auto s = a.start({server.secret_key.substr(0, 39), {}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.message().rfind("curve.server_secret_key: ", 0), 0u) << s.message();
  EXPECT_EQ(s.message().find(server.secret_key.substr(0, 39)), std::string::npos);

  echo_frontend b;
  s = b.start({server.secret_key, {"not a key"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.message().rfind("curve.authorized_client_keys: ", 0), 0u) << s.message();

  echo_frontend c;
  s = c.start({"", {fresh_pair().public_key}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("curve.authorized_client_keys: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace eldr
