// route_socket: the generator's DEALER (route_socket.hpp).
#include "tools/eldr-loadgen/route_socket.hpp"

#include <chrono>
#include <ctime>

#include <poll.h>

namespace eldr::loadgen {

result<std::unique_ptr<route_socket>> route_socket::connect(
    zmq::context_t& ctx, const std::vector<std::string>& endpoints, int timeout_ms) {
  std::unique_ptr<route_socket> r(new route_socket(ctx));
  zmq::socket_t& route = r->socket_;
  try {
    route.set(zmq::sockopt::linger, 0);
    route.set(zmq::sockopt::sndhwm, 100000);
    route.set(zmq::sockopt::rcvhwm, 100000);
    route.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(r->limits_.max_payload_bytes));
    route.set(zmq::sockopt::sndtimeo, timeout_ms);
    // Several endpoints: a DEALER sends round robin over its peers, one request each in turn
    // (ZMQ_IMMEDIATE is off, so every peer's pipe exists from connect() on).
    for (const std::string& e : endpoints)
      route.connect(e);
    r->fd_ = route.get(zmq::sockopt::fd);
  } catch (const std::exception& e) {
    return status::io_error(std::string("route socket: ") + e.what());
  }
  return r;
}

bool route_socket::send(std::span<const uint8_t> bytes) {
  try {
    return socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none).has_value();
  } catch (const std::exception&) {
    return false;
  }
}

bool route_socket::wait(wall_clock::time_point wake) {
  // Sub-millisecond precision: ppoll on the socket's ZMQ_FD (edge-triggered: ZMQ_EVENTS is
  // checked before every sleep).
  try {
    while ((socket_.get(zmq::sockopt::events) & ZMQ_POLLIN) == 0) {
      const auto left = wake - wall_clock::now();
      if (left <= wall_clock::duration::zero()) break;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      pollfd pfd{fd_, POLLIN, 0};
      (void)::ppoll(&pfd, 1, &ts, nullptr);
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void route_socket::receive_all(
    const std::function<void(route_outcome, wall_clock::time_point)>& on_reply, uint64_t& errors) {
  for (;;) {
    zmq::recv_result_t got;
    try {
      got = socket_.recv(msg_, zmq::recv_flags::dontwait);
    } catch (const std::exception&) {
      ++errors;
      return;
    }
    if (!got) return;
    const auto now = wall_clock::now();
    const std::span<const uint8_t> b(static_cast<const uint8_t*>(msg_.data()), msg_.size());
    auto r = decode_route_reply(b, limits_);
    if (r.ok()) {
      on_reply(route_outcome(std::move(*r)), now);
    } else if (r.error().code() == status_code::not_found) {
      auto e = decode_error_reply(b, limits_);
      if (e.ok()) {
        on_reply(route_outcome(std::move(*e)), now);
      } else {
        ++errors;  // a reply that does not decode
      }
    } else {
      ++errors;
    }
  }
}

}  // namespace eldr::loadgen
