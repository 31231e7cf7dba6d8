// zmq_frontend: the node's ZeroMQ edge, on one thread -- three ROUTER sockets (route, worker and
// admin endpoints, docs/protocol.md) and the SUB sockets of the KV-event and counts publishers the
// signature cache follows, with a DEALER to a publisher's replay socket while a replay runs.
//
// The frontend decodes every request on its own thread, answers the ones that cannot be served
// (malformed, too large, unknown type, over the pending limit) itself with an error_reply, and
// hands the rest to callbacks (the actors). Answers come back through reply(), from any thread:
// they are queued and the frontend thread sends them, because a ZeroMQ socket belongs to one
// thread. Sends never block: a reply to a peer that is not reading waits in ZeroMQ's queue for that
// peer (send_hwm replies), then in the frontend's backlog, whose bytes across all peers are capped
// (max_queued_reply_bytes); a reply beyond the cap, or to a peer that is gone, is dropped and
// counted, and no other client waits for it.
//
// With CURVE on (frontend_options::curve, docs/security.md) the three ROUTER sockets encrypt and
// authenticate every connection; with an allowlist of client keys the frontend thread also
// serves ZeroMQ's authentication requests (ZAP, RFC 27) for them. Publisher subscriptions are
// not affected.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/status.hpp"

