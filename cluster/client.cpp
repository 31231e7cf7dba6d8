// client: see client.hpp and docs/protocol.md (transport: sections 3 to 5).
#include "cluster/client.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <optional>
#include <span>
#include <utility>
#include <zmq.hpp>

namespace eldr {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr int socket_hwm = 10000;  // messages queued per direction before send waits

status zmq_status(const zmq::error_t& e) {
  return status::io_error(std::string("zeromq: ") + e.what());
}

status timeout_status(int timeout_ms) {
  return status::failed_precondition("timeout after " + std::to_string(timeout_ms) + " ms");
}

// One DEALER socket connected to one node endpoint: what the three clients share. Every message
// is one frame holding one MessagePack map; a reply is read as its last frame, so a node that
// prepends an empty delimiter (REQ-style) is understood too.
class connection {
 public:
  // Creates the socket (and a context unless options.context shares one) and connects it.
  static result<std::unique_ptr<connection>> open(const std::string& endpoint,
                                                  const client_options& options,
                                                  uint32_t max_payload_bytes) {
    auto c = std::unique_ptr<connection>(new connection());
    try {
      zmq::context_t* ctx = static_cast<zmq::context_t*>(options.context);
      if (!ctx) {
        c->owned_ = std::make_unique<zmq::context_t>(1);
        ctx = c->owned_.get();
      }
      c->sock_ = zmq::socket_t(*ctx, zmq::socket_type::dealer);
      c->sock_.set(zmq::sockopt::linger, 0);
      c->sock_.set(zmq::sockopt::sndhwm, socket_hwm);
      c->sock_.set(zmq::sockopt::rcvhwm, socket_hwm);
      c->sock_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_payload_bytes));
      c->sock_.set(zmq::sockopt::sndtimeo, std::max(options.timeout_ms, 0));
      c->sock_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return status::invalid_argument("connect to \"" + endpoint + "\": zeromq: " + e.what());
    } catch (const std::exception& e) {
      return status::io_error("connect to \"" + endpoint + "\": " + e.what());
    }
    c->timeout_ms_ = options.timeout_ms;
    return c;
  }

  ~connection() {
    try {
      sock_.close();
    } catch (...) {  // closing a socket cannot usefully fail; never throw from a destructor
    }
  }

  // Queues one message. Waits only while the socket's send queue is full, at most timeout_ms.
  status send(const std::vector<uint8_t>& payload) {
    try {
      if (!sock_.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::none))
        return status::failed_precondition("timeout after " + std::to_string(timeout_ms_) +
                                           " ms: the send queue is full");
    } catch (const zmq::error_t& e) {
      return zmq_status(e);
    } catch (const std::exception& e) {
      return status::io_error(e.what());
    }
    return {};
  }

  // The next message to arrive within timeout_ms (< 0: no limit), its last frame in `out`.
  // Errors: timeout (failed_precondition "timeout after N ms"), a ZeroMQ failure (io_error).
  status receive(int timeout_ms, zmq::message_t& out) {
    const auto start = clock_type::now();
    try {
      for (;;) {
        int wait = timeout_ms;
        if (timeout_ms >= 0) {
          const auto spent =
              std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start)
                  .count();
          wait = static_cast<int>(std::max<int64_t>(0, timeout_ms - spent));
        }
        zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
        int ready = 0;
        try {
          ready = zmq::poll(&item, 1, std::chrono::milliseconds(wait));
        } catch (const zmq::error_t& e) {
          if (e.num() == EINTR) continue;  // a signal: wait for the rest of the time
          throw;
        }
        if (ready == 0) return timeout_status(timeout_ms);
        if (!sock_.recv(out, zmq::recv_flags::dontwait)) continue;
        while (out.more()) {  // keep the last frame
          if (!sock_.recv(out, zmq::recv_flags::none)) break;
        }
        return {};
      }
    } catch (const zmq::error_t& e) {
      return zmq_status(e);
    } catch (const std::exception& e) {
      return status::io_error(e.what());
    }
  }

  // A fresh correlation id for a message sent without one.
  std::string next_id() { return "c" + std::to_string(++counter_); }
  int timeout_ms() const { return timeout_ms_; }

 private:
  connection() = default;

  std::unique_ptr<zmq::context_t> owned_;  // destroyed after the socket
  zmq::socket_t sock_;
  int timeout_ms_ = 2000;
  uint64_t counter_ = 0;
};

