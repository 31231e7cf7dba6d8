// route_socket: the loadgen's own DEALER to the route endpoints (as route_client's), so that
// requests encoded ahead are sent as bytes, and replies are stamped the moment they are read.
// With several endpoints (--routers) there is one DEALER per endpoint, and each request goes to
// the next endpoint of a smooth weighted round robin (--router-weights; equal weights: one
// request each in turn, as one DEALER over several peers would).
//
// A ZeroMQ socket belongs to one thread: the generator's, which both sends and receives. While
// requests are outstanding it sleeps in wait(), ppoll(2) on the socket's ZMQ_FD with a nanosecond
// timeout, so that it wakes the moment a reply arrives and is on time for the next send.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "cluster/wire/route_protocol.hpp"
#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// Smooth weighted round robin (as nginx's upstreams): over any window of sum(weights) picks,
// index i is picked exactly weights[i] times, and the picks of each index are spread evenly
// rather than in runs, so that a router given weight 1 of 7 sees every seventh request and not
// bursts. Empty weights or all zero are not allowed (check before constructing).
class weighted_rotation {
 public:
  explicit weighted_rotation(std::vector<uint32_t> weights);
  std::size_t next();

 private:
  std::vector<uint32_t> weights_;
  std::vector<int64_t> current_;
  int64_t total_ = 0;
};

class route_socket {
 public:
  // Connects one DEALER to each endpoint; sends block at most timeout_ms. weights: one per
  // endpoint (empty = 1 each). io_error "route socket: ..." when ZeroMQ refuses an option or an
  // endpoint; invalid_argument when the weights do not fit the endpoints.
  static result<std::unique_ptr<route_socket>> connect(zmq::context_t& ctx,
                                                       const std::vector<std::string>& endpoints,
                                                       const std::vector<uint32_t>& weights,
                                                       int timeout_ms);

  // Sends one encoded route request to the next endpoint of the rotation, or to endpoint
  // `to % endpoints` when given; false when it was not sent.
  bool send(std::span<const uint8_t> bytes, std::optional<std::size_t> to = std::nullopt);

  // Sleeps until a reply is readable or `wake`; false when ZeroMQ threw.
  bool wait(wall_clock::time_point wake);

  // Reads every reply already queued, without waiting; each is stamped as it is read, before it
  // is decoded, and handed to on_reply. Counts replies that do not decode, and a receive that
  // threw, in errors.
  void receive_all(const std::function<void(route_outcome, wall_clock::time_point)>& on_reply,
                   uint64_t& errors);

 private:
  explicit route_socket(std::vector<uint32_t> weights) : rotation_(std::move(weights)) {}
  bool readable();  // any socket has a reply queued
  void receive_from(zmq::socket_t& socket,
                    const std::function<void(route_outcome, wall_clock::time_point)>& on_reply,
                    uint64_t& errors);

  const route_protocol_limits limits_{};
  std::vector<zmq::socket_t> sockets_;  // one per endpoint
  std::vector<int> fds_;                // their ZMQ_FDs: readable when events may have changed
  weighted_rotation rotation_;
  zmq::message_t msg_;
};

}  // namespace eldr::loadgen
