// client: see client.hpp and docs/protocol.md (transport: sections 3 to 5).
#include "cluster/zmq/client.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <unordered_set>
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

// The id a decoded reply carries ("" when none), to recognise late replies to given-up requests.
const std::string& outcome_id(const error_reply& e) {
  static const std::string none;
  return e.id ? *e.id : none;
}
const std::string& outcome_id(const route_outcome& o) {
  if (const auto* r = std::get_if<route_reply>(&o)) return r->id;
  return outcome_id(std::get<error_reply>(o));
}
const std::string& outcome_id(const worker_outcome& o) {
  if (const auto* a = std::get_if<worker_ack>(&o)) return a->id;
  return outcome_id(std::get<error_reply>(o));
}
const std::string& outcome_id(const admin_reply& a) {
  return a.id;
}

// A Z85 key check whose error names the option field (and never repeats the key: it may be secret).
status check_key(std::string_view field, const std::string& key) {
  auto k = decode_curve_key(key);
  if (k.ok()) return {};
  return status::invalid_argument("client_options.curve." + std::string(field) + ": " +
                                  k.error().message());
}

status no_curve() {
  return status::failed_precondition(
      "CURVE requested but this libzmq has no CURVE support "
      "(zmq_has(\"curve\") is false; build libzmq with libsodium)");
}

// The keys a client socket is given: validated and completed once at connect.
result<curve_client_keys> resolve_curve(const curve_client_keys& in) {
  if (!curve_available()) return no_curve();
  curve_client_keys k = in;
  if (status s = check_key("server_public_key", k.server_public_key); !s.ok()) return s;
  if (k.secret_key.empty()) {
    if (!k.public_key.empty())
      return status::invalid_argument(
          "client_options.curve.secret_key: missing (public_key is set without its secret key)");
    auto pair = generate_curve_keypair();
    if (!pair.ok()) return pair.error();
    k.public_key = std::move(pair->public_key);
    k.secret_key = std::move(pair->secret_key);
    return k;
  }
  if (status s = check_key("secret_key", k.secret_key); !s.ok()) return s;
  auto derived = curve_public_key(k.secret_key);
  if (!derived.ok()) return derived.error();
  if (k.public_key.empty()) {
    k.public_key = std::move(*derived);
  } else if (status s = check_key("public_key", k.public_key); !s.ok()) {
    return s;
  } else if (k.public_key != *derived) {
    return status::invalid_argument(
        "client_options.curve.public_key: does not belong to client_options.curve.secret_key");
  }
  return k;
}

void set_key(zmq::socket_t& s, int option, const std::string& z85) {
  // libzmq takes a 40-character Z85 key as is (it decodes it); the length excludes the NUL.
  if (zmq_setsockopt(s.handle(), option, z85.data(), z85.size()) != 0) throw zmq::error_t();
}

// The DEALER sockets of one client, one per endpoint (all connected at open), with the state the
// three clients share: the current endpoint, failover counters, generated ids and, per endpoint,
// the ids given up there (whose late replies are dropped). Every message is one frame holding one
// MessagePack map; a reply is read as its last frame, so a node that prepends an empty delimiter
// (REQ-style) is understood too.
//
// One socket per endpoint rather than one socket reconnected: a late answer can only come back on
// the socket its request left by, so it is recognised by id there and never taken for another
// endpoint's answer, and a call that failed over can still take the first endpoint's answer if it
// comes first. Sockets close with linger 0.
class connection {
 public:
  static constexpr size_t max_abandoned = 4096;  // remembered given-up ids per endpoint

  struct link {
    std::string endpoint;
    zmq::socket_t sock;
    std::deque<std::string> abandoned_order;  // oldest first, for the bound
    std::unordered_set<std::string> abandoned;
  };