std::span<const uint8_t> bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}

// Sends one message and reads replies until one answers it (match(reply) is true), dropping late
// replies to earlier requests; a reply that does not decode ends the call with corrupt.
template <class Outcome, class Decode, class Match>
result<Outcome> call_and_wait(connection& c, const std::vector<uint8_t>& payload, Decode&& decode,
                              Match&& match) {
  if (status s = c.send(payload); !s.ok()) return s;
  const int timeout_ms = c.timeout_ms();
  const auto deadline = clock_type::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  zmq::message_t msg;
  for (;;) {
    int left = -1;
    if (timeout_ms >= 0) {
      const auto now = clock_type::now();
      left =
          now >= deadline
              ? 0
              : static_cast<int>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
    }
    if (status s = c.receive(left, msg); !s.ok()) {
      if (s.code() == status_code::failed_precondition) return timeout_status(timeout_ms);
      return s;
    }
    result<Outcome> r = decode(bytes(msg));
    if (!r.ok()) return r.error();
    if (match(*r)) return r;
    if (timeout_ms >= 0 && clock_type::now() >= deadline) return timeout_status(timeout_ms);
  }
}

// An error_reply answers a request when it carries its id, or none (the node could not read it).
bool answers(const error_reply& e, const std::string& id) {
  return !e.id || *e.id == id;
}

route_protocol_limits error_limits(const route_protocol_limits& base, uint32_t max_payload_bytes,
                                   uint32_t max_id_bytes) {
  route_protocol_limits l = base;
  l.max_payload_bytes = max_payload_bytes;
  l.max_id_bytes = std::max(l.max_id_bytes, max_id_bytes);
  return l;
}

status corrupt_reply(std::string_view what, const status& s) {
  return status::corrupt(std::string(what) + " does not decode: " + s.to_string());
}

}  // namespace

// ---- route_client ---------------------------------------------------------------------------

class route_client::impl {
 public:
  std::unique_ptr<connection> conn;
  client_options opt;

  result<route_outcome> decode(std::span<const uint8_t> b) const {
    auto r = decode_route_reply(b, opt.route_limits);
    if (r.ok()) return route_outcome(std::move(*r));
    if (r.error().code() == status_code::not_found) {
      auto e = decode_error_reply(b, opt.route_limits);
      if (e.ok()) return route_outcome(std::move(*e));
      return corrupt_reply("route reply", e.error());
    }
    return corrupt_reply("route reply", r.error());
  }

  route_request with_id(const route_request& request) {
    route_request m = request;
    if (m.id.empty()) m.id = conn->next_id();
    return m;
  }
};

route_client::route_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
route_client::~route_client() = default;