namespace eldr {

enum class frontend_channel : uint8_t { route = 0, worker = 1, admin = 2 };
inline constexpr size_t frontend_channel_count = 3;
const char* to_string(frontend_channel c);

// Who to answer: the channel and the peer's ZeroMQ routing id (plus an empty delimiter frame when
// the peer is a REQ socket).
struct reply_address {
  frontend_channel channel = frontend_channel::route;
  std::string peer;
  bool delimiter = false;
  // The pending slot the request took (0 = none; route requests only). The first answer queued
  // for it releases it: an answer to a message that took no slot releases none, so `pending`
  // counts exactly the requests not yet answered.
  uint64_t slot = 0;
};

struct route_job {
  reply_address from;
  route_request request;
  int64_t received_ns = 0;        // steady clock, for the node-side latency histogram
  uint32_t bad_count_blocks = 0;  // counts blocks skipped by the decoder (bad_counts)
};
struct worker_job {
  reply_address from;
  worker_message message;
};
struct admin_job {
  reply_address from;
  admin_request request;
};

// A raw message from a subscribed publisher: frames as received (topic, [seq,] payload).
struct publisher_frames {
  uint32_t subscription = 0;  // the id subscribe() returned
  std::vector<std::vector<uint8_t>> frames;
};

// One answer of a publisher's replay socket to request_replay (vllm-kv-events.md): a buffered
// batch, or the end of the replay (the publisher's end marker, a timeout, a reply that does not
// decode, or no replay endpoint at all).
struct replay_message {
  uint32_t subscription = 0;
  uint64_t token = 0;  // the request's
  bool end = false;
  bool ok = false;  // end: the publisher's end marker arrived (else the replay failed)
  uint64_t seq = 0;
  std::vector<uint8_t> payload;
};

// A publisher to follow: a SUB socket to `endpoint` (all topics) and, when replay_endpoint is
// set, a DEALER to it for the duration of each replay. An endpoint written "bind:ENDPOINT" is
// bound instead of connected to, for publishers that connect to the node (models[].kv_events.bind;
// never taken from a client's registration).
inline constexpr std::string_view kv_bind_prefix = "bind:";
struct subscription_request {
  std::string endpoint;
  std::string replay_endpoint;  // "" = none
  // Called once (unless the frontend stops first), on the frontend thread, when the SUB socket
  // exists (the subscription
  // id its frames carry) or could not be made (ZeroMQ's reason: invalid_argument for an
  // endpoint it refuses, out_of_range at its socket cap). May be empty.
  std::function<void(result<uint32_t>)> done;
  // Every replay_message of this subscription, on the frontend thread. May be empty.
  std::function<void(replay_message)> on_replay;
};

// ZeroMQ CURVE on the route, worker and admin sockets. Off by default.
struct frontend_curve_options {
  // The node's long-term secret key, Z85 (40 characters; curve_keys.hpp reads it from a file).
  // "" = CURVE off: plain traffic, any peer may connect.
  std::string server_secret_key;
  // Client public keys (Z85) allowed to connect. Empty = any client that knows the server's
  // public key. Non-empty requires server_secret_key.
  std::set<std::string> authorized_client_keys;
};

struct frontend_options {
  // Bind endpoints; "" = that channel is not served. Port 0 or "*" picks a free port.
  std::array<std::string, frontend_channel_count> endpoints;
  route_protocol_limits route_limits;
  worker_protocol_limits worker_limits;
  admin_protocol_limits admin_limits;
  uint32_t max_pending = 10000;  // route requests handed over and not yet answered
  // Per peer: replies ZeroMQ itself queues (its SNDHWM). Beyond it, replies wait in the
  // frontend's backlog, which is what max_queued_reply_bytes caps. Kept small because ZeroMQ's
  // queues are outside that cap: with 1,000, six peers that never read held ~55 MiB there
  // (fuzz.live_node, slow_readers_held); a reader that catches up loses nothing either way.
  int send_hwm = 100;
  // Per peer: requests ZeroMQ queues before it stops reading the peer's connection (TCP then
  // pushes back on the sender). ZeroMQ's default. At 100,000, six peers sending faster than the
  // frontend reads (slow_readers_held under ASan on a loaded machine) held up to ~300 MiB of
  // requests in these queues, outside every cap; at 1,000 the same run grows ~140 MiB in all.
  int recv_hwm = 1000;
  // Reply bytes waiting in the frontend's backlog for peers whose ZeroMQ queue is full, across all
  // peers; a reply that would exceed it is dropped (counted). 0 = no backlog.
  uint64_t max_queued_reply_bytes = uint64_t{64} << 20;
  int64_t max_publisher_message_bytes = int64_t{64} << 20;
  // ZeroMQ's socket cap for the frontend's context (ZMQ_MAX_SOCKETS): the ROUTERs, the SUBs and
  // the replay DEALERs together. 0 = ZeroMQ's default (1023).
  int max_sockets = 0;
  // A replay that has not answered for this long ends as failed (the gap then resynchronises).
  int replay_timeout_ms = 2000;
  frontend_curve_options curve;
  // Publisher endpoints bound at start, like the channels (models[].kv_events.bind), by the
  // configuration key that names each, so that a taken port fails the start and names the key.
  // The later subscribe() of kv_bind_prefix + endpoint takes the bound socket.
  std::vector<std::pair<std::string, std::string>> publisher_binds;  // (key, endpoint)
};

struct frontend_callbacks {
  std::function<void(route_job)> on_route;
  std::function<void(worker_job)> on_worker;
  std::function<void(admin_job)> on_admin;
  std::function<void(publisher_frames)> on_publisher;
};

// Counters, readable from any thread.
struct frontend_counters {
  std::atomic<uint64_t> received[frontend_channel_count]{};
  std::atomic<uint64_t> replies_sent{0};
  // Replies not delivered: the peer is gone (ZeroMQ's EHOSTUNREACH), or its queue is full and the
  // backlog is at max_queued_reply_bytes.
  std::atomic<uint64_t> replies_dropped{0};
  std::atomic<uint64_t> replies_over_cap{0};         // of replies_dropped: the backlog was full
  std::atomic<uint64_t> queued_reply_bytes{0};       // in the backlog now
  std::atomic<uint64_t> queued_replies{0};           // in the backlog now
  std::atomic<uint64_t> queued_reply_bytes_peak{0};  // most queued_reply_bytes ever
  std::atomic<uint64_t> malformed{0};
  std::atomic<uint64_t> too_large{0};
  std::atomic<uint64_t> unknown_type{0};
  std::atomic<uint64_t> overloaded{0};
  std::atomic<uint64_t> bad_frames{0};  // wrong frame count on a ROUTER socket
  std::atomic<uint64_t> publisher_messages{0};
  std::atomic<uint32_t> pending{0};
  // CURVE handshakes the allowlist decided (counted only when authorized_client_keys is
  // non-empty). A client without CURVE, or with the wrong server key, fails before this point and
  // is not counted.
  std::atomic<uint64_t> curve_accepted{0};
  std::atomic<uint64_t> curve_refused{0};
  // Publisher subscriptions: SUB sockets now, subscriptions ZeroMQ refused, replays asked,
  // replays that ended without the publisher's end marker (timeout or bad reply).
  std::atomic<uint32_t> subscriptions{0};
  std::atomic<uint64_t> subscribe_failed{0};
  std::atomic<uint64_t> replays{0};
  std::atomic<uint64_t> replays_failed{0};
};

// Where actors send their answers and publisher subscriptions: the ZeroMQ frontend in a node, a
// recording fake in the actors' unit tests. Implementations are thread-safe.
class reply_sink {
 public:
  virtual ~reply_sink() = default;
  // Queues an answer for a peer.
  virtual void reply(const reply_address& to, std::vector<uint8_t> payload) = 0;
  // Starts following a publisher (see subscription_request; the same endpoint twice gets the
  // same id and no second socket).
  virtual void subscribe(subscription_request request) = 0;
  // Stops following it: its sockets close; frames already delivered may still arrive.
  virtual void unsubscribe(uint32_t subscription) = 0;
  // Asks the publisher's replay socket for every batch from `start`; the answers arrive through
  // its on_replay, tagged with `token`, and always end with an `end` message.
  virtual void request_replay(uint32_t subscription, uint64_t token, uint64_t start) = 0;
  // Encodes and queues an error_reply.
  void reply_error(const reply_address& to, std::optional<std::string> id, wire_error_code code,
                   std::string message);
};

class zmq_frontend final : public reply_sink {
 public:
  // Binds every endpoint and starts the thread. Errors (invalid_argument unless noted): an
  // endpoint ZeroMQ refuses; a malformed CURVE key, the message naming the field
  // ("curve.server_secret_key: ...", "curve.authorized_client_keys: ..."); an allowlist without a
  // server key; failed_precondition when CURVE is asked for and libzmq lacks it.
  static result<std::unique_ptr<zmq_frontend>> start(frontend_options options,
                                                     frontend_callbacks callbacks);
  // Stops the thread; replies still queued are dropped.
  ~zmq_frontend() override;

  // The endpoint actually bound for a channel (port resolved), "" when not served.
  const std::string& bound(frontend_channel c) const;
  // The endpoint actually bound for a publisher_binds key (port resolved), "" when none.
  std::string bound_publisher(const std::string& key) const;

  // Queues an answer; thread-safe. The first answer for to.slot releases that pending slot.
  void reply(const reply_address& to, std::vector<uint8_t> payload) override;

  // Subscriptions (reply_sink): thread-safe, they take effect on the frontend thread, which owns
  // every socket; nothing here waits for a publisher. A replay's DEALER exists from its request
  // to its end; a reply later than replay_timeout_ms after the previous one ends it as failed.
  void subscribe(subscription_request request) override;
  void unsubscribe(uint32_t subscription) override;
  void request_replay(uint32_t subscription, uint64_t token, uint64_t start) override;

  const frontend_counters& counters() const;

  // The server's public key (Z85) clients set as their server key; "" when CURVE is off.
  const std::string& curve_public_key() const;

  class impl;

 private:
  explicit zmq_frontend(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
