// worker_protocol: the wire codec of the decode-worker exchange (docs/protocol.md section 4,
// version 1): a decode worker registers with its capacity, reports its load periodically, reports
// finished requests, and asks to be drained; any worker (prefill or decode) may also announce its
// vLLM KV-event publisher so that the node's signature cache subscribes to it. Every message is
// answered by a worker_ack or an error_reply (route_protocol.hpp; same codes).
//
// Pure encode/decode over core's bounds-checked MessagePack codec; no sockets.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cluster/wire/route_protocol.hpp"
#include "core/base/status.hpp"

namespace eldr {

inline constexpr uint32_t worker_protocol_version = 1;

struct worker_protocol_limits {
  uint32_t max_payload_bytes = 1u << 20;
  uint32_t max_id_bytes = 256;  // message id and request ids
  uint32_t max_model_bytes = 256;
  uint32_t max_endpoint_bytes = 256;
  uint32_t max_finished = 4096;  // request ids in one finished message
};

// "worker_register": decode worker `worker` (its index in the model's pool, 0..K-1; centroid k
// belongs to worker k) announces where it takes KV caches over and how much it can hold. A second
// registration of the same index replaces the first (a restarted worker).
struct worker_register {
  std::string id{};  // optional correlation id, echoed in the ack ("" = none)
  std::string model{};
  uint32_t worker = 0;
  std::string endpoint{};  // where prefill hands the KV cache over; non-empty
  uint32_t capacity = 0;   // max concurrent decode requests; 0 = unbounded
  // The worker's Prometheus metrics URL (vLLM's /metrics), which the node scrapes for its
  // authoritative load (docs/vllm.md); "" = none: the worker pushes load_reports instead. Decoded
  // only when parse_http_url (cluster/http/http_url.hpp) accepts it.
  std::string metrics_url{};
};

// "load_report": the worker's own view of its load, which corrects the router's count.
struct load_report {
  std::string id{};
  std::string model{};
  uint32_t worker = 0;
  uint32_t in_flight = 0;  // requests admitted and not finished (running + waiting)
  uint32_t running = 0;    // informational
  uint32_t waiting = 0;    // informational
  float kv_usage = 0.0f;   // 0..1, informational
  uint64_t seq = 0;        // increasing per worker; an older report than one applied is ignored
};

// "finished": requests the worker completed (or aborted). Each id is applied once.
struct finished_requests {
  std::string id{};
  std::string model{};
  uint32_t worker = 0;
  std::vector<std::string> requests{};
};

// "worker_drain": the worker asks to stop (drain = true) or resume (false) receiving requests;
// requests in flight finish normally.
struct worker_drain {
  std::string id{};
  std::string model{};
  uint32_t worker = 0;
  bool drain = true;
};

// "publisher_register": a vLLM KV-event publisher (tcp endpoint of its PUB socket, optional
// replay ROUTER endpoint) that the signature cache should subscribe to, for `model`.
struct publisher_register {
  std::string id{};
  std::string model{};
  std::string endpoint{};
  std::string replay_endpoint{};  // "" = none
};

using worker_message =
    std::variant<worker_register, load_report, finished_requests, worker_drain, publisher_register>;

// The answer to every worker message that was applied.
struct worker_ack {
  std::string id;      // the message's id ("" when it had none)
  std::string state;   // the worker's state after the message: "active", "draining",
                       // "unregistered" (publisher_register: "subscribed")
  uint64_t epoch = 0;  // the model's current centroid epoch (0 = none), informational

  friend bool operator==(const worker_ack&, const worker_ack&) = default;
};

// The wire `type` of a message ("worker_register", "load_report", "finished", "worker_drain",
// "publisher_register").
std::string_view worker_message_type(const worker_message& m);
// The message's correlation id, whatever its alternative ("" = none).
std::string& worker_message_id(worker_message& m);
const std::string& worker_message_id(const worker_message& m);

// Encoders write version 1 with every field the struct holds (id only when non-empty, a
// publisher's replay_endpoint and a registration's metrics_url only when non-empty). Preconditions
// (not checked): strings and arrays within the limits the peer decodes with, model and endpoints
// non-empty, kv_usage within 0..1.
std::vector<uint8_t> encode_worker_message(const worker_message& m);
std::vector<uint8_t> encode_worker_ack(const worker_ack& m);

// Decoders take one whole payload, never read outside it and never allocate more than the limits
// allow. Errors as route_protocol's decoders, naming the field ("load_report.in_flight: missing"):
// corrupt (bad MessagePack, trailing bytes), invalid_argument (a missing required field, a wrong
// type or value), failed_precondition (another version), out_of_range (a limit), not_found (a
// "type" that is none of the five messages, or not "worker_ack"); wire_error_for_decode maps them.
// Required fields: model everywhere, worker in all but publisher_register, endpoint in
// worker_register and publisher_register, in_flight and seq in load_report, requests in finished,
// drain in worker_drain, state in worker_ack; the rest may be absent or nil (defaults as above).
result<worker_message> decode_worker_message(std::span<const uint8_t> payload,
                                             const worker_protocol_limits& limits);
result<worker_ack> decode_worker_ack(std::span<const uint8_t> payload,
                                     const worker_protocol_limits& limits);

}  // namespace eldr
