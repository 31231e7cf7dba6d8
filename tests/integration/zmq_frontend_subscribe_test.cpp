// zmq_frontend's publisher side over real loopback sockets: a subscription is reported once its
// SUB socket exists, or refused with ZeroMQ's reason (an endpoint it refuses, its socket cap);
// the same endpoint twice is one socket; a replay asks the publisher's ROUTER with vLLM's
// [empty, seq8] request and delivers each batch and the end marker, and a ROUTER that never
// answers ends the replay as failed after replay_timeout_ms; publisher endpoints to bind are bound
// at start. Waits poll with deadlines.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/zmq/zmq_frontend.hpp"

namespace eldr {
namespace {

using namespace std::chrono_literals;

bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

struct recorder {
  std::mutex mutex;
  std::vector<result<uint32_t>> done;
  std::vector<replay_message> replayed;

  subscription_request request(const std::string& endpoint, const std::string& replay = "") {
    subscription_request r;
    r.endpoint = endpoint;
    r.replay_endpoint = replay;
    r.done = [this](result<uint32_t> id) {
      std::lock_guard lock(mutex);
      done.push_back(std::move(id));
    };
    r.on_replay = [this](replay_message m) {
      std::lock_guard lock(mutex);
      replayed.push_back(std::move(m));
    };
    return r;
  }
  size_t answers() {
    std::lock_guard lock(mutex);
    return done.size();
  }
  size_t replies() {
    std::lock_guard lock(mutex);
    return replayed.size();
  }
};

std::unique_ptr<zmq_frontend> start(int max_sockets, int replay_timeout_ms = 2000) {
  frontend_options o;
  o.endpoints[static_cast<size_t>(frontend_channel::route)] = "tcp://127.0.0.1:0";
  o.max_sockets = max_sockets;
  o.replay_timeout_ms = replay_timeout_ms;
  frontend_callbacks cb;
  cb.on_route = [](route_job) {};
  cb.on_worker = [](worker_job) {};
  cb.on_admin = [](admin_job) {};
  cb.on_publisher = [](publisher_frames) {};
  auto f = zmq_frontend::start(std::move(o), std::move(cb));
  EXPECT_TRUE(f.ok()) << f.error().to_string();
  return f.ok() ? std::move(*f) : nullptr;
}

TEST(ZmqFrontendSubscribe, ReportsTheSocketOrZeroMqsRefusal) {
  // One ROUTER + two SUBs fit under a cap of 3 sockets; the third SUB does not.
  auto f = start(3);
  ASSERT_TRUE(f);
  recorder r;
  f->subscribe(r.request("tcp://127.0.0.1:1"));
  f->subscribe(r.request("tcp://127.0.0.1:1"));  // the same endpoint: the same socket
  f->subscribe(r.request("tcp://127.0.0.1:2"));
  f->subscribe(r.request("tcp://127.0.0.1:3"));  // over the cap
  ASSERT_TRUE(eventually([&] { return r.answers() == 4; }));
  // Without a cap: ZeroMQ refuses an endpoint without a port.
  auto g = start(0);
  ASSERT_TRUE(g);
  g->subscribe(r.request("tcp://127.0.0.1"));
  ASSERT_TRUE(eventually([&] { return r.answers() == 5; }));
  std::lock_guard lock(r.mutex);
  ASSERT_TRUE(r.done[0].ok());
  ASSERT_TRUE(r.done[1].ok());
  EXPECT_EQ(*r.done[0], *r.done[1]);
  ASSERT_TRUE(r.done[2].ok());
  EXPECT_NE(*r.done[2], *r.done[0]);
  ASSERT_FALSE(r.done[3].ok());
  EXPECT_EQ(r.done[3].error().code(), status_code::out_of_range) << r.done[3].error().to_string();
  ASSERT_FALSE(r.done[4].ok());
  EXPECT_EQ(r.done[4].error().code(), status_code::invalid_argument);
  EXPECT_EQ(f->counters().subscriptions.load(), 2u);
  EXPECT_EQ(f->counters().subscribe_failed.load(), 1u);
  EXPECT_EQ(g->counters().subscriptions.load(), 0u);
  EXPECT_EQ(g->counters().subscribe_failed.load(), 1u);
}

TEST(ZmqFrontendSubscribe, UnsubscribingFreesTheSocket) {
  auto f = start(2);  // one ROUTER + one SUB
  ASSERT_TRUE(f);
  recorder r;
  f->subscribe(r.request("tcp://127.0.0.1:1"));
  ASSERT_TRUE(eventually([&] { return r.answers() == 1; }));
  ASSERT_TRUE(r.done[0].ok());
  f->unsubscribe(*r.done[0]);
  // ZeroMQ frees a closed socket's slot on its reaper thread, soon but not at once: ask again
  // until the cap lets the next one in.
  f->subscribe(r.request("tcp://127.0.0.1:2"));
  size_t asked = 2;
  ASSERT_TRUE(eventually([&] {
    if (r.answers() < asked) return false;
    {
      std::lock_guard lock(r.mutex);
      if (r.done.back().ok()) return true;
      EXPECT_EQ(r.done.back().error().code(), status_code::out_of_range);
    }
    ++asked;
    f->subscribe(r.request("tcp://127.0.0.1:2"));
    return false;
  }));
  std::lock_guard lock(r.mutex);
  EXPECT_NE(*r.done.back(), *r.done[0]);  // ids are never reused
}

std::vector<uint8_t> seq8(uint64_t s) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(s >> (56 - 8 * i));
  return b;
}

TEST(ZmqFrontendSubscribe, ReplayDeliversBatchesAndTheEndOrTimesOut) {
  auto f = start(0, 200);
  ASSERT_TRUE(f);
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.bind("tcp://127.0.0.1:*");
  const std::string replay = router.get(zmq::sockopt::last_endpoint);
  recorder r;
  f->subscribe(r.request("tcp://127.0.0.1:1", replay));
  ASSERT_TRUE(eventually([&] { return r.answers() == 1; }));
  ASSERT_TRUE(r.done[0].ok());
  const uint32_t id = *r.done[0];

  f->request_replay(id, 7, 5);
  std::vector<zmq::message_t> req;
  router.set(zmq::sockopt::rcvtimeo, 10000);
  ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(req)));
  ASSERT_EQ(req.size(), 3u);  // [routing id, "", seq8]
  EXPECT_EQ(req[1].size(), 0u);
  EXPECT_EQ(std::vector<uint8_t>(req[2].data<uint8_t>(), req[2].data<uint8_t>() + req[2].size()),
            seq8(5));
  const auto client = req[0].to_string();
  const auto s5 = seq8(5), s6 = seq8(6), end = seq8(~uint64_t{0});
  // Both shapes: the newer [empty, topic, seq, payload] and the older [empty, seq, payload].
  router.send(zmq::buffer(client), zmq::send_flags::sndmore);
  router.send(zmq::message_t(), zmq::send_flags::sndmore);
  router.send(zmq::str_buffer("kv"), zmq::send_flags::sndmore);
  router.send(zmq::buffer(s5), zmq::send_flags::sndmore);
  router.send(zmq::str_buffer("five"), zmq::send_flags::none);
  router.send(zmq::buffer(client), zmq::send_flags::sndmore);
  router.send(zmq::message_t(), zmq::send_flags::sndmore);
  router.send(zmq::buffer(s6), zmq::send_flags::sndmore);
  router.send(zmq::str_buffer("six"), zmq::send_flags::none);
  router.send(zmq::buffer(client), zmq::send_flags::sndmore);
  router.send(zmq::message_t(), zmq::send_flags::sndmore);
  router.send(zmq::buffer(end), zmq::send_flags::sndmore);
  router.send(zmq::message_t(), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return r.replies() == 3; }));
  {
    std::lock_guard lock(r.mutex);
    EXPECT_FALSE(r.replayed[0].end);
    EXPECT_EQ(r.replayed[0].token, 7u);
    EXPECT_EQ(r.replayed[0].seq, 5u);
    EXPECT_EQ(std::string(r.replayed[0].payload.begin(), r.replayed[0].payload.end()), "five");
    EXPECT_EQ(r.replayed[1].seq, 6u);
    EXPECT_TRUE(r.replayed[2].end);
    EXPECT_TRUE(r.replayed[2].ok);
  }
  EXPECT_EQ(f->counters().replays_failed.load(), 0u);

  // A request nobody answers ends as failed after the timeout; the frontend keeps serving.
  f->request_replay(id, 8, 9);
  ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(req)));
  ASSERT_TRUE(eventually([&] { return r.replies() == 4; }));
  {
    std::lock_guard lock(r.mutex);
    EXPECT_TRUE(r.replayed[3].end);
    EXPECT_FALSE(r.replayed[3].ok);
    EXPECT_EQ(r.replayed[3].token, 8u);
  }
  EXPECT_EQ(f->counters().replays_failed.load(), 1u);

  // A subscription without a replay endpoint: the request ends at once, failed.
  f->subscribe(r.request("tcp://127.0.0.1:2"));
  ASSERT_TRUE(eventually([&] { return r.answers() == 2; }));
  f->request_replay(*r.done[1], 9, 0);
  ASSERT_TRUE(eventually([&] { return r.replies() == 5; }));
  std::lock_guard lock(r.mutex);
  EXPECT_TRUE(r.replayed[4].end);
  EXPECT_FALSE(r.replayed[4].ok);
}

