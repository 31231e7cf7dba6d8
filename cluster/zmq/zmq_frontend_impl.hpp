// zmq_frontend_impl: the private state of zmq_frontend (zmq_frontend.hpp), shared by the files
// that implement it: zmq_frontend.cpp (the poll loop and the public calls),
// zmq_frontend_sockets.cpp, zmq_frontend_replies.cpp and zmq_frontend_subscriptions.cpp. Not part
// of the cluster's contract.
#pragma once

#include "cluster/zmq/zmq_frontend.hpp"

#include <poll.h>
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

#include "cluster/security/curve_keys.hpp"
#include "cluster/wire/kv_events.hpp"

namespace eldr {
namespace frontend_detail {

inline std::span<const uint8_t> bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}

inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "tcp://127.0.0.1:0" is ZeroMQ's "tcp://127.0.0.1:*": both pick a free port.
inline std::string bind_form(const std::string& endpoint) {
  if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    return endpoint.substr(0, endpoint.size() - 1) + "*";
  return endpoint;
}

// ZAP (RFC 27): libzmq asks this endpoint, in the socket's own context, whether a handshake may
// proceed. The domain tags eldr's ROUTER sockets, so the handler refuses anything else.
inline constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";
inline constexpr std::string_view zap_domain = "eldr";

struct queued_reply {
  reply_address to;
  std::vector<uint8_t> payload;
};

// What a reply held in the backlog costs: its payload and its peer's routing id.
inline uint64_t backlog_cost(const queued_reply& r) {
  return r.payload.size() + r.to.peer.size();
}

// A peer whose ZeroMQ queue was full: its replies in order, and when to try again. The interval
// doubles up to the maximum while the peer reads nothing, so that peers that never read cost a
// few failed sends a second each, not a busy loop.
inline constexpr int64_t backlog_retry_min_ns = 1'000'000;    // 1 ms
inline constexpr int64_t backlog_retry_max_ns = 100'000'000;  // 100 ms
struct peer_backlog {
  std::deque<queued_reply> replies;
  uint64_t bytes = 0;  // backlog_cost summed over replies
  int64_t retry_at_ns = 0;
  int64_t interval_ns = backlog_retry_min_ns;
};

enum class send_outcome { sent, full, gone };

// A ZeroMQ socket as the loop polls it: ZeroMQ's notification descriptor (ZMQ_FD) in one poll()
// over all sockets, and `hot` when the socket must be asked for ZMQ_EVENTS whatever the
// descriptor says. zmq_poll() asks every socket for ZMQ_EVENTS on every call, two system calls
// each, so a round cost O(sockets): with 36 followed publishers the route loop spent ~280 us of
// CPU per request at 2,667 req/s (BENCHMARKS.md, "The frontend's poll loop"). The descriptor is
// edge-triggered (zmq_getsockopt(3), ZMQ_FD): it fires when the socket's state may have changed,
// and a send or receive may consume a notification. So a socket is hot when it is new, after a
// send on it, and when a drain stopped at its budget with messages left; it cools once asked.
struct polled {
  int fd = -1;
  bool hot = true;
};

// ZeroMQ's notification descriptor of `s`.
inline int notification_fd(zmq::socket_t& s) {
  return s.get(zmq::sockopt::fd);
}

// Whether `s` has a message to read: ZMQ_EVENTS, which also processes the socket's pending
// commands (what re-arms its descriptor), and cools `p`. ZeroMQ may refuse the question (EINTR):
// then nothing is read and the socket is asked again next round, never thrown out of the loop.
inline bool readable(zmq::socket_t& s, polled& p) {
  p.hot = false;
  try {
    return (s.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  } catch (const zmq::error_t&) {
    p.hot = true;
    return false;
  }
}

}  // namespace frontend_detail

class zmq_frontend::impl {
 public:
  using queued_reply = frontend_detail::queued_reply;
  using peer_backlog = frontend_detail::peer_backlog;
  using send_outcome = frontend_detail::send_outcome;

 public:
  impl(frontend_options o, frontend_callbacks cb) : opt(std::move(o)), callbacks(std::move(cb)) {}
  ~impl() { stop(); }