  // Creates the sockets (and a context unless options.context shares one) and connects them.
  static result<std::unique_ptr<connection>> open(const std::vector<std::string>& endpoints,
                                                  const client_options& options,
                                                  uint32_t max_payload_bytes) {
    if (endpoints.empty()) return status::invalid_argument("connect: no endpoint given");
    if (options.max_attempts < 0)
      return status::invalid_argument("client_options.max_attempts: must be >= 0, got " +
                                      std::to_string(options.max_attempts));
    std::optional<curve_client_keys> keys;
    if (options.curve) {
      auto k = resolve_curve(*options.curve);
      if (!k.ok()) return k.error();
      keys = std::move(*k);
    }
    auto c = std::unique_ptr<connection>(new connection());
    c->timeout_ms_ = options.timeout_ms;
    c->max_attempts_ =
        options.max_attempts > 0 ? options.max_attempts : static_cast<int>(endpoints.size());
    std::random_device rd;
    c->nonce_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    zmq::context_t* ctx = static_cast<zmq::context_t*>(options.context);
    try {
      if (!ctx) {
        c->owned_ = std::make_unique<zmq::context_t>(1);
        ctx = c->owned_.get();
      }
    } catch (const std::exception& e) {
      return status::io_error(std::string("zeromq context: ") + e.what());
    }
    for (const std::string& endpoint : endpoints) {
      try {
        link l;
        l.endpoint = endpoint;
        l.sock = zmq::socket_t(*ctx, zmq::socket_type::dealer);
        l.sock.set(zmq::sockopt::linger, 0);
        l.sock.set(zmq::sockopt::immediate, 1);
        l.sock.set(zmq::sockopt::sndhwm, socket_hwm);
        l.sock.set(zmq::sockopt::rcvhwm, socket_hwm);
        l.sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_payload_bytes));
        if (keys) {
          set_key(l.sock, ZMQ_CURVE_SERVERKEY, keys->server_public_key);
          set_key(l.sock, ZMQ_CURVE_PUBLICKEY, keys->public_key);
          set_key(l.sock, ZMQ_CURVE_SECRETKEY, keys->secret_key);
        }
        l.sock.connect(endpoint);
        c->links_.push_back(std::move(l));
      } catch (const zmq::error_t& e) {
        return status::invalid_argument("connect to \"" + endpoint + "\": zeromq: " + e.what());
      } catch (const std::exception& e) {
        return status::io_error("connect to \"" + endpoint + "\": " + e.what());
      }
    }
    return c;
  }

  ~connection() {
    for (link& l : links_) {
      try {
        l.sock.close();
      } catch (...) {  // closing a socket cannot usefully fail; never throw from a destructor
      }
    }
  }

  // Queues one message on link i, waiting for a connection and room in its send queue at most
  // wait_ms (< 0: no limit). Errors: timeout (failed_precondition), a ZeroMQ failure (io_error).
  status send(size_t i, const std::vector<uint8_t>& payload, int wait_ms) {
    zmq::socket_t& sock = links_[i].sock;
    const auto start = clock_type::now();
    try {
      for (;;) {
        zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLOUT, 0};
        int ready = 0;
        try {
          ready = zmq::poll(&item, 1, std::chrono::milliseconds(left_of(start, wait_ms)));
        } catch (const zmq::error_t& e) {
          if (e.num() == EINTR) continue;
          throw;
        }
        if (ready == 0)
          return status::failed_precondition("timeout after " + std::to_string(wait_ms) +
                                             " ms: cannot send to " + links_[i].endpoint +
                                             " (no connection or the send queue is full)");
        if (sock.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::dontwait))
          return {};
      }
    } catch (const zmq::error_t& e) {
      return zmq_status(e);
    } catch (const std::exception& e) {
      return status::io_error(e.what());
    }
  }

  // The next message to arrive on any of the links `which` within timeout_ms (< 0: no limit),
  // its last frame in `out`, the link it came by in `from`. Errors: timeout (failed_precondition
  // "timeout after N ms"), a ZeroMQ failure (io_error).
  status receive(std::span<const size_t> which, int timeout_ms, zmq::message_t& out, size_t& from) {
    const auto start = clock_type::now();
    std::vector<zmq::pollitem_t> items;
    for (size_t i : which)
      items.push_back({links_[i].sock.handle(), 0, ZMQ_POLLIN, 0});
    try {
      for (;;) {
        for (auto& item : items)
          item.revents = 0;
        int ready = 0;
        try {
          ready = zmq::poll(items.data(), items.size(),
                            std::chrono::milliseconds(left_of(start, timeout_ms)));
        } catch (const zmq::error_t& e) {
          if (e.num() == EINTR) continue;  // a signal: wait for the rest of the time
          throw;
        }
        if (ready == 0) return timeout_status(timeout_ms);
        for (size_t k = 0; k < items.size(); ++k) {
          if (!(items[k].revents & ZMQ_POLLIN)) continue;
          zmq::socket_t& sock = links_[which[k]].sock;
          if (!sock.recv(out, zmq::recv_flags::dontwait)) continue;
          while (out.more()) {  // keep the last frame
            if (!sock.recv(out, zmq::recv_flags::none)) break;
          }
          from = which[k];
          return {};
        }
      }
    } catch (const zmq::error_t& e) {
      return zmq_status(e);
    } catch (const std::exception& e) {
      return status::io_error(e.what());
    }
  }

  // Remembers that `id` was given up on link i: a late reply to it is dropped, once.
  void abandon(size_t i, const std::string& id) {
    link& l = links_[i];
    if (!l.abandoned.insert(id).second) return;
    l.abandoned_order.push_back(id);
    if (l.abandoned_order.size() > max_abandoned) {
      l.abandoned.erase(l.abandoned_order.front());
      l.abandoned_order.pop_front();
    }
  }
  // True (and forgets it) when `id` was given up on link i.
  bool take_abandoned(size_t i, const std::string& id) {
    link& l = links_[i];
    if (l.abandoned.erase(id) == 0) return false;
    l.abandoned_order.erase(std::find(l.abandoned_order.begin(), l.abandoned_order.end(), id));
    return true;
  }

  // A fresh correlation id for a message sent without one: unique across clients (nodes remember
  // decisions per id) and within this one.
  std::string next_id() {
    char buf[40];
    std::snprintf(buf, sizeof buf, "c%016llx-%llu", static_cast<unsigned long long>(nonce_),
                  static_cast<unsigned long long>(++counter_));
    return buf;
  }

  int timeout_ms() const { return timeout_ms_; }
  int max_attempts() const { return max_attempts_; }
  size_t size() const { return links_.size(); }
  size_t current() const { return current_; }
  void set_current(size_t i) { current_ = i % links_.size(); }
  void answered_by(size_t i) {
    current_ = i;
    last_endpoint_ = &links_[i].endpoint;
  }
  const std::string& last_endpoint() const {
    static const std::string none;
    return last_endpoint_ ? *last_endpoint_ : none;
  }
  uint64_t failovers() const { return failovers_; }
  void count_failover() { ++failovers_; }

 private:
  connection() = default;

  // Milliseconds left of `total` since `start` (never negative); total < 0: no limit.
  static int left_of(clock_type::time_point start, int total) {
    if (total < 0) return -1;
    const auto spent =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count();
    return static_cast<int>(std::max<int64_t>(0, total - spent));
  }

  std::unique_ptr<zmq::context_t> owned_;  // destroyed after the sockets
  std::vector<link> links_;
  size_t current_ = 0;
  const std::string* last_endpoint_ = nullptr;  // into links_, which never changes after open
  int timeout_ms_ = 2000;
  int max_attempts_ = 1;
  uint64_t failovers_ = 0;
  uint64_t nonce_ = 0;
  uint64_t counter_ = 0;
};

