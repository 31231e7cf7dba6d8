// route_protocol: the wire codec of eldr's route exchange (docs/protocol.md, "route protocol"
// version 1): a prefill worker's route_request, the node's route_reply, and the error_reply sent
// instead of a reply. Pure encode/decode over core's bounds-checked MessagePack codec; no sockets,
// so the node, the client libraries' tests and the fuzz target all share one implementation.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/wire/counts_message.hpp"
#include "cluster/wire/kv_events.hpp"
#include "cluster/wire/wire_error.hpp"
#include "core/base/status.hpp"

namespace eldr {

inline constexpr uint32_t route_protocol_version = 1;

// Bounds every decoder enforces before it allocates. The defaults are generous for real traffic
// (a 4,096-block prompt is 64k tokens at block size 16) and small enough that one hostile message
// cannot cost the node more than a few MB. Counts travel under the same max_blocks.
struct route_protocol_limits {
  uint32_t max_payload_bytes = 4u << 20;  // whole message
  uint32_t max_id_bytes = 256;            // request id
  uint32_t max_model_bytes = 256;         // model name
  uint32_t max_blocks = 4096;             // block hashes, and blocks in the counts
  uint32_t max_endpoint_bytes = 256;      // decode worker endpoint
  uint32_t max_band = 1024;               // band members in an explanation
  uint32_t max_policy_bytes = 64;         // policy name in an explanation
  uint32_t max_message_bytes = 4096;      // error_reply message; each route_reply warning
  uint32_t max_warnings = 16;             // route_reply warnings
};

// A prefill worker (or its proxy) asks where to decode one request. Every member has a default
// (`{}` at least), so that designated initializers naming only some of them, as in README.md,
// compile cleanly under -Wextra (-Wmissing-field-initializers); the same in worker_protocol.hpp.
struct route_request {
  std::string id{};     // caller-chosen, echoed in the reply; non-empty
  std::string model{};  // the model whose decode pool serves the request; non-empty
  std::vector<uint64_t> block_hashes{};  // the prompt's KV blocks, in prompt order
  // Counts of the blocks the prefill computed itself (prefix hits come from the signature cache),
  // as an eldr-counts message, so block counts have exactly one encoding on the wire.
  std::optional<counts_message> counts{};
  // How many leading blocks of block_hashes the prefill served from its prefix cache (vLLM:
  // usage.prompt_tokens_details.cached_tokens / block size), <= block_hashes.size(). A client
  // that sends the counts of every block (eldr-proxy with vLLM's routed experts) says so, and the
  // router sums those blocks' counts but does not store them again: they were stored when they
  // were computed. Absent: every carried block is stored.
  std::optional<uint32_t> cached_blocks{};
  std::optional<uint32_t> label{};  // domain index, for the "domain" oracle policy (tests)
  bool explain = false;             // ask for band, scores, tau and policy in the reply
  // A resend of a request id the client already sent to another router (its call timed out
  // there): docs/cluster.md, "Retries: ask, don't broadcast". Written only when true, so an
  // unmarked request's bytes are those of a client that predates the field.
  bool retry = false;
};

struct route_band_member {
  uint32_t worker = 0;
  float score = 0.0f;  // s_k of the worker

  friend bool operator==(const route_band_member&, const route_band_member&) = default;
};

// Why the decision went as it did; present in a reply only when the request asked for it.
struct route_explain {
  std::string policy;  // the policy's name as make_policy knows it ("eldr", "jsq", ...)
  float tau = 0.0f;    // band half-width; 0 for policies without a band
  std::vector<route_band_member> band;  // the workers the pick was made among

  friend bool operator==(const route_explain&, const route_explain&) = default;
};

struct route_reply {
  std::string id;  // the request's id
  uint32_t worker = 0;
  std::string endpoint;  // where the prefill worker hands the KV cache over
  uint64_t epoch = 0;    // the centroid set's epoch the decision used
  // Signature coverage: blocks whose counts were known (sent or cached) out of all blocks. A
  // request with no known block is still routed (by load only); covered_blocks is then 0.
  uint32_t covered_blocks = 0;
  uint32_t total_blocks = 0;  // covered_blocks <= total_blocks
  std::optional<route_explain> explain;
  // Why a locality policy decided by load only ("" when it did not, or the policy is not one):
  // no_centroid_set, no_signature_cache, no_counts, counts_geometry, signature_unusable
  // (docs/protocol.md). The decision stands; the reason says what it was worth.
  std::string fallback;
  // Problems the caller should fix, each "<code>: <what happened>" (e.g. "counts_geometry: counts
  // are 48x64x6, the model is 48x128x8; routed by load"). Clients surface them (log, callback).
  std::vector<std::string> warnings;

  friend bool operator==(const route_reply&, const route_reply&) = default;
};

struct error_reply {
  std::optional<std::string> id;  // absent when the request was too broken to read one
  wire_error_code code = wire_error_code::internal;
  std::string message;  // for humans and logs

  friend bool operator==(const error_reply&, const error_reply&) = default;
};

// Encoders write version 1 with every field the struct holds. Preconditions (not checked on the
// hot path): strings and arrays within the limits the peer decodes with; counts' blocks of the
// counts' geometry.
std::vector<uint8_t> encode_route_request(const route_request& m);
std::vector<uint8_t> encode_route_reply(const route_reply& m);
std::vector<uint8_t> encode_error_reply(const error_reply& m);

// Decoders take one whole payload. They never read outside it and never allocate more than the
// limits allow. Errors name the field: corrupt (bad MessagePack, trailing bytes), invalid_argument
// (a missing field or a wrong type or value), failed_precondition (another version), out_of_range
// (a limit), not_found (a "type" other than the one expected). In a request's counts, a block that
// does not validate against the counts' geometry is skipped and reported in `issues`, like the
// counts message's own decoder does; the rest of the request stands.
result<route_request> decode_route_request(std::span<const uint8_t> payload,
                                           const route_protocol_limits& limits,
                                           std::vector<kv_decode_issue>& issues);
result<route_reply> decode_route_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits);
result<error_reply> decode_error_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits);

}  // namespace eldr