  frontend_options opt;
  frontend_callbacks callbacks;
  frontend_counters counters;
  zmq::context_t ctx{1};
  std::array<std::unique_ptr<zmq::socket_t>, frontend_channel_count> routers;
  std::array<frontend_detail::polled, frontend_channel_count> router_poll;  // frontend thread
  std::array<std::string, frontend_channel_count> bound;
  std::map<std::string, std::string> bound_publishers;  // key -> endpoint, port resolved
  // CURVE: the server's public key ("" = off), and, with an allowlist, the ZAP handler's REP
  // socket (owned by the frontend thread after start) and the allowed keys in binary.
  std::string curve_public;
  std::unique_ptr<zmq::socket_t> zap;
  frontend_detail::polled zap_poll;
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
    frontend_detail::polled sub_poll;
    std::function<void(replay_message)> on_replay;
    // The replay in progress, if any: its DEALER (null = none), token and deadline.
    std::unique_ptr<zmq::socket_t> dealer;
    frontend_detail::polled dealer_poll;
    uint64_t token = 0;
    int64_t deadline_ns = 0;
  };
  std::vector<sub_socket> subs;
  std::vector<kv_decode_issue> issues;

  // Validates the CURVE options and, with an allowlist, binds the ZAP handler: it must exist
  // before the ROUTER sockets bind, or early handshakes would go unauthenticated.
  status configure_curve();

  // Names the configuration key and the endpoint: "Address already in use" alone does not say
  // which port another process (often a second eldr-node) holds.
  static status bind_error(const std::string& key, const std::string& endpoint,
                           const zmq::error_t& e);

  status bind_all();

  void wake();

  void stop();

  void queue(reply_address to, std::vector<uint8_t> payload);

  uint64_t take_slot();

  void release_slot(uint64_t id);

  void send_queued();

  // One reply, without blocking: ZeroMQ takes it, its queue for the peer is full, or the peer is
  // gone (then nothing of the message was sent).
  send_outcome try_send(const queued_reply& r);

  void drop(uint64_t n) { counters.replies_dropped.fetch_add(n); }

  void publish_backlog();

  // Drops the oldest reply waiting for a peer (counted over the cap).
  void evict_oldest(peer_backlog& b);

  // Appends to a peer's backlog within the cap. At the cap, the peer that holds the most gives
  // way (its oldest replies are dropped while it holds more than this peer would): peers that
  // never read then cannot take the whole cap from one that is only briefly behind.
  void hold(peer_backlog& b, queued_reply r);

  void deliver(queued_reply r, int64_t now);

  // Sends what the peers whose retry time has come can take now.
  void flush_backlog(int64_t now);

  // How long the loop may sleep: until the earliest backlog retry, or indefinitely.
  std::chrono::milliseconds poll_timeout(int64_t now) const;

  void push_sub_command(sub_command c);

  // What a refused ZeroMQ call means for the one who asked for the subscription.
  static status subscribe_error(const std::string& endpoint, const zmq::error_t& e);

  std::unique_ptr<zmq::socket_t> new_sub();

  std::unique_ptr<zmq::socket_t> make_sub(const std::string& endpoint);

  void add_subscription(sub_command& c);

  // Ends the replay in progress on `s` (ok: the publisher's end marker came) and closes its
  // DEALER, so that a late answer can never be taken for the answer to a later request.
  void end_replay(sub_socket& s, bool ok);

  void start_replay(sub_socket& s, uint64_t token, uint64_t start);

  // Reads what the replay DEALER of `s` has (both reply shapes: [empty, seq, payload] and
  // [empty, topic, seq, payload]), up to a budget.
  void read_replay(sub_socket& s, std::vector<zmq::message_t>& parts);

  // Ends every replay whose publisher has been silent past its deadline; returns the
  // milliseconds until the next deadline (-1: none), the poll's timeout.
  long expire_replays();

  void apply_sub_commands();

  // Answers the ZAP requests waiting on the handler socket. Every request gets exactly one reply
  // (a REP socket alternates): 200 for an allowed client key, 400 otherwise.
  void handle_zap();

  void handle_router(frontend_channel c, std::vector<zmq::message_t>& parts);

  void count_and_answer(const reply_address& to, std::optional<std::string> id,
                        wire_error_code code, std::string message);

  void reply_error_now(const reply_address& to, std::optional<std::string> id, wire_error_code code,
                       std::string message);

  void run();
};

}  // namespace eldr