// A publisher endpoint to bind (models[].kv_events.bind) is bound by start(), like the channels:
// a taken port fails the start naming the key and the port; a free one is subscribed to later
// as "bind:ENDPOINT" on the socket start() bound. (The port is freed and bound again: another
// process could take it in between, as with any free-port probe.)
TEST(ZmqFrontendSubscribe, PublisherBindsAreBoundAtStart) {
  // The holder has a context of its own: closing a ZeroMQ socket releases its port later, on
  // the context's I/O thread, and terminating the context waits for that.
  zmq::context_t holder_ctx;
  zmq::socket_t holder(holder_ctx, zmq::socket_type::pub);
  holder.set(zmq::sockopt::linger, 0);
  holder.bind("tcp://127.0.0.1:*");
  const std::string taken = holder.get(zmq::sockopt::last_endpoint);
  auto options = [](const std::string& endpoint) {
    frontend_options o;
    o.endpoints[static_cast<size_t>(frontend_channel::route)] = "tcp://127.0.0.1:0";
    o.publisher_binds = {{"models[0].kv_events.bind", endpoint}};
    return o;
  };
  auto refused = zmq_frontend::start(options(taken), {});
  ASSERT_FALSE(refused.ok());
  const std::string message = refused.error().message();
  EXPECT_NE(message.find("models[0].kv_events.bind: cannot bind " + taken), std::string::npos)
      << message;
  EXPECT_NE(message.find("in use"), std::string::npos) << message;

  // Once free, the port is bound at start, and the subscription takes that socket: a second
  // bind of the same port would be refused (address in use).
  holder.close();
  holder_ctx.close();
  auto f = zmq_frontend::start(options(taken), {});
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  recorder r;
  (*f)->subscribe(r.request(std::string(kv_bind_prefix) + taken));
  ASSERT_TRUE(eventually([&] { return r.answers() == 1; }));
  std::lock_guard lock(r.mutex);
  EXPECT_TRUE(r.done[0].ok()) << r.done[0].error().to_string();
}

}  // namespace
}  // namespace eldr
