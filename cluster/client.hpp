// client: eldr's C++ client library for prefill workers (route), decode workers (register, load,
// finished, drain, publisher announce) and operators (admin), over ZeroMQ DEALER sockets to the
// node's ROUTER endpoints (docs/protocol.md). Errors the node answers with come back as
// error_reply values, transport failures (timeout, refused) as a status.
//
// Thread safety: none. A client object owns ZeroMQ sockets, which belong to one thread; make one
// client per thread (they may share one zmq context via client_options::context).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/admin_protocol.hpp"
#include "cluster/route_protocol.hpp"
#include "cluster/worker_protocol.hpp"
#include "core/status.hpp"

namespace eldr {

struct client_options {
  int timeout_ms = 2000;  // per synchronous call and per receive()
  route_protocol_limits route_limits;
  worker_protocol_limits worker_limits;
  admin_protocol_limits admin_limits;
  // Opaque shared zmq context (a zmq::context_t*); nullptr = the client makes its own.
  void* context = nullptr;
};

// A node's answer to a route request: a decision or an error it sent back.
using route_outcome = std::variant<route_reply, error_reply>;

class route_client {
 public:
  // Connects a DEALER to the node's route endpoint (e.g. "tcp://127.0.0.1:5700"). Errors: the
  // endpoint is invalid.
  static result<std::unique_ptr<route_client>> connect(const std::string& endpoint,
                                                       client_options options = {});
  ~route_client();

  // One request, waits for its answer (replies to other ids that arrive meanwhile are dropped;
  // an error_reply without id answers it too: the node could not read the id). An empty
  // request.id is replaced by one the client makes up ("c<counter>"). Errors: deadline_exceeded-
  // like failed_precondition "timeout after N ms", corrupt (the reply does not decode as a
  // route_reply or error_reply; the client stays usable), io_error (ZeroMQ failed).
  result<route_outcome> route(const route_request& request);

  // Pipelined use (many requests outstanding on one socket): send() never waits for the answer
  // (only for room in the send queue, at most timeout_ms); receive() returns the next answer to
  // arrive, whatever its id (match by id; replies may come out of request order), or an error
  // after timeout_ms (< 0: wait without limit). Errors as route().
  status send(const route_request& request);
  result<route_outcome> receive(int timeout_ms);

  class impl;

 private:
  explicit route_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// Answer to a worker message.
using worker_outcome = std::variant<worker_ack, error_reply>;

class worker_client {
 public:
  // Connects a DEALER to the node's worker endpoint (e.g. "tcp://127.0.0.1:5701"). Errors: the
  // endpoint is invalid.
  static result<std::unique_ptr<worker_client>> connect(const std::string& endpoint,
                                                        client_options options = {});
  ~worker_client();

  // Synchronous: sends the message and waits for its ack or error (an empty id is replaced by a
  // generated one, as route_client::route). Errors as route_client::route.
  result<worker_outcome> call(const worker_message& message);
  // Pipelined: as route_client.
  status send(const worker_message& message);
  result<worker_outcome> receive(int timeout_ms);

  class impl;

 private:
  explicit worker_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

class admin_client {
 public:
  // Connects a DEALER to the node's admin endpoint (e.g. "tcp://127.0.0.1:5702"). Errors: the
  // endpoint is invalid.
  static result<std::unique_ptr<admin_client>> connect(const std::string& endpoint,
                                                       client_options options = {});
  ~admin_client();

  // Runs one command; an ok reply's result, or the node's error as a status whose message is
  // "<code name>: <error>" (code invalid_argument for malformed/too_large/unknown_*, else
  // failed_precondition), or a transport error (as route_client::route). args must be an object
  // (null is taken as {}; anything else is invalid_argument). An error_reply from the node (it
  // could not read the request) is reported like a failed admin_reply.
  result<nlohmann::json> call(const std::string& command,
                              nlohmann::json args = nlohmann::json::object());

  class impl;

 private:
  explicit admin_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
