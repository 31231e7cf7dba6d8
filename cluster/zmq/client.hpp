// client: eldr's C++ client library for prefill workers (route), decode workers (register, load,
// finished, drain, publisher announce) and operators (admin), over ZeroMQ DEALER sockets to the
// node's ROUTER endpoints (docs/protocol.md). Errors the node answers with come back as
// error_reply values, transport failures (timeout, refused) as a status.
//
// Several endpoints (the same protocol on several nodes of one cluster): the client keeps one
// DEALER per endpoint, all connected at connect(). A synchronous call goes to the current endpoint;
// when it times out there (timeout_ms) it is resent, with the same id, to the next endpoint (round
// robin, client_options::max_attempts attempts in all). While it waits, the call accepts the first
// answer carrying its id from any endpoint it was sent to; every other reply is dropped, and the
// ids given up on an endpoint are remembered (a bounded set per endpoint) so that their late
// replies are also dropped by receive(). The endpoint that answered becomes the current one. A
// route resent with the same id is safe because nodes remember their decision per request id; a
// worker message (finished in particular) because nodes apply one per id. Admin commands are
// resent too: only commands that are safe to repeat should be given several endpoints.
//
// Sockets are created with ZMQ_IMMEDIATE, so a message is only queued for an endpoint with a
// completed connection (and CURVE handshake): a node that is down or refuses the keys makes the
// send wait (at most timeout_ms) instead of holding requests that a restarted node would get late.
//
// Thread safety: none. A client object owns ZeroMQ sockets, which belong to one thread; make one
// client per thread (they may share one zmq context via client_options::context).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/security/curve_keys.hpp"
#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/status.hpp"

namespace eldr {

// ZeroMQ CURVE on the client side (the node runs as the CURVE server). Keys are Z85 text, 40
// characters each.
struct curve_client_keys {
  std::string server_public_key;  // the node's long-term public key (required)
  // The client's own pair. Both empty: an ephemeral pair is made at connect (zmq_curve_keypair).
  // public_key empty with secret_key set: derived from secret_key. A public_key that does not
  // belong to secret_key is refused.
  std::string public_key;
  std::string secret_key;
};

struct client_options {
  // Per attempt of a synchronous call (send and wait for the answer), per send() and per
  // receive(). < 0: no limit (then a call never fails over).
  int timeout_ms = 2000;
  // Attempts of one synchronous call over the endpoints, round robin (may exceed their number:
  // the list is walked again). 0 = one per endpoint.
  int max_attempts = 0;
  // CURVE encryption and authentication; nullopt = plain TCP.
  std::optional<curve_client_keys> curve;
  route_protocol_limits route_limits;
  worker_protocol_limits worker_limits;
  admin_protocol_limits admin_limits;
  // Opaque shared zmq context (a zmq::context_t*); nullptr = the client makes its own.
  void* context = nullptr;
  // Called (on the calling thread) for every route_reply that carries warnings (route_reply::
  // warnings: the node routed, but something the caller should fix made the decision worse, e.g.
  // counts of another geometry). Unset: each warning code is written to stderr at most once per
  // 10 s ("eldr route_client: warning from ENDPOINT: TEXT"), so the problem is never silent.
  std::function<void(const route_reply&)> on_route_warning;
};

// CURVE key helpers for tools and tests (curve_available, generate_curve_keypair,
// curve_public_key, decode_curve_key) are in cluster/security/curve_keys.hpp, included here.

// A node's answer to a route request: a decision or an error it sent back.
using route_outcome = std::variant<route_reply, error_reply>;

class route_client {
 public:
  // Connects one DEALER per endpoint (e.g. {"tcp://10.0.0.1:5700", "tcp://10.0.0.2:5700"}); the
  // first is the current one. Errors: invalid_argument (no endpoint, an invalid one, max_attempts
  // < 0, a malformed CURVE key: the message names the field), failed_precondition (CURVE asked
  // for but libzmq lacks it).
  static result<std::unique_ptr<route_client>> connect(const std::vector<std::string>& endpoints,
                                                       client_options options = {});
  static result<std::unique_ptr<route_client>> connect(std::initializer_list<std::string> endpoints,
                                                       client_options options = {});
  // One endpoint, as connect({endpoint}).
  static result<std::unique_ptr<route_client>> connect(const std::string& endpoint,
                                                       client_options options = {});
  ~route_client();

