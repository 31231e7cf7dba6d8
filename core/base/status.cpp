// status: names of codes and the human-readable form.
#include "core/base/status.hpp"

namespace eldr {

const char* to_string(status_code code) {
  switch (code) {
    case status_code::ok:
      return "ok";
    case status_code::invalid_argument:
      return "invalid_argument";
    case status_code::not_found:
      return "not_found";
    case status_code::io_error:
      return "io_error";
    case status_code::corrupt:
      return "corrupt";
    case status_code::out_of_range:
      return "out_of_range";
    case status_code::failed_precondition:
      return "failed_precondition";
  }
  return "unknown";
}

std::string status::to_string() const {
  if (ok()) return "ok";
  return std::string(eldr::to_string(code_)) + ": " + message_;
}

}  // namespace eldr
