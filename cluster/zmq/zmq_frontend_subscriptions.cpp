// zmq_frontend_subscriptions: the frontend's publisher subscriptions -- SUB sockets, the
// subscription commands of other threads, and replay requests over DEALER (zmq_frontend_impl.hpp).
#include "cluster/zmq/zmq_frontend_impl.hpp"

namespace eldr {

using namespace frontend_detail;

void zmq_frontend::impl::push_sub_command(sub_command c) {
  {
    std::lock_guard lock(mutex);
    sub_commands.push_back(std::move(c));
  }
  wake();
}

// What a refused ZeroMQ call means for the one who asked for the subscription.
status zmq_frontend::impl::subscribe_error(const std::string& endpoint, const zmq::error_t& e) {
  if (e.num() == EMFILE)
    return status::out_of_range("cannot follow publisher " + endpoint +
                                ": ZeroMQ's socket limit is reached (" + e.what() + ")");
  return status::invalid_argument("ZeroMQ refuses publisher endpoint " + endpoint + ": " +
                                  e.what());
}

std::unique_ptr<zmq::socket_t> zmq_frontend::impl::new_sub() {
  auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::sub);
  s->set(zmq::sockopt::rcvhwm, 100000);
  // A publisher that is down is retried with backoff (100 ms doubling to 2 s) instead of ZeroMQ's
  // fixed 100 ms: with 256 registered endpoints nobody listens on, fixed retries cost the idle
  // node ~1/3 of a core (fuzz.live_node, publisher_flood). A publisher back up is followed
  // again within 2 s, and its gap is replayed as after any reconnect.
  s->set(zmq::sockopt::reconnect_ivl, 100);
  s->set(zmq::sockopt::reconnect_ivl_max, 2000);
  s->set(zmq::sockopt::maxmsgsize, opt.max_publisher_message_bytes);
  s->set(zmq::sockopt::linger, 0);
  s->set(zmq::sockopt::subscribe, "");
  return s;
}

std::unique_ptr<zmq::socket_t> zmq_frontend::impl::make_sub(const std::string& endpoint) {
  // Bound at start (frontend_options::publisher_binds): taken once.
  if (auto it = prebound.find(endpoint); it != prebound.end()) {
    auto s = std::move(it->second);
    prebound.erase(it);
    return s;
  }
  auto s = new_sub();
  // "bind:ENDPOINT": publishers connect to the node (vLLM's connecting ZmqEventPublisher).
  if (std::string_view(endpoint).substr(0, kv_bind_prefix.size()) == kv_bind_prefix) {
    s->bind(endpoint.substr(kv_bind_prefix.size()));
    spdlog::info("KV-event publishers may connect to {}", s->get(zmq::sockopt::last_endpoint));
  } else {
    s->connect(endpoint);
  }
  return s;
}

void zmq_frontend::impl::add_subscription(sub_command& c) {
  auto& req = c.request;
  for (auto& s : subs)
    if (s.id == c.id) {  // the same endpoint again: the socket exists; a new replay endpoint
                         // serves the next replay
      s.replay_endpoint = std::move(req.replay_endpoint);
      if (req.on_replay) s.on_replay = std::move(req.on_replay);
      if (req.done) req.done(c.id);
      return;
    }
  try {
    sub_socket s;
    s.id = c.id;
    s.sub = make_sub(req.endpoint);
    s.sub_poll = {notification_fd(*s.sub), true};
    s.endpoint = std::move(req.endpoint);
    s.replay_endpoint = std::move(req.replay_endpoint);
    s.on_replay = std::move(req.on_replay);
    subs.push_back(std::move(s));
    counters.subscriptions.store(static_cast<uint32_t>(subs.size()));
    spdlog::info("subscribed to publisher {} (subscription {})", subs.back().endpoint, c.id);
    if (req.done) req.done(c.id);
  } catch (const zmq::error_t& e) {
    counters.subscribe_failed.fetch_add(1);
    // The one who asked logs it (rate-limited) and answers the client.
    spdlog::debug("cannot subscribe to publisher {}: {}", req.endpoint, e.what());
    {
      std::lock_guard lock(mutex);
      auto it = subscription_ids.find(req.endpoint);
      if (it != subscription_ids.end() && it->second == c.id) subscription_ids.erase(it);
    }
    if (req.done) req.done(subscribe_error(req.endpoint, e));
  }
}

// Ends the replay in progress on `s` (ok: the publisher's end marker came) and closes its
// DEALER, so that a late answer can never be taken for the answer to a later request.
void zmq_frontend::impl::end_replay(sub_socket& s, bool ok) {
  s.dealer.reset();
  if (!ok) counters.replays_failed.fetch_add(1);
  if (s.on_replay) s.on_replay(replay_message{s.id, s.token, true, ok, 0, {}});
}

