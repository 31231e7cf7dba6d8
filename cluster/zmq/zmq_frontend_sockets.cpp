// zmq_frontend_sockets: the frontend's socket setup -- CURVE and its ZAP handler, binding the
// ROUTER and prebound publisher sockets (zmq_frontend_impl.hpp).
#include "cluster/zmq/zmq_frontend_impl.hpp"

namespace eldr {

using namespace frontend_detail;

// Validates the CURVE options and, with an allowlist, binds the ZAP handler: it must exist
// before the ROUTER sockets bind, or early handshakes would go unauthenticated.
status zmq_frontend::impl::configure_curve() {
  const auto& c = opt.curve;
  if (c.server_secret_key.empty()) {
    if (!c.authorized_client_keys.empty())
      return status::invalid_argument(
          "curve.authorized_client_keys: set without curve.server_secret_key (an allowlist "
          "needs CURVE on)");
    return {};
  }
  if (!curve_available())
    return status::failed_precondition(
        "curve.server_secret_key: this libzmq is built without CURVE support");
  auto pub = eldr::curve_public_key(c.server_secret_key);
  if (!pub.ok())
    return status(pub.error().code(), "curve.server_secret_key: " + pub.error().message());
  curve_public = std::move(*pub);
  for (const auto& k : c.authorized_client_keys) {
    auto key = decode_curve_key(k);
    if (!key.ok())
      return status::invalid_argument("curve.authorized_client_keys: \"" + k +
                                      "\": " + key.error().message());
    allowed_keys.insert(*key);
  }
  if (allowed_keys.empty()) return {};  // no handler: libzmq admits any CURVE client
  try {
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
    s->set(zmq::sockopt::linger, 0);
    s->bind(zap_endpoint);
    zap_poll = {notification_fd(*s), true};
    zap = std::move(s);
  } catch (const zmq::error_t& e) {
    return status::invalid_argument(
        std::string("curve.authorized_client_keys: cannot bind the ZAP handler: ") + e.what());
  }
  return {};
}

// Names the configuration key and the endpoint: "Address already in use" alone does not say
// which port another process (often a second eldr-node) holds.
status zmq_frontend::impl::bind_error(const std::string& key, const std::string& endpoint,
                                      const zmq::error_t& e) {
  const std::string hint = e.num() == EADDRINUSE
                               ? " (the port is taken: another eldr-node or another program "
                                 "listens there; change " +
                                     key + " or stop it)"
                               : "";
  const std::string message = key + ": cannot bind " + endpoint + ": " + e.what() + hint;
  return e.num() == EADDRINUSE ? status::io_error(message) : status::invalid_argument(message);
}

status zmq_frontend::impl::bind_all() {
  size_t c = 0;
  try {
    for (; c < frontend_channel_count; ++c) {
      if (opt.endpoints[c].empty()) continue;
      auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
      s->set(zmq::sockopt::linger, 0);
      // Admin replies can be whole centroid files: ZeroMQ holds few of them per peer, the rest
      // wait in the capped backlog.
      s->set(zmq::sockopt::sndhwm, c == 2 ? std::min(opt.send_hwm, 16) : opt.send_hwm);
      s->set(zmq::sockopt::rcvhwm, opt.recv_hwm);
      // Never block on a peer. ROUTER_MANDATORY makes ZeroMQ say what it would otherwise do
      // silently (drop, and report the send as done): EAGAIN when the peer's queue is at its
      // high-water mark, EHOSTUNREACH when the peer is gone. Without it no drop was ever seen.
      s->set(zmq::sockopt::sndtimeo, 0);
      s->set(zmq::sockopt::router_mandatory, true);
      const uint32_t limit = c == 0   ? opt.route_limits.max_payload_bytes
                             : c == 1 ? opt.worker_limits.max_payload_bytes
                                      : opt.admin_limits.max_payload_bytes;
      // ZeroMQ drops larger frames before we see them; the codec's own limit answers the rest.
      s->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limit) + 4096);
      if (!curve_public.empty()) {
        s->set(zmq::sockopt::curve_server, true);
        s->set(zmq::sockopt::curve_secretkey, opt.curve.server_secret_key);
        if (zap) s->set(zmq::sockopt::zap_domain, std::string(zap_domain));
      }
      s->bind(bind_form(opt.endpoints[c]));
      bound[c] = s->get(zmq::sockopt::last_endpoint);
      router_poll[c] = {notification_fd(*s), true};
      routers[c] = std::move(s);
    }
  } catch (const zmq::error_t& e) {
    return bind_error(std::string("endpoints.") + to_string(static_cast<frontend_channel>(c)),
                      opt.endpoints[c], e);
  }
  for (const auto& [key, endpoint] : opt.publisher_binds) {
    try {
      auto s = new_sub();
      s->bind(endpoint);
      bound_publishers[key] = s->get(zmq::sockopt::last_endpoint);
      spdlog::info("KV-event publishers may connect to {}", bound_publishers[key]);
      prebound[std::string(kv_bind_prefix) + endpoint] = std::move(s);
    } catch (const zmq::error_t& e) {
      return bind_error(key, endpoint, e);
    }
  }
  wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return status::io_error("eventfd failed");
  return {};
}

// Answers the ZAP requests waiting on the handler socket. Every request gets exactly one reply
// (a REP socket alternates): 200 for an allowed client key, 400 otherwise.
void zmq_frontend::impl::handle_zap() {
  zap_poll.hot = true;  // its answers are sends (zmq_frontend_impl.hpp, `polled`)
  std::vector<zmq::message_t> req;
  for (int n = 0; n < 256; ++n) {
    req.clear();
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*zap, std::back_inserter(req), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    // version, request id, domain, address, identity, mechanism, credentials...
    std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
    std::string_view code = "400";
    std::string_view text = "client key not authorized";
    std::string user_id;
    if (req.size() < 6 || req[0].to_string_view() != "1.0") {
      text = "malformed ZAP request";
    } else if (req[2].to_string_view() != zap_domain) {
      text = "unknown ZAP domain";
    } else if (req[5].to_string_view() != "CURVE" || req.size() != 7 ||
               req[6].size() != curve_key_bytes) {
      text = "CURVE required";
    } else {
      curve_key key{};
      std::memcpy(key.data(), req[6].data(), key.size());
      if (allowed_keys.contains(key)) {
        code = "200";
        text = "OK";
        user_id = encode_curve_key(key);
      }
    }
    (code == "200" ? counters.curve_accepted : counters.curve_refused).fetch_add(1);
    try {
      zap->send(zmq::buffer(std::string_view("1.0")), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(code), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(text), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(user_id), zmq::send_flags::sndmore);
      zap->send(zmq::message_t(), zmq::send_flags::none);  // no metadata
    } catch (const zmq::error_t& e) {
      spdlog::error("cannot answer a ZAP request: {}", e.what());
      return;
    }
  }
}

}  // namespace eldr