std::span<const uint8_t> bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}

// Sends one message (whose id is `id`) and reads replies until one answers it (match(reply) is
// true), on any endpoint it was sent to; on a timeout it is resent to the next endpoint, up to
// max_attempts in all. Other replies (late answers to earlier requests) are dropped; a reply that
// does not decode ends the call with corrupt. The request is remembered as given up on every
// endpoint it was sent to that did not answer it. `resend`, when given, makes what the attempts
// after the first send (a route request marked `retry`; called only when a failover happens, so
// a call answered at once encodes nothing more); otherwise they send `payload` again.
template <class Outcome, class Decode, class Match>
result<Outcome> call_and_wait(connection& c, const std::vector<uint8_t>& payload,
                              const std::string& id, Decode&& decode, Match&& match,
                              const std::function<const std::vector<uint8_t>&()>& resend = {}) {
  const int timeout_ms = c.timeout_ms();
  const size_t start = c.current();
  std::vector<size_t> sent;  // links the request went to, in order
  auto give_up_except = [&](std::optional<size_t> keep) {
    for (size_t i : sent)
      if (!keep || i != *keep) c.abandon(i, id);
  };
  zmq::message_t msg;
  for (int attempt = 0; attempt < c.max_attempts(); ++attempt) {
    const size_t i = (start + static_cast<size_t>(attempt)) % c.size();
    if (attempt > 0) c.count_failover();
    const auto t0 = clock_type::now();
    auto left = [&] {
      if (timeout_ms < 0) return -1;
      const auto spent =
          std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
      return static_cast<int>(std::max<int64_t>(0, timeout_ms - spent));
    };
    status s = c.send(i, attempt > 0 && resend ? resend() : payload, timeout_ms);
    if (s.ok()) {
      if (std::find(sent.begin(), sent.end(), i) == sent.end()) sent.push_back(i);
    } else if (s.code() != status_code::failed_precondition) {
      give_up_except(std::nullopt);
      return s;
    }
    while (!sent.empty()) {
      const int wait = left();
      if (wait == 0) break;
      size_t from = 0;
      s = c.receive(sent, wait, msg, from);
      if (!s.ok()) {
        if (s.code() == status_code::failed_precondition) break;  // this attempt timed out
        give_up_except(std::nullopt);
        return s;
      }
      result<Outcome> r = decode(bytes(msg));
      if (!r.ok()) {
        give_up_except(std::nullopt);
        return r.error();
      }
      if (match(*r)) {
        give_up_except(from);
        c.answered_by(from);
        return r;
      }
      (void)c.take_abandoned(from, outcome_id(*r));  // a late reply: forget it was expected
    }
  }
  give_up_except(std::nullopt);
  // The next call starts at the endpoint after the last one tried (continuing the round robin).
  c.set_current(start + static_cast<size_t>(c.max_attempts()));
  return timeout_status(timeout_ms);
}

