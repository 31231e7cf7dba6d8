// wire_error: the error codes every eldr protocol answers with (route, worker and admin replies
// carry the same numbers, docs/protocol.md), and the one mapping from a status to them. The
// actors' mapping between status and CAF errors is its counterpart (actors/caf_status.hpp).
#pragma once

#include <cstdint>

#include "core/base/status.hpp"

namespace eldr {

// The reason a request got an error reply instead of its answer. Values are wire-stable; a client
// meeting a value it does not know treats it as internal.
enum class wire_error_code : uint8_t {
  malformed = 1,           // the request does not decode (bad MessagePack, type, field, version)
  too_large = 2,           // a limit of the protocol's limits was exceeded
  unknown_type = 3,        // "type" names no message this endpoint accepts
  unknown_model = 4,       // no decode pool serves the named model
  no_eligible_worker = 5,  // every worker of the pool is drained, dead or full
  overloaded = 6,          // the node sheds load (pending-request limit)
  internal = 7,            // a bug or an environment failure on the node
  not_found = 8,           // an admin command names a thing that is not there (a stored epoch)
};

// "malformed", "too_large", ..., "unknown" for values outside the enum.
const char* to_string(wire_error_code code);

// The code a failed decode stands for (any protocol's decoder): out_of_range -> too_large,
// not_found (the "type" names another message) -> unknown_type, anything else -> malformed.
wire_error_code wire_error_for_decode(const status& decode_error);

// The code a refused change stands for (an admin command that decoded but failed): a refused
// input (invalid_argument) -> malformed, a missing thing (not_found) -> not_found, the rest ->
// internal.
wire_error_code wire_error_for_refusal(const status& failure);

}  // namespace eldr