void zmq_frontend::impl::start_replay(sub_socket& s, uint64_t token, uint64_t start) {
  counters.replays.fetch_add(1);
  if (s.dealer) end_replay(s, false);  // superseded by this request
  s.token = token;
  if (s.replay_endpoint.empty()) return end_replay(s, false);
  uint8_t seq8[8];
  for (int i = 0; i < 8; ++i)
    seq8[i] = static_cast<uint8_t>(start >> (56 - 8 * i));
  try {
    auto d = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    d->set(zmq::sockopt::maxmsgsize, opt.max_publisher_message_bytes);
    d->set(zmq::sockopt::linger, 0);
    d->connect(s.replay_endpoint);
    // A connecting DEALER queues the request until the peer is there; never block on it.
    bool sent =
        d->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait).has_value();
    sent = sent && d->send(zmq::buffer(seq8, 8), zmq::send_flags::dontwait).has_value();
    s.dealer_poll = {notification_fd(*d), true};
    s.dealer = std::move(d);
    s.deadline_ns = steady_ns() + int64_t{opt.replay_timeout_ms} * 1'000'000;
    if (!sent) end_replay(s, false);
  } catch (const zmq::error_t& e) {
    spdlog::warn("replay from {}: {}", s.replay_endpoint, e.what());
    end_replay(s, false);
  }
}

// Reads what the replay DEALER of `s` has (both reply shapes: [empty, seq, payload] and
// [empty, topic, seq, payload]), up to a budget.
void zmq_frontend::impl::read_replay(sub_socket& s, std::vector<zmq::message_t>& parts) {
  s.dealer_poll.hot = true;  // until the DEALER is drained below (its budget may end first)
  for (int n = 0; n < 256 && s.dealer; ++n) {
    parts.clear();
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*s.dealer, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return end_replay(s, false);
    }
    if (!got) {
      s.dealer_poll.hot = false;
      return;
    }
    std::optional<uint64_t> seq;
    if ((parts.size() == 3 || parts.size() == 4) && parts[0].size() == 0)
      seq = decode_sequence(bytes(parts[parts.size() - 2]));
    if (!seq) {
      spdlog::warn("replay from {}: a reply of {} frames that is not a replayed batch",
                   s.replay_endpoint, parts.size());
      return end_replay(s, false);
    }
    if (*seq == ~uint64_t{0}) return end_replay(s, true);
    s.deadline_ns = steady_ns() + int64_t{opt.replay_timeout_ms} * 1'000'000;
    const auto b = bytes(parts.back());
    if (s.on_replay)
      s.on_replay(replay_message{s.id, s.token, false, false, *seq, {b.begin(), b.end()}});
  }
}

// Ends every replay whose publisher has been silent past its deadline; returns the
// milliseconds until the next deadline (-1: none), the poll's timeout.
long zmq_frontend::impl::expire_replays() {
  const int64_t now = steady_ns();
  int64_t next = INT64_MAX;
  for (auto& s : subs) {
    if (!s.dealer) continue;
    if (now >= s.deadline_ns) {
      spdlog::warn("replay from {}: no answer within {} ms", s.replay_endpoint,
                   opt.replay_timeout_ms);
      end_replay(s, false);
      continue;
    }
    next = std::min(next, s.deadline_ns);
  }
  if (next == INT64_MAX) return -1;
  return static_cast<long>((next - now) / 1'000'000 + 1);
}

void zmq_frontend::impl::apply_sub_commands() {
  std::vector<sub_command> todo;
  {
    std::lock_guard lock(mutex);
    todo.swap(sub_commands);
  }
  for (auto& c : todo) {
    switch (c.what) {
      case sub_command::kind::add:
        add_subscription(c);
        break;
      case sub_command::kind::remove:
        for (size_t i = 0; i < subs.size(); ++i)
          if (subs[i].id == c.id) {
            if (subs[i].dealer) end_replay(subs[i], false);
            spdlog::info("unsubscribed from publisher {} (subscription {})", subs[i].endpoint,
                         c.id);
            subs.erase(subs.begin() + static_cast<std::ptrdiff_t>(i));
            break;
          }
        counters.subscriptions.store(static_cast<uint32_t>(subs.size()));
        break;
      case sub_command::kind::replay: {
        bool found = false;
        for (auto& s : subs)
          if (s.id == c.id) {
            found = true;
            start_replay(s, c.token, c.start);
          }
        if (!found) counters.replays_failed.fetch_add(1);
        break;
      }
    }
  }
}

}  // namespace eldr
