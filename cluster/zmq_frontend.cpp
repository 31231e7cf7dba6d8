// zmq_frontend: see zmq_frontend.hpp.
#include "cluster/zmq_frontend.hpp"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/curve_keys.hpp"
#include "cluster/kv_events.hpp"

namespace eldr {
namespace {

std::span<const uint8_t> bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "tcp://127.0.0.1:0" is ZeroMQ's "tcp://127.0.0.1:*": both pick a free port.
std::string bind_form(const std::string& endpoint) {
  if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    return endpoint.substr(0, endpoint.size() - 1) + "*";
  return endpoint;
}

// ZAP (RFC 27): libzmq asks this endpoint, in the socket's own context, whether a handshake may
// proceed. The domain tags eldr's ROUTER sockets, so the handler refuses anything else.
constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";
constexpr std::string_view zap_domain = "eldr";

struct queued_reply {
  reply_address to;
  std::vector<uint8_t> payload;
};

// What a reply held in the backlog costs: its payload and its peer's routing id.
uint64_t backlog_cost(const queued_reply& r) {
  return r.payload.size() + r.to.peer.size();
}

// A peer whose ZeroMQ queue was full: its replies in order, and when to try again. The interval
// doubles up to the maximum while the peer reads nothing, so that peers that never read cost a
// few failed sends a second each, not a busy loop.
constexpr int64_t backlog_retry_min_ns = 1'000'000;    // 1 ms
constexpr int64_t backlog_retry_max_ns = 100'000'000;  // 100 ms
struct peer_backlog {
  std::deque<queued_reply> replies;
  uint64_t bytes = 0;  // backlog_cost summed over replies
  int64_t retry_at_ns = 0;
  int64_t interval_ns = backlog_retry_min_ns;
};

enum class send_outcome { sent, full, gone };

}  // namespace

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

class zmq_frontend::impl {
 public:
  impl(frontend_options o, frontend_callbacks cb) : opt(std::move(o)), callbacks(std::move(cb)) {}
  ~impl() { stop(); }

  frontend_options opt;
  frontend_callbacks callbacks;
  frontend_counters counters;
  zmq::context_t ctx{1};
  std::array<std::unique_ptr<zmq::socket_t>, frontend_channel_count> routers;
  std::array<std::string, frontend_channel_count> bound;
  // CURVE: the server's public key ("" = off), and, with an allowlist, the ZAP handler's REP
  // socket (owned by the frontend thread after start) and the allowed keys in binary.
  std::string curve_public;
  std::unique_ptr<zmq::socket_t> zap;
  std::set<curve_key> allowed_keys;
  int wake_fd = -1;
  std::thread thread;
  std::atomic<bool> stopping{false};

  std::mutex mutex;  // guards outbox and the subscription commands, ids and next id
  std::deque<queued_reply> outbox;
  // Subscription changes asked from other threads, applied in order by the frontend thread.
  struct sub_command {
    enum class kind { add, remove, replay } what = kind::add;
    uint32_t id = 0;
    subscription_request request;   // add
    uint64_t token = 0, start = 0;  // replay
  };
  std::vector<sub_command> sub_commands;
  std::map<std::string, uint32_t> subscription_ids;  // endpoint -> id, guarded by mutex
  uint32_t next_subscription = 0;                    // ids are never reused

  // Owned by the frontend thread.
  // Pending slots taken and not yet released (reply_address::slot); an id is released once.
  std::unordered_set<uint64_t> open_slots;
  uint64_t next_slot = 1;
  // Replies for peers whose ZeroMQ queue is full, by (channel, routing id); an entry exists only
  // while it holds replies. backlog_bytes sums backlog_cost over all of them.
  std::map<std::pair<size_t, std::string>, peer_backlog> backlog;
  uint64_t backlog_bytes = 0;
  uint64_t backlog_count = 0;

  // Publisher SUB sockets bound by bind_all, by subscription endpoint ("bind:ENDPOINT"), until
  // their subscribe() takes them; owned by the frontend thread once it runs.
  std::map<std::string, std::unique_ptr<zmq::socket_t>> prebound;

