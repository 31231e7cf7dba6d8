// zmq_frontend: see zmq_frontend.hpp. This file holds the poll loop, the route/worker/admin
// dispatch and the public methods; the sockets and CURVE, the reply queue and the subscriptions are
// in zmq_frontend_{sockets,replies,subscriptions}.cpp over the state in zmq_frontend_impl.hpp.
#include "cluster/zmq/zmq_frontend.hpp"

#include "cluster/zmq/zmq_frontend_impl.hpp"

namespace eldr {

using namespace frontend_detail;

const char* to_string(frontend_channel c) {
  switch (c) {
    case frontend_channel::route:
      return "route";
    case frontend_channel::worker:
      return "worker";
    case frontend_channel::admin:
      return "admin";
  }
  return "unknown";
}

void zmq_frontend::impl::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd, &one, sizeof one);
}

void zmq_frontend::impl::stop() {
  if (thread.joinable()) {
    stopping = true;
    wake();
    thread.join();
  }
  if (wake_fd >= 0) ::close(wake_fd);
  wake_fd = -1;
}

void zmq_frontend::impl::handle_router(frontend_channel c, std::vector<zmq::message_t>& parts) {
  counters.received[static_cast<size_t>(c)].fetch_add(1);
  // DEALER peers send [id, payload]; REQ peers [id, "", payload].
  reply_address from{c, {}, false};
  const zmq::message_t* payload = nullptr;
  if (parts.size() == 2) {
    payload = &parts[1];
  } else if (parts.size() == 3 && parts[1].size() == 0) {
    from.delimiter = true;
    payload = &parts[2];
  } else {
    // Answered like any error, but it took no pending slot, so its answer releases none. A
    // REQ peer (an empty second frame) only reads an answer behind a delimiter.
    counters.bad_frames.fetch_add(1);
    if (!parts.empty()) {
      from.peer = parts[0].to_string();
      from.delimiter = parts.size() > 2 && parts[1].size() == 0;
      count_and_answer(from, std::nullopt, wire_error_code::malformed,
                       "a message is exactly one frame (MessagePack map)");
    }
    return;
  }
  from.peer = parts[0].to_string();
  const auto data = bytes(*payload);
  switch (c) {
    case frontend_channel::route: {
      // The answer, whatever it is, releases the slot: take it first.
      from.slot = take_slot();
      issues.clear();
      auto req = decode_route_request(data, opt.route_limits, issues);
      if (!req.ok()) {
        count_and_answer(from, std::nullopt, wire_error_for_decode(req.error()),
                         req.error().message());
        return;
      }
      // Shed after decoding, so that the answer carries the id a pipelining client matches.
      if (counters.pending.load() > opt.max_pending) {
        counters.overloaded.fetch_add(1);
        reply_error_now(from, std::move(req->id), wire_error_code::overloaded,
                        "the node has too many pending route requests");
        return;
      }
      route_job job{std::move(from), std::move(*req), steady_ns(),
                    static_cast<uint32_t>(issues.size())};
      callbacks.on_route(std::move(job));
      return;
    }
    case frontend_channel::worker: {
      auto m = decode_worker_message(data, opt.worker_limits);
      if (!m.ok()) {
        count_and_answer(from, std::nullopt, wire_error_for_decode(m.error()), m.error().message());
        return;
      }
      callbacks.on_worker(worker_job{std::move(from), std::move(*m)});
      return;
    }
    case frontend_channel::admin: {
      auto m = decode_admin_request(data, opt.admin_limits);
      if (!m.ok()) {
        count_and_answer(from, std::nullopt, wire_error_for_decode(m.error()), m.error().message());
        return;
      }
      callbacks.on_admin(admin_job{std::move(from), std::move(*m)});
      return;
    }
  }
}

void zmq_frontend::impl::count_and_answer(const reply_address& to, std::optional<std::string> id,
                                          wire_error_code code, std::string message) {
  switch (code) {
    case wire_error_code::too_large:
      counters.too_large.fetch_add(1);
      break;
    case wire_error_code::unknown_type:
      counters.unknown_type.fetch_add(1);
      break;
    default:
      counters.malformed.fetch_add(1);
      break;
  }
  reply_error_now(to, std::move(id), code, std::move(message));
}

