// A fake eldr node for client tests: a ZeroMQ ROUTER on 127.0.0.1 with a port the system chose
// (optionally a CURVE server), served by a thread. Every request -- exactly one frame after the
// routing id, or it is counted in bad_frames() and dropped -- goes to the test's handler, whose
// replies go back to the same peer in order. The handler runs on the server thread only. Every
// request's payload is kept; wait_received(n) blocks (bounded) until n have arrived.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/security/curve_keys.hpp"

namespace eldr::testing {

class fake_zmq_node {
 public:
  using bytes_t = std::vector<uint8_t>;
  using handler = std::function<std::vector<bytes_t>(std::span<const uint8_t>)>;

  fake_zmq_node(zmq::context_t& ctx, handler h, const curve_keypair* server_keys = nullptr)
      : sock_(ctx, zmq::socket_type::router), h_(std::move(h)) {
    sock_.set(zmq::sockopt::linger, 0);
    if (server_keys) {
      sock_.set(zmq::sockopt::curve_server, 1);
      sock_.set(zmq::sockopt::curve_secretkey, server_keys->secret_key);
    }
    sock_.bind("tcp://127.0.0.1:*");
    endpoint_ = sock_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { run(); });
  }
  ~fake_zmq_node() {
    stop_ = true;
    thread_.join();
  }
  fake_zmq_node(const fake_zmq_node&) = delete;
  fake_zmq_node& operator=(const fake_zmq_node&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  uint64_t bad_frames() const { return bad_frames_; }
  uint64_t received() {
    std::lock_guard lock(mu_);
    return received_.size();
  }

  // The payloads received so far, once at least n have arrived (or after 10 s).
  std::vector<bytes_t> wait_received(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return received_.size() >= n; });
    return received_;
  }

 private:
  void run() {
    while (!stop_) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      // The timeout only bounds how late the thread sees stop_; nothing waits on it.
      if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(sock_, std::back_inserter(parts), zmq::recv_flags::dontwait))
        continue;
      if (parts.size() != 2) {
        ++bad_frames_;
        continue;
      }
      const std::span<const uint8_t> in{static_cast<const uint8_t*>(parts[1].data()),
                                        parts[1].size()};
      {
        std::lock_guard lock(mu_);
        received_.emplace_back(in.begin(), in.end());
      }
      cv_.notify_all();
      for (const bytes_t& reply : h_(in)) {
        sock_.send(zmq::buffer(parts[0].data(), parts[0].size()), zmq::send_flags::sndmore);
        sock_.send(zmq::buffer(reply), zmq::send_flags::none);
      }
    }
  }

  zmq::socket_t sock_;
  handler h_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bad_frames_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bytes_t> received_;
  std::thread thread_;
};

}  // namespace eldr::testing