// The next reply to arrive on the current endpoint, skipping late replies to requests given up
// there. Errors as connection::receive, or corrupt.
template <class Outcome, class Decode>
result<Outcome> receive_next(connection& c, int timeout_ms, Decode&& decode) {
  const auto t0 = clock_type::now();
  const size_t which[1] = {c.current()};
  zmq::message_t msg;
  for (;;) {
    int wait = timeout_ms;
    if (timeout_ms >= 0) {
      const auto spent =
          std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
      wait = static_cast<int>(std::max<int64_t>(0, timeout_ms - spent));
    }
    size_t from = 0;
    if (status s = c.receive(which, wait, msg, from); !s.ok()) {
      if (s.code() == status_code::failed_precondition) return timeout_status(timeout_ms);
      return s;
    }
    result<Outcome> r = decode(bytes(msg));
    if (r.ok() && c.take_abandoned(from, outcome_id(*r))) continue;
    if (r.ok()) c.answered_by(from);
    return r;
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

  // Replies are surfaced, never filtered: the caller still gets the decision.
  uint64_t warned = 0, fell_back = 0;
  std::map<std::string, std::chrono::steady_clock::time_point> last_printed;  // by warning code

  void surface(const result<route_outcome>& o) {
    if (!o.ok()) return;
    const auto* r = std::get_if<route_reply>(&*o);
    if (r == nullptr) return;
    if (!r->fallback.empty()) ++fell_back;
    if (r->warnings.empty()) return;
    ++warned;
    if (opt.on_route_warning) return opt.on_route_warning(*r);
    const auto now = std::chrono::steady_clock::now();
    for (const std::string& w : r->warnings) {
      const std::string code = w.substr(0, w.find(':'));
      auto it = last_printed.find(code);
      if (it != last_printed.end() && now - it->second < std::chrono::seconds(10)) continue;
      if (last_printed.size() < 64 || it != last_printed.end()) last_printed[code] = now;
      std::fprintf(stderr, "eldr route_client: warning from %s: %s\n",
                   conn->last_endpoint().c_str(), w.c_str());
    }
  }
};

route_client::route_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
route_client::~route_client() = default;

result<std::unique_ptr<route_client>> route_client::connect(
    const std::vector<std::string>& endpoints, client_options options) {
  auto c = connection::open(endpoints, options, options.route_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->opt = std::move(options);
  return std::unique_ptr<route_client>(new route_client(std::move(p)));
}

result<std::unique_ptr<route_client>> route_client::connect(
    std::initializer_list<std::string> endpoints, client_options options) {
  return connect(std::vector<std::string>(endpoints), std::move(options));
}

result<std::unique_ptr<route_client>> route_client::connect(const std::string& endpoint,
                                                            client_options options) {
  return connect(std::vector<std::string>{endpoint}, std::move(options));
}

const std::string& route_client::last_endpoint() const {
  return impl_->conn->last_endpoint();
}
uint64_t route_client::failovers() const {
  return impl_->conn->failovers();
}
uint64_t route_client::warned_replies() const {
  return impl_->warned;
}
uint64_t route_client::fallback_replies() const {
  return impl_->fell_back;
}

result<route_outcome> route_client::route(const route_request& request) {
  impl& m = *impl_;
  try {
    route_request req = m.with_id(request);
    // A resend is marked, so that a router that does not know the id asks its peers for the
    // first decision (docs/cluster.md, "Retries: ask, don't broadcast"). Encoded at the first
    // failover only: a request can carry megabytes of counts.
    std::vector<uint8_t> marked;
    const std::function<const std::vector<uint8_t>&()> resend =
        [&]() -> const std::vector<uint8_t>& {
      if (marked.empty()) {
        req.retry = true;
        marked = encode_route_request(req);
        req.retry = false;
      }
      return marked;
    };
    auto out = call_and_wait<route_outcome>(
        *m.conn, encode_route_request(req), req.id, [&](auto b) { return m.decode(b); },
        [&](const route_outcome& o) {
          if (const auto* r = std::get_if<route_reply>(&o)) return r->id == req.id;
          return answers(std::get<error_reply>(o), req.id);
        },
        resend);
    m.surface(out);
    return out;
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

status route_client::send(const route_request& request) {
  try {
    return impl_->conn->send(impl_->conn->current(), encode_route_request(impl_->with_id(request)),
                             impl_->conn->timeout_ms());
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

result<route_outcome> route_client::receive(int timeout_ms) {
  try {
    auto out = receive_next<route_outcome>(*impl_->conn, timeout_ms,
                                           [&](auto b) { return impl_->decode(b); });
    impl_->surface(out);
    return out;
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

result<std::unique_ptr<worker_client>> worker_client::connect(
    const std::vector<std::string>& endpoints, client_options options) {
  auto c = connection::open(endpoints, options, options.worker_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->err_limits = error_limits(options.route_limits, options.worker_limits.max_payload_bytes,
                               options.worker_limits.max_id_bytes);
  p->opt = std::move(options);
  return std::unique_ptr<worker_client>(new worker_client(std::move(p)));
}

result<std::unique_ptr<worker_client>> worker_client::connect(
    std::initializer_list<std::string> endpoints, client_options options) {
  return connect(std::vector<std::string>(endpoints), std::move(options));
}

result<std::unique_ptr<worker_client>> worker_client::connect(const std::string& endpoint,
                                                              client_options options) {
  return connect(std::vector<std::string>{endpoint}, std::move(options));
}

const std::string& worker_client::last_endpoint() const {
  return impl_->conn->last_endpoint();
}
uint64_t worker_client::failovers() const {
  return impl_->conn->failovers();
}

result<worker_outcome> worker_client::call(const worker_message& message) {
  impl& m = *impl_;
  try {
    const worker_message msg = m.with_id(message);
    const std::string& id = worker_message_id(msg);
    return call_and_wait<worker_outcome>(
        *m.conn, encode_worker_message(msg), id, [&](auto b) { return m.decode(b); },
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
    return impl_->conn->send(impl_->conn->current(), encode_worker_message(impl_->with_id(message)),
                             impl_->conn->timeout_ms());
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

result<worker_outcome> worker_client::receive(int timeout_ms) {
  try {
    return receive_next<worker_outcome>(*impl_->conn, timeout_ms,
                                        [&](auto b) { return impl_->decode(b); });
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

result<std::unique_ptr<admin_client>> admin_client::connect(
    const std::vector<std::string>& endpoints, client_options options) {
  auto c = connection::open(endpoints, options, options.admin_limits.max_payload_bytes);
  if (!c.ok()) return c.error();
  auto p = std::make_unique<impl>();
  p->conn = std::move(*c);
  p->err_limits = error_limits(options.route_limits, options.admin_limits.max_payload_bytes,
                               options.admin_limits.max_id_bytes);
  p->opt = std::move(options);
  return std::unique_ptr<admin_client>(new admin_client(std::move(p)));
}

result<std::unique_ptr<admin_client>> admin_client::connect(
    std::initializer_list<std::string> endpoints, client_options options) {
  return connect(std::vector<std::string>(endpoints), std::move(options));
}

result<std::unique_ptr<admin_client>> admin_client::connect(const std::string& endpoint,
                                                            client_options options) {
  return connect(std::vector<std::string>{endpoint}, std::move(options));
}

const std::string& admin_client::last_endpoint() const {
  return impl_->conn->last_endpoint();
}
uint64_t admin_client::failovers() const {
  return impl_->conn->failovers();
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
        *m.conn, encode_admin_request(req), req.id, [&](auto b) { return m.decode(b); },
        [&](const admin_reply& r) { return r.id == req.id || r.id.empty(); });
    if (!reply.ok()) return reply.error();
    if (reply->ok) return std::move(reply->result);
    std::string msg = std::string(to_string(reply->code)) + ": " + reply->error;
    switch (reply->code) {
      case wire_error_code::malformed:
      case wire_error_code::too_large:
      case wire_error_code::unknown_type:
      case wire_error_code::unknown_model:
        return status::invalid_argument(std::move(msg));
      default:
        return status::failed_precondition(std::move(msg));
    }
  } catch (const std::exception& e) {
    return status::io_error(e.what());
  }
}

}  // namespace eldr
