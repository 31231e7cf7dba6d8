#include "cluster/wire/wire_error.hpp"

namespace eldr {

const char* to_string(wire_error_code code) {
  switch (code) {
    case wire_error_code::malformed:
      return "malformed";
    case wire_error_code::too_large:
      return "too_large";
    case wire_error_code::unknown_type:
      return "unknown_type";
    case wire_error_code::unknown_model:
      return "unknown_model";
    case wire_error_code::no_eligible_worker:
      return "no_eligible_worker";
    case wire_error_code::overloaded:
      return "overloaded";
    case wire_error_code::internal:
      return "internal";
    case wire_error_code::not_found:
      return "not_found";
  }
  return "unknown";
}

wire_error_code wire_error_for_decode(const status& decode_error) {
  switch (decode_error.code()) {
    case status_code::out_of_range:
      return wire_error_code::too_large;
    case status_code::not_found:
      return wire_error_code::unknown_type;
    default:
      return wire_error_code::malformed;
  }
}

wire_error_code wire_error_for_refusal(const status& failure) {
  switch (failure.code()) {
    case status_code::invalid_argument:
      return wire_error_code::malformed;
    case status_code::not_found:
      return wire_error_code::not_found;
    default:
      return wire_error_code::internal;
  }
}

}  // namespace eldr
