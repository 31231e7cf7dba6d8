// route_socket: the generator's DEALERs, one per route endpoint (route_socket.hpp).
#include "tools/eldr-loadgen/route_socket.hpp"

#include <chrono>
#include <ctime>
#include <utility>

#include <poll.h>

namespace eldr::loadgen {

weighted_rotation::weighted_rotation(std::vector<uint32_t> weights)
    : weights_(std::move(weights)), current_(weights_.size(), 0) {
  for (uint32_t w : weights_)
    total_ += w;
}

std::size_t weighted_rotation::next() {
  // Each index gains its weight; the one furthest ahead is picked and pays back the total.
  std::size_t best = 0;
  for (std::size_t i = 0; i < weights_.size(); ++i) {
    current_[i] += weights_[i];
    if (current_[i] > current_[best]) best = i;
  }
  current_[best] -= total_;
  return best;
}

result<std::unique_ptr<route_socket>> route_socket::connect(
    zmq::context_t& ctx, const std::vector<std::string>& endpoints,
    const std::vector<uint32_t>& weights, int timeout_ms) {
  if (endpoints.empty()) return status::invalid_argument("route socket: no endpoint");
  if (!weights.empty() && weights.size() != endpoints.size())
    return status::invalid_argument("--router-weights: " + std::to_string(weights.size()) +
                                    " weights for " + std::to_string(endpoints.size()) +
                                    " routers");
  std::vector<uint32_t> w = weights.empty() ? std::vector<uint32_t>(endpoints.size(), 1) : weights;
  uint64_t total = 0;
  for (uint32_t x : w)
    total += x;
  if (total == 0) return status::invalid_argument("--router-weights: every weight is 0");
  std::unique_ptr<route_socket> r(new route_socket(std::move(w)));
  try {
    // One DEALER per endpoint: a DEALER's own round robin over its peers cannot be weighted
    // (connecting one endpoint twice gives it no second pipe).
    for (const std::string& e : endpoints) {
      zmq::socket_t& route = r->sockets_.emplace_back(ctx, zmq::socket_type::dealer);
      route.set(zmq::sockopt::linger, 0);
      route.set(zmq::sockopt::sndhwm, 100000);
      route.set(zmq::sockopt::rcvhwm, 100000);
      route.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(r->limits_.max_payload_bytes));
      route.set(zmq::sockopt::sndtimeo, timeout_ms);
      route.connect(e);
      r->fds_.push_back(route.get(zmq::sockopt::fd));
    }
  } catch (const std::exception& e) {
    return status::io_error(std::string("route socket: ") + e.what());
  }
  return r;
}

bool route_socket::send(std::span<const uint8_t> bytes, std::optional<std::size_t> to) {
  try {
    return sockets_[to ? *to % sockets_.size() : rotation_.next()]
        .send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none)
        .has_value();
  } catch (const std::exception&) {
    return false;
  }
}

bool route_socket::readable() {
  for (zmq::socket_t& s : sockets_)
    if ((s.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0) return true;
  return false;
}

bool route_socket::wait(wall_clock::time_point wake) {
  // Sub-millisecond precision: ppoll on the socket's ZMQ_FD (edge-triggered: ZMQ_EVENTS is
  // checked before every sleep).
  try {
    std::vector<pollfd> pfds;
    for (int fd : fds_)
      pfds.push_back(pollfd{fd, POLLIN, 0});
    while (!readable()) {
      const auto left = wake - wall_clock::now();
      if (left <= wall_clock::duration::zero()) break;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      (void)::ppoll(pfds.data(), pfds.size(), &ts, nullptr);
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void route_socket::receive_all(
    const std::function<void(route_outcome, wall_clock::time_point)>& on_reply, uint64_t& errors) {
  for (zmq::socket_t& socket : sockets_)
    receive_from(socket, on_reply, errors);
}

void route_socket::receive_from(
    zmq::socket_t& socket,
    const std::function<void(route_outcome, wall_clock::time_point)>& on_reply, uint64_t& errors) {
  for (;;) {
    zmq::recv_result_t got;
    try {
      got = socket.recv(msg_, zmq::recv_flags::dontwait);
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