  // One followed publisher; owned by the frontend thread.
  struct sub_socket {
    uint32_t id = 0;
    std::string endpoint, replay_endpoint;
    std::unique_ptr<zmq::socket_t> sub;
    std::function<void(replay_message)> on_replay;
    // The replay in progress, if any: its DEALER (null = none), token and deadline.
    std::unique_ptr<zmq::socket_t> dealer;
    uint64_t token = 0;
    int64_t deadline_ns = 0;
  };
  std::vector<sub_socket> subs;
  std::vector<kv_decode_issue> issues;

  // Validates the CURVE options and, with an allowlist, binds the ZAP handler: it must exist
  // before the ROUTER sockets bind, or early handshakes would go unauthenticated.
  status configure_curve() {
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
      zap = std::move(s);
    } catch (const zmq::error_t& e) {
      return status::invalid_argument(
          std::string("curve.authorized_client_keys: cannot bind the ZAP handler: ") + e.what());
    }
    return {};
  }

  // Names the configuration key and the endpoint: "Address already in use" alone does not say
  // which port another process (often a second eldr-node) holds.
  static status bind_error(const std::string& key, const std::string& endpoint,
                           const zmq::error_t& e) {
    const std::string hint = e.num() == EADDRINUSE
                                 ? " (the port is taken: another eldr-node or another program "
                                   "listens there; change " +
                                       key + " or stop it)"
                                 : "";
    const std::string message = key + ": cannot bind " + endpoint + ": " + e.what() + hint;
    return e.num() == EADDRINUSE ? status::io_error(message) : status::invalid_argument(message);
  }