void zmq_frontend::impl::reply_error_now(const reply_address& to, std::optional<std::string> id,
                                         wire_error_code code, std::string message) {
  error_reply e{std::move(id), code, std::move(message)};
  queue(to, encode_error_reply(e));
}

namespace {

// Reads up to a budget of messages from `s` and hands each to `take`; the socket stays hot when
// the budget ends first, so that one busy socket cannot starve the others nor be left unread.
template <typename Take>
void drain(zmq::socket_t& s, polled& p, std::vector<zmq::message_t>& parts, Take&& take,
           std::atomic<uint64_t>* bad_frames) {
  for (int n = 0; n < 256; ++n) {
    parts.clear();
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(s, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      if (bad_frames) bad_frames->fetch_add(1);
      break;  // hot below: whatever is behind the bad message is read next round
    }
    if (!got) return;
    take(parts);
  }
  p.hot = true;
}

// Whether the loop must look at `p` this round: its descriptor fired, or it is hot.
bool due(const polled& p, const pollfd& fd) {
  return p.hot || (fd.revents != 0);
}

}  // namespace

void zmq_frontend::impl::run() {
  std::vector<pollfd> fds;
  std::vector<size_t> replaying;  // the subs whose replay DEALER is in fds, in order
  std::vector<zmq::message_t> parts;
  while (!stopping.load()) {
    apply_sub_commands();
    const long timeout_ms = expire_replays();
    // One poll() over every socket's notification descriptor and the wake-up eventfd, in a fixed
    // order: the channels' ROUTERs, the ZAP handler, each subscription's SUB, then each replay
    // DEALER (zmq_frontend_impl.hpp, `polled`).
    fds.clear();
    bool any_hot = false;
    auto add = [&](const polled& p) {
      fds.push_back({p.fd, POLLIN, 0});
      any_hot = any_hot || p.hot;
    };
    for (size_t c = 0; c < frontend_channel_count; ++c)
      if (routers[c]) add(router_poll[c]);
    if (zap) add(zap_poll);
    for (auto& s : subs)
      add(s.sub_poll);
    replaying.clear();
    for (size_t k = 0; k < subs.size(); ++k)
      if (subs[k].dealer) {
        add(subs[k].dealer_poll);
        replaying.push_back(k);
      }
    fds.push_back({wake_fd, POLLIN, 0});
    // The earlier of the next backlog retry and the next replay deadline (-1: none); no wait
    // while a socket is hot.
    auto wait = poll_timeout(steady_ns());
    if (timeout_ms >= 0 && (wait.count() < 0 || wait.count() > timeout_ms))
      wait = std::chrono::milliseconds(timeout_ms);
    if (any_hot) wait = std::chrono::milliseconds(0);
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("frontend poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds.back().revents & POLLIN) send_queued();
    if (!backlog.empty()) flush_backlog(steady_ns());
    size_t i = 0;
    for (size_t c = 0; c < frontend_channel_count; ++c) {
      if (!routers[c]) continue;
      auto& p = router_poll[c];
      // Asked every round, whatever its descriptor says: ZeroMQ's descriptor is edge-triggered,
      // and a notification some other call on the socket consumed would otherwise leave requests
      // unread for good (fuzz.live_node's slow readers stalled so, 2026-12-05). One getsockopt
      // per channel per round.
      ++i;
      if (readable(*routers[c], p))
        drain(
            *routers[c], p, parts,
            [&](std::vector<zmq::message_t>& m) {
              handle_router(static_cast<frontend_channel>(c), m);
            },
            &counters.bad_frames);
    }
    if (zap && due(zap_poll, fds[i++]) && readable(*zap, zap_poll)) handle_zap();
    for (auto& s : subs) {
      if (!due(s.sub_poll, fds[i++]) || !readable(*s.sub, s.sub_poll)) continue;
      drain(
          *s.sub, s.sub_poll, parts,
          [&](std::vector<zmq::message_t>& m) {
            counters.publisher_messages.fetch_add(1);
            publisher_frames f{s.id, {}};
            f.frames.reserve(m.size());
            for (auto& part : m) {
              const auto b = bytes(part);
              f.frames.emplace_back(b.begin(), b.end());
            }
            callbacks.on_publisher(std::move(f));
          },
          nullptr);
    }
    // `s.dealer` again: a replay may have ended since the poll (expired, or superseded).
    for (const size_t k : replaying) {
      auto& s = subs[k];
      if (due(s.dealer_poll, fds[i++]) && s.dealer && readable(*s.dealer, s.dealer_poll))
        read_replay(s, parts);
    }
    // Replies queued by callbacks run on this thread (e.g. errors) go out in the same round.
    bool pending_out = false;
    {
      std::lock_guard lock(mutex);
      pending_out = !outbox.empty();
    }
    if (pending_out) send_queued();
  }
}

zmq_frontend::zmq_frontend(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
zmq_frontend::~zmq_frontend() = default;

result<std::unique_ptr<zmq_frontend>> zmq_frontend::start(frontend_options options,
                                                          frontend_callbacks callbacks) {
  auto p = std::make_unique<impl>(std::move(options), std::move(callbacks));
  // Before the first socket: ZeroMQ reads the cap when it creates the context's socket table.
  if (p->opt.max_sockets > 0 &&
      zmq_ctx_set(p->ctx.handle(), ZMQ_MAX_SOCKETS, p->opt.max_sockets) != 0)
    return status::invalid_argument("cannot set ZeroMQ's socket limit to " +
                                    std::to_string(p->opt.max_sockets));
  if (auto s = p->configure_curve(); !s.ok()) return s;
  if (auto s = p->bind_all(); !s.ok()) return s;
  auto* raw = p.get();
  p->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<zmq_frontend>(new zmq_frontend(std::move(p)));
}

const std::string& zmq_frontend::bound(frontend_channel c) const {
  return impl_->bound[static_cast<size_t>(c)];
}

std::string zmq_frontend::bound_publisher(const std::string& key) const {
  auto it = impl_->bound_publishers.find(key);
  return it == impl_->bound_publishers.end() ? std::string() : it->second;
}

void zmq_frontend::reply(const reply_address& to, std::vector<uint8_t> payload) {
  impl_->queue(to, std::move(payload));
}

void reply_sink::reply_error(const reply_address& to, std::optional<std::string> id,
                             wire_error_code code, std::string message) {
  reply(to, encode_error_reply(error_reply{std::move(id), code, std::move(message)}));
}

void zmq_frontend::subscribe(subscription_request request) {
  impl::sub_command c;
  {
    std::lock_guard lock(impl_->mutex);
    auto [it, inserted] =
        impl_->subscription_ids.try_emplace(request.endpoint, impl_->next_subscription);
    if (inserted) ++impl_->next_subscription;
    c.id = it->second;
  }
  c.request = std::move(request);
  impl_->push_sub_command(std::move(c));
}

void zmq_frontend::unsubscribe(uint32_t subscription) {
  {
    std::lock_guard lock(impl_->mutex);
    for (auto it = impl_->subscription_ids.begin(); it != impl_->subscription_ids.end(); ++it)
      if (it->second == subscription) {
        impl_->subscription_ids.erase(it);
        break;
      }
  }
  impl::sub_command c;
  c.what = impl::sub_command::kind::remove;
  c.id = subscription;
  impl_->push_sub_command(std::move(c));
}

void zmq_frontend::request_replay(uint32_t subscription, uint64_t token, uint64_t start) {
  impl::sub_command c;
  c.what = impl::sub_command::kind::replay;
  c.id = subscription;
  c.token = token;
  c.start = start;
  impl_->push_sub_command(std::move(c));
}

const frontend_counters& zmq_frontend::counters() const {
  return impl_->counters;
}

const std::string& zmq_frontend::curve_public_key() const {
  return impl_->curve_public;
}

}  // namespace eldr
