// admin_protocol: the wire codec of the admin exchange (docs/protocol.md section 5, version 1),
// spoken by eldrctl and by any operator tooling. A request names a command and carries its
// arguments as a MessagePack map; the reply carries ok + a result value (any MessagePack value)
// or an error. Arguments and results are handled as nlohmann::json values (binary blobs such as
// centroid files travel as MessagePack bin, json::binary on this side).
//
// Commands (arguments -> result), all documented in docs/protocol.md section 5:
//   status                                  -> node roles, models, workers, epochs, counters
//   workers        {model?}                 -> [{model, worker, endpoint, state, load, ...}]
//   drain / undrain {model, worker}         -> {state}
//   centroids.show {model}                  -> {epoch, k, width, transform, layers, history}
//   centroids.export {model, epoch?}        -> bin (a centroid file, docs/centroid-file.md)
//   centroids.import {model, file: bin}     -> {epoch}   (validated; refused files change nothing)
//   centroids.swap {model, epoch}           -> {epoch, ...} (make a stored epoch current)
//   centroids.rollback {model}              -> {epoch, ...} (undo the newest change of the set)
//   refit          {model}                  -> {accepted, epoch, reason, ...}
//   explain        {model, request}         -> the recorded decision of a recent request
//   policy         {model, policy?, tau?}   -> {policy, tau} (set when given, else show)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/wire/route_protocol.hpp"
#include "core/base/status.hpp"

namespace eldr {

inline constexpr uint32_t admin_protocol_version = 1;

// Bounds every decoder enforces before it allocates.
struct admin_protocol_limits {
  uint32_t max_payload_bytes = 64u << 20;  // a centroid file rides in one message
  uint32_t max_command_bytes = 64;
  uint32_t max_id_bytes = 256;
  uint32_t max_error_bytes = 4096;  // admin_reply.error
  uint32_t max_depth = 32;          // containers nested in args / result (args itself is 1)
  uint32_t max_values = 1u << 20;   // values (scalars and containers) in args / result
};

// The argument and result values map to MessagePack as: null <-> nil, bool, integers (uint64 and
// int64, by sign), float (float32 and float64 read as double, written as float64), string <-> str
// (valid UTF-8, so a decoded value can always be dumped as JSON), binary <-> bin (a binary with a
// subtype <-> ext of that type), array, object <-> map with str keys.
struct admin_request {
  std::string id;                                  // correlation id, echoed ("" = none)
  std::string command;                             // non-empty
  nlohmann::json args = nlohmann::json::object();  // always an object
};

struct admin_reply {
  std::string id;
  bool ok = false;
  nlohmann::json result;  // when ok (null when the command returns nothing)
  wire_error_code code = wire_error_code::internal;  // when !ok
  std::string error;                                 // when !ok: for humans
};

// Encoders write version 1 (id only when non-empty; a reply's result only when ok, its code and
// error only when not). A null args is written as an empty map. Preconditions (not checked): args
// an object, strings within the limits the peer decodes with and valid UTF-8.
std::vector<uint8_t> encode_admin_request(const admin_request& m);
std::vector<uint8_t> encode_admin_reply(const admin_reply& m);

// Decoders take one whole payload, never read outside it, never allocate more than the limits
// allow and never throw. Errors name the field, as route_protocol's decoders
// ("admin_request.args.model: invalid UTF-8"): corrupt (bad MessagePack, trailing bytes),
// invalid_argument (missing command / ok / code when !ok, wrong types, non-str map keys, invalid
// UTF-8), failed_precondition (another version), out_of_range (a limit, depth and value count
// included), not_found (another "type"); wire_error_for_decode maps them.
result<admin_request> decode_admin_request(std::span<const uint8_t> payload,
                                           const admin_protocol_limits& limits);
result<admin_reply> decode_admin_reply(std::span<const uint8_t> payload,
                                       const admin_protocol_limits& limits);

// Typed access to a request's arguments, for the commands' handlers. The value is nullopt when the
// argument is absent or null (the handler decides whether it is required); the error
// (invalid_argument) when it is present with another type or out of range, naming the argument:
// "argument 'worker' must be an unsigned integer <= 4294967295, got 4294967296". Nothing is
// converted: 1.9, true, "3" and -1 are not unsigned integers. args that is not an object has no
// arguments.
result<std::optional<uint64_t>> admin_uint_arg(const nlohmann::json& args, std::string_view key,
                                               uint64_t max = UINT64_MAX);
result<std::optional<std::string>> admin_string_arg(const nlohmann::json& args,
                                                    std::string_view key);

}  // namespace eldr