  status bind_all() {
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
        spdlog::info("KV-event publishers may connect to {}", s->get(zmq::sockopt::last_endpoint));
        prebound[std::string(kv_bind_prefix) + endpoint] = std::move(s);
      } catch (const zmq::error_t& e) {
        return bind_error(key, endpoint, e);
      }
    }
    wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) return status::io_error("eventfd failed");
    return {};
  }

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd, &one, sizeof one);
  }

  void stop() {
    if (thread.joinable()) {
      stopping = true;
      wake();
      thread.join();
    }
    if (wake_fd >= 0) ::close(wake_fd);
    wake_fd = -1;
  }

  void queue(reply_address to, std::vector<uint8_t> payload) {
    bool was_empty = false;
    {
      std::lock_guard lock(mutex);
      was_empty = outbox.empty();
      outbox.push_back({std::move(to), std::move(payload)});
    }
    if (was_empty) wake();  // one wake per burst: the loop drains the whole outbox
  }

  uint64_t take_slot() {
    const uint64_t id = next_slot++;
    open_slots.insert(id);
    counters.pending.fetch_add(1);
    return id;
  }

  void release_slot(uint64_t id) {
    if (id != 0 && open_slots.erase(id) != 0) counters.pending.fetch_sub(1);
  }

  void send_queued() {
    // Consume the wake-up BEFORE taking the batch: a reply queued after the swap finds the
    // outbox empty and wakes the loop again, so none is left behind.
    uint64_t dummy = 0;
    [[maybe_unused]] const auto n = ::read(wake_fd, &dummy, sizeof dummy);
    std::deque<queued_reply> batch;
    {
      std::lock_guard lock(mutex);
      batch.swap(outbox);
    }
    const int64_t now = steady_ns();
    for (auto& r : batch) {
      // Answered, whether it is sent, waits or is dropped below.
      release_slot(r.to.slot);
      deliver(std::move(r), now);
    }
  }

  // One reply, without blocking: ZeroMQ takes it, its queue for the peer is full, or the peer is
  // gone (then nothing of the message was sent).
  send_outcome try_send(const queued_reply& r) {
    auto& s = routers[static_cast<size_t>(r.to.channel)];
    if (!s) return send_outcome::gone;
    try {
      // With ROUTER_MANDATORY the routing-id frame is where ZeroMQ refuses; once it is taken, the
      // rest of the message is too (the high-water mark counts whole messages).
      if (!s->send(zmq::buffer(r.to.peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return send_outcome::full;
      if (r.to.delimiter)
        (void)s->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      (void)s->send(zmq::message_t(r.payload.data(), r.payload.size()), zmq::send_flags::dontwait);
      return send_outcome::sent;
    } catch (const zmq::error_t&) {
      return send_outcome::gone;  // EHOSTUNREACH: no such peer (any more)
    }
  }

  void drop(uint64_t n) { counters.replies_dropped.fetch_add(n); }

  void publish_backlog() {
    counters.queued_reply_bytes.store(backlog_bytes);
    counters.queued_replies.store(backlog_count);
    if (backlog_bytes > counters.queued_reply_bytes_peak.load())
      counters.queued_reply_bytes_peak.store(backlog_bytes);
  }

  // Drops the oldest reply waiting for a peer (counted over the cap).
  void evict_oldest(peer_backlog& b) {
    const uint64_t cost = backlog_cost(b.replies.front());
    b.replies.pop_front();
    b.bytes -= cost;
    backlog_bytes -= cost;
    --backlog_count;
    counters.replies_over_cap.fetch_add(1);
    drop(1);
  }

  // Appends to a peer's backlog within the cap. At the cap, the peer that holds the most gives
  // way (its oldest replies are dropped while it holds more than this peer would): peers that
  // never read then cannot take the whole cap from one that is only briefly behind.
  void hold(peer_backlog& b, queued_reply r) {
    const uint64_t cost = backlog_cost(r);
    while (backlog_bytes + cost > opt.max_queued_reply_bytes) {
      peer_backlog* largest = nullptr;
      for (auto& [key, other] : backlog)
        if (!other.replies.empty() && (!largest || other.bytes > largest->bytes)) largest = &other;
      if (!largest || largest == &b || largest->bytes <= b.bytes + cost) break;
      evict_oldest(*largest);
    }
    if (backlog_bytes + cost > opt.max_queued_reply_bytes) {
      counters.replies_over_cap.fetch_add(1);
      return drop(1);
    }
    backlog_bytes += cost;
    b.bytes += cost;
    ++backlog_count;
    b.replies.push_back(std::move(r));
  }

  void deliver(queued_reply r, int64_t now) {
    auto key = std::make_pair(static_cast<size_t>(r.to.channel), r.to.peer);
    // A peer with a backlog gets its replies in order: behind the ones already waiting.
    if (auto it = backlog.find(key); it != backlog.end()) {
      hold(it->second, std::move(r));
      return publish_backlog();
    }
    switch (try_send(r)) {
      case send_outcome::sent:
        counters.replies_sent.fetch_add(1);
        return;
      case send_outcome::gone:
        return drop(1);
      case send_outcome::full: {
        peer_backlog b;
        b.retry_at_ns = now + b.interval_ns;
        hold(b, std::move(r));
        if (!b.replies.empty()) backlog.emplace(std::move(key), std::move(b));
        return publish_backlog();
      }
    }
  }

  // Sends what the peers whose retry time has come can take now.
  void flush_backlog(int64_t now) {
    for (auto it = backlog.begin(); it != backlog.end();) {
      auto& b = it->second;
      if (b.retry_at_ns > now) {
        ++it;
        continue;
      }
      bool progressed = false, gone = false;
      while (!b.replies.empty()) {
        const auto outcome = try_send(b.replies.front());
        if (outcome == send_outcome::full) break;
        if (outcome == send_outcome::gone) {
          gone = true;
          break;
        }
        counters.replies_sent.fetch_add(1);
        backlog_bytes -= backlog_cost(b.replies.front());
        b.bytes -= backlog_cost(b.replies.front());
        --backlog_count;
        b.replies.pop_front();
        progressed = true;
      }
      if (gone) {
        // The peer left: nothing queued for it can be delivered.
        drop(b.replies.size());
        backlog_bytes -= b.bytes;
        b.bytes = 0;
        backlog_count -= b.replies.size();
        b.replies.clear();
      }
      if (b.replies.empty()) {
        it = backlog.erase(it);
        continue;
      }
      b.interval_ns =
          progressed ? backlog_retry_min_ns : std::min(b.interval_ns * 2, backlog_retry_max_ns);
      b.retry_at_ns = now + b.interval_ns;
      ++it;
    }
    publish_backlog();
  }

  // How long the loop may sleep: until the earliest backlog retry, or indefinitely.
  std::chrono::milliseconds poll_timeout(int64_t now) const {
    if (backlog.empty()) return std::chrono::milliseconds(-1);
    int64_t first = INT64_MAX;
    for (const auto& [key, b] : backlog)
      first = std::min(first, b.retry_at_ns);
    if (first <= now) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds((first - now + 999'999) / 1'000'000);
  }

  void push_sub_command(sub_command c) {
    {
      std::lock_guard lock(mutex);
      sub_commands.push_back(std::move(c));
    }
    wake();
  }

  // What a refused ZeroMQ call means for the one who asked for the subscription.
  static status subscribe_error(const std::string& endpoint, const zmq::error_t& e) {
    if (e.num() == EMFILE)
      return status::out_of_range("cannot follow publisher " + endpoint +
                                  ": ZeroMQ's socket limit is reached (" + e.what() + ")");
    return status::invalid_argument("ZeroMQ refuses publisher endpoint " + endpoint + ": " +
                                    e.what());
  }

  std::unique_ptr<zmq::socket_t> new_sub() {
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

  std::unique_ptr<zmq::socket_t> make_sub(const std::string& endpoint) {
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

  void add_subscription(sub_command& c) {
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
  void end_replay(sub_socket& s, bool ok) {
    s.dealer.reset();
    if (!ok) counters.replays_failed.fetch_add(1);
    if (s.on_replay) s.on_replay(replay_message{s.id, s.token, true, ok, 0, {}});
  }

  void start_replay(sub_socket& s, uint64_t token, uint64_t start) {
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
      bool sent = d->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                      .has_value();
      sent = sent && d->send(zmq::buffer(seq8, 8), zmq::send_flags::dontwait).has_value();
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
  void read_replay(sub_socket& s, std::vector<zmq::message_t>& parts) {
    for (int n = 0; n < 256 && s.dealer; ++n) {
      parts.clear();
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(*s.dealer, std::back_inserter(parts), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        return end_replay(s, false);
      }
      if (!got) return;
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
  long expire_replays() {
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

  void apply_sub_commands() {
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

  // Answers the ZAP requests waiting on the handler socket. Every request gets exactly one reply
  // (a REP socket alternates): 200 for an allowed client key, 400 otherwise.
  void handle_zap() {
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

  void handle_router(frontend_channel c, std::vector<zmq::message_t>& parts) {
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
        count_and_answer(from, std::nullopt, route_error_code::malformed,
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
          count_and_answer(from, std::nullopt, route_error_code_for(req.error()),
                           req.error().message());
          return;
        }
        // Shed after decoding, so that the answer carries the id a pipelining client matches.
        if (counters.pending.load() > opt.max_pending) {
          counters.overloaded.fetch_add(1);
          reply_error_now(from, std::move(req->id), route_error_code::overloaded,
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
          count_and_answer(from, std::nullopt, route_error_code_for(m.error()),
                           m.error().message());
          return;
        }
        callbacks.on_worker(worker_job{std::move(from), std::move(*m)});
        return;
      }
      case frontend_channel::admin: {
        auto m = decode_admin_request(data, opt.admin_limits);
        if (!m.ok()) {
          count_and_answer(from, std::nullopt, route_error_code_for(m.error()),
                           m.error().message());
          return;
        }
        callbacks.on_admin(admin_job{std::move(from), std::move(*m)});
        return;
      }
    }
  }

  void count_and_answer(const reply_address& to, std::optional<std::string> id,
                        route_error_code code, std::string message) {
    switch (code) {
      case route_error_code::too_large:
        counters.too_large.fetch_add(1);
        break;
      case route_error_code::unknown_type:
        counters.unknown_type.fetch_add(1);
        break;
      default:
        counters.malformed.fetch_add(1);
        break;
    }
    reply_error_now(to, std::move(id), code, std::move(message));
  }

  void reply_error_now(const reply_address& to, std::optional<std::string> id,
                       route_error_code code, std::string message) {
    error_reply e{std::move(id), code, std::move(message)};
    queue(to, encode_error_reply(e));
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    std::vector<zmq::message_t> parts;
    std::vector<frontend_channel> item_channel;
    std::vector<size_t> dealer_sub;  // the sub of each replay DEALER polled
    while (!stopping.load()) {
      apply_sub_commands();
      const long timeout_ms = expire_replays();
      items.clear();
      item_channel.clear();
      for (size_t c = 0; c < frontend_channel_count; ++c) {
        if (!routers[c]) continue;
        items.push_back({routers[c]->handle(), 0, ZMQ_POLLIN, 0});
        item_channel.push_back(static_cast<frontend_channel>(c));
      }
      const size_t zap_item = items.size();
      if (zap) items.push_back({zap->handle(), 0, ZMQ_POLLIN, 0});
      const size_t first_sub = items.size();
      for (auto& s : subs)
        items.push_back({s.sub->handle(), 0, ZMQ_POLLIN, 0});
      const size_t first_dealer = items.size();
      dealer_sub.clear();
      for (size_t i = 0; i < subs.size(); ++i)
        if (subs[i].dealer) {
          items.push_back({subs[i].dealer->handle(), 0, ZMQ_POLLIN, 0});
          dealer_sub.push_back(i);
        }
      items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
      try {
        // The earlier of the next backlog retry and the next replay deadline (-1: none).
        auto wait = poll_timeout(steady_ns());
        if (timeout_ms >= 0 && (wait.count() < 0 || wait.count() > timeout_ms))
          wait = std::chrono::milliseconds(timeout_ms);
        zmq::poll(items, wait);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        spdlog::error("frontend poll failed: {}", e.what());
        return;
      }
      if (items.back().revents & ZMQ_POLLIN) send_queued();
      if (!backlog.empty()) flush_backlog(steady_ns());
      if (zap && (items[zap_item].revents & ZMQ_POLLIN)) handle_zap();
      // Drain each socket up to a budget so that one busy socket cannot starve the others.
      for (size_t i = 0; i < zap_item; ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        auto& s = *routers[static_cast<size_t>(item_channel[i])];
        for (int n = 0; n < 256; ++n) {
          parts.clear();
          std::optional<size_t> got;
          try {
            got = zmq::recv_multipart(s, std::back_inserter(parts), zmq::recv_flags::dontwait);
          } catch (const zmq::error_t&) {
            counters.bad_frames.fetch_add(1);
            break;
          }
          if (!got) break;
          handle_router(item_channel[i], parts);
        }
      }
      for (size_t i = first_sub; i < first_dealer; ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        auto& s = subs[i - first_sub];
        for (int n = 0; n < 256; ++n) {
          parts.clear();
          std::optional<size_t> got;
          try {
            got = zmq::recv_multipart(*s.sub, std::back_inserter(parts), zmq::recv_flags::dontwait);
          } catch (const zmq::error_t&) {
            break;
          }
          if (!got) break;
          counters.publisher_messages.fetch_add(1);
          publisher_frames f{s.id, {}};
          f.frames.reserve(parts.size());
          for (auto& p : parts) {
            const auto b = bytes(p);
            f.frames.emplace_back(b.begin(), b.end());
          }
          callbacks.on_publisher(std::move(f));
        }
      }
      for (size_t i = first_dealer; i + 1 < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLIN) read_replay(subs[dealer_sub[i - first_dealer]], parts);
      // Replies queued by callbacks run on this thread (e.g. errors) go out in the same round.
      bool pending_out = false;
      {
        std::lock_guard lock(mutex);
        pending_out = !outbox.empty();
      }
      if (pending_out) send_queued();
    }
  }
};

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

void zmq_frontend::reply(const reply_address& to, std::vector<uint8_t> payload) {
  impl_->queue(to, std::move(payload));
}

void reply_sink::reply_error(const reply_address& to, std::optional<std::string> id,
                             route_error_code code, std::string message) {
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