  // One request, waits for its answer (replies to other ids that arrive meanwhile are dropped;
  // an error_reply without id answers it too: the node could not read the id), failing over to
  // the next endpoint with the same id on a timeout (see the file comment), marked `retry: true`
  // (docs/protocol.md; the first attempt goes as given). An empty request.id
  // is replaced by one the client makes up ("c<random>-<counter>", unique across clients).
  // Errors: deadline_exceeded-like failed_precondition "timeout after N ms" (every attempt timed
  // out), corrupt (the reply does not decode as a route_reply or error_reply; the client stays
  // usable, no failover), io_error (ZeroMQ failed).
  result<route_outcome> route(const route_request& request);

  // Pipelined use (many requests outstanding on the current endpoint's socket; no failover):
  // send() never waits for the answer (only for a connection and room in the send queue, at most
  // timeout_ms); receive() returns the next answer to arrive there, whatever its id (match by
  // id; replies may come out of request order), except late replies to ids a synchronous call
  // gave up on that endpoint, or an error after timeout_ms (< 0: wait without limit). The current
  // endpoint only changes in a synchronous call. Errors as route().
  status send(const route_request& request);
  result<route_outcome> receive(int timeout_ms);

  // The endpoint whose answer was returned last (by a call or receive()); empty before any.
  const std::string& last_endpoint() const;
  // Attempts resent to another endpoint after a timeout, over the client's lifetime.
  uint64_t failovers() const;
  // Replies that carried warnings, and decisions the node made by load only although the model's
  // policy is a locality one (route_reply::fallback non-empty), over the client's lifetime.
  uint64_t warned_replies() const;
  uint64_t fallback_replies() const;

  class impl;

 private:
  explicit route_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// Answer to a worker message.
using worker_outcome = std::variant<worker_ack, error_reply>;

class worker_client {
 public:
  // Connects one DEALER per endpoint (e.g. {"tcp://10.0.0.1:5701", "tcp://10.0.0.2:5701"}); the
  // first is the current one. Errors: invalid_argument (no endpoint, an invalid one, max_attempts
  // < 0, a malformed CURVE key: the message names the field), failed_precondition (CURVE asked
  // for but libzmq lacks it).
  static result<std::unique_ptr<worker_client>> connect(const std::vector<std::string>& endpoints,
                                                        client_options options = {});
  static result<std::unique_ptr<worker_client>> connect(
      std::initializer_list<std::string> endpoints, client_options options = {});
  // One endpoint, as connect({endpoint}).
  static result<std::unique_ptr<worker_client>> connect(const std::string& endpoint,
                                                        client_options options = {});
  ~worker_client();

  // Synchronous: sends the message and waits for its ack or error, failing over with the same id
  // on a timeout (an empty id is replaced by a generated one, as route_client::route). Errors as
  // route_client::route.
  result<worker_outcome> call(const worker_message& message);
  // Pipelined: as route_client.
  status send(const worker_message& message);
  result<worker_outcome> receive(int timeout_ms);

  // The endpoint whose answer was returned last (by a call or receive()); empty before any.
  const std::string& last_endpoint() const;
  // Attempts resent to another endpoint after a timeout, over the client's lifetime.
  uint64_t failovers() const;

  class impl;

 private:
  explicit worker_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

class admin_client {
 public:
  // Connects one DEALER per endpoint (e.g. {"tcp://10.0.0.1:5702", "tcp://10.0.0.2:5702"}); the
  // first is the current one. Errors: invalid_argument (no endpoint, an invalid one, max_attempts
  // < 0, a malformed CURVE key: the message names the field), failed_precondition (CURVE asked
  // for but libzmq lacks it).
  static result<std::unique_ptr<admin_client>> connect(const std::vector<std::string>& endpoints,
                                                       client_options options = {});
  static result<std::unique_ptr<admin_client>> connect(std::initializer_list<std::string> endpoints,
                                                       client_options options = {});
  // One endpoint, as connect({endpoint}).
  static result<std::unique_ptr<admin_client>> connect(const std::string& endpoint,
                                                       client_options options = {});
  ~admin_client();

  // Runs one command; an ok reply's result, or the node's error as a status whose message is
  // "<code name>: <error>" (code invalid_argument for malformed/too_large/unknown_*, else
  // failed_precondition), or a transport error (as route_client::route, failover included: the
  // command is resent with the same id to the next endpoint on a timeout). args must be an object
  // (null is taken as {}; anything else is invalid_argument). An error_reply from the node (it
  // could not read the request) is reported like a failed admin_reply.
  result<nlohmann::json> call(const std::string& command,
                              nlohmann::json args = nlohmann::json::object());

  // The endpoint whose answer was returned last (by a call or receive()); empty before any.
  const std::string& last_endpoint() const;
  // Attempts resent to another endpoint after a timeout, over the client's lifetime.
  uint64_t failovers() const;

  class impl;

 private:
  explicit admin_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
