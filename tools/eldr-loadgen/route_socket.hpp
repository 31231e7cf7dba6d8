// route_socket: the loadgen's own DEALER to the route endpoints (as route_client's), so that
// requests encoded ahead are sent as bytes, and replies are stamped the moment they are read.
// With several endpoints (--routers) the DEALER sends round robin over its peers, one request
// each in turn.
//
// A ZeroMQ socket belongs to one thread: the generator's, which both sends and receives. While
// requests are outstanding it sleeps in wait(), ppoll(2) on the socket's ZMQ_FD with a nanosecond
// timeout, so that it wakes the moment a reply arrives and is on time for the next send.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "cluster/wire/route_protocol.hpp"
#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

class route_socket {
 public:
  // Connects to every endpoint; sends block at most timeout_ms. io_error "route socket: ..." when
  // ZeroMQ refuses an option or an endpoint.
  static result<std::unique_ptr<route_socket>> connect(zmq::context_t& ctx,
                                                       const std::vector<std::string>& endpoints,
                                                       int timeout_ms);

  // Sends one encoded route request; false when it was not sent.
  bool send(std::span<const uint8_t> bytes);

  // Sleeps until a reply is readable or `wake`; false when ZeroMQ threw.
  bool wait(wall_clock::time_point wake);

  // Reads every reply already queued, without waiting; each is stamped as it is read, before it
  // is decoded, and handed to on_reply. Counts replies that do not decode, and a receive that
  // threw, in errors.
  void receive_all(const std::function<void(route_outcome, wall_clock::time_point)>& on_reply,
                   uint64_t& errors);

 private:
  explicit route_socket(zmq::context_t& ctx) : socket_(ctx, zmq::socket_type::dealer) {}

  const route_protocol_limits limits_{};
  zmq::socket_t socket_;
  int fd_ = -1;  // ZMQ_FD: readable when the socket's events may have changed
  zmq::message_t msg_;
};

}  // namespace eldr::loadgen