result<std::unique_ptr<route_client>> route_client::connect(const std::string& endpoint,
                                                            client_options options) {
  auto c = connection::open(endpoint, options, options.route_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->opt = std::move(options);
  return std::unique_ptr<route_client>(new route_client(std::move(p)));
}

result<route_outcome> route_client::route(const route_request& request) {
  impl& m = *impl_;
  try {
    const route_request req = m.with_id(request);
    return call_and_wait<route_outcome>(
        *m.conn, encode_route_request(req), [&](auto b) { return m.decode(b); },
        [&](const route_outcome& o) {
          if (const auto* r = std::get_if<route_reply>(&o)) return r->id == req.id;
          return answers(std::get<error_reply>(o), req.id);
        });
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

status route_client::send(const route_request& request) {
  try {
    return impl_->conn->send(encode_route_request(impl_->with_id(request)));
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

result<route_outcome> route_client::receive(int timeout_ms) {
  zmq::message_t msg;
  if (status s = impl_->conn->receive(timeout_ms, msg); !s.ok()) return s;
  try {
    return impl_->decode(bytes(msg));
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

// ---- worker_client --------------------------------------------------------------------------

class worker_client::impl {
 public:
  std::unique_ptr<connection> conn;
  client_options opt;
  route_protocol_limits err_limits;

  result<worker_outcome> decode(std::span<const uint8_t> b) const {
    auto r = decode_worker_ack(b, opt.worker_limits);
    if (r.ok()) return worker_outcome(std::move(*r));
    if (r.error().code() == status_code::not_found) {
      auto e = decode_error_reply(b, err_limits);
      if (e.ok()) return worker_outcome(std::move(*e));
      return corrupt_reply("worker reply", e.error());
    }
    return corrupt_reply("worker reply", r.error());
  }

  worker_message with_id(const worker_message& message) {
    worker_message m = message;
    if (worker_message_id(m).empty()) worker_message_id(m) = conn->next_id();
    return m;
  }
};

worker_client::worker_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
worker_client::~worker_client() = default;

result<std::unique_ptr<worker_client>> worker_client::connect(const std::string& endpoint,
                                                              client_options options) {
  auto c = connection::open(endpoint, options, options.worker_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->err_limits = error_limits(options.route_limits, options.worker_limits.max_payload_bytes,
                               options.worker_limits.max_id_bytes);
  p->opt = std::move(options);
  return std::unique_ptr<worker_client>(new worker_client(std::move(p)));
}

result<worker_outcome> worker_client::call(const worker_message& message) {
  impl& m = *impl_;
  try {
    const worker_message msg = m.with_id(message);
    const std::string& id = worker_message_id(msg);
    return call_and_wait<worker_outcome>(
        *m.conn, encode_worker_message(msg), [&](auto b) { return m.decode(b); },
        [&](const worker_outcome& o) {
          if (const auto* a = std::get_if<worker_ack>(&o)) return a->id == id;
          return answers(std::get<error_reply>(o), id);
        });
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

status worker_client::send(const worker_message& message) {
  try {
    return impl_->conn->send(encode_worker_message(impl_->with_id(message)));
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

result<worker_outcome> worker_client::receive(int timeout_ms) {
  zmq::message_t msg;
  if (status s = impl_->conn->receive(timeout_ms, msg); !s.ok()) return s;
  try {
    return impl_->decode(bytes(msg));
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

// ---- admin_client ---------------------------------------------------------------------------

class admin_client::impl {
 public:
  std::unique_ptr<connection> conn;
  client_options opt;
  route_protocol_limits err_limits;

  // An admin_reply, or an error_reply turned into a failed admin_reply (a node may answer a
  // message it cannot read as an admin_request that way).
  result<admin_reply> decode(std::span<const uint8_t> b) const {
    auto r = decode_admin_reply(b, opt.admin_limits);
    if (r.ok()) return r;
    if (r.error().code() == status_code::not_found) {
      auto e = decode_error_reply(b, err_limits);
      if (!e.ok()) return corrupt_reply("admin reply", e.error());
      admin_reply a;
      a.id = e->id.value_or("");
      a.ok = false;
      a.code = e->code;
      a.error = std::move(e->message);
      return a;
    }
    return corrupt_reply("admin reply", r.error());
  }
};

admin_client::admin_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
admin_client::~admin_client() = default;

result<std::unique_ptr<admin_client>> admin_client::connect(const std::string& endpoint,
                                                            client_options options) {
  auto c = connection::open(endpoint, options, options.admin_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->err_limits = error_limits(options.route_limits, options.admin_limits.max_payload_bytes,
                               options.admin_limits.max_id_bytes);
  p->opt = std::move(options);
  return std::unique_ptr<admin_client>(new admin_client(std::move(p)));
}

result<nlohmann::json> admin_client::call(const std::string& command, nlohmann::json args) {
  impl& m = *impl_;
  try {
    admin_request req;
    req.id = m.conn->next_id();
    req.command = command;
    req.args = args.is_null() ? nlohmann::json::object() : std::move(args);
    if (!req.args.is_object())
      return status::invalid_argument("admin " + command + ": args must be an object");
    auto reply = call_and_wait<admin_reply>(
        *m.conn, encode_admin_request(req), [&](auto b) { return m.decode(b); },
        [&](const admin_reply& r) { return r.id == req.id || r.id.empty(); });
    if (!reply.ok()) return reply.error();
    if (reply->ok) return std::move(reply->result);
    std::string msg = std::string(to_string(reply->code)) + ": " + reply->error;
    switch (reply->code) {
      case route_error_code::malformed:
      case route_error_code::too_large:
      case route_error_code::unknown_type:
      case route_error_code::unknown_model:
        return status::invalid_argument(std::move(msg));
      default:
        return status::failed_precondition(std::move(msg));
    }
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

}  // namespace eldr
