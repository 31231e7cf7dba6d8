// Fuzz target: parse_trace on arbitrary bytes must return a status, never crash, read out of
// bounds or allocate beyond twice the input's size; whatever it accepts must re-encode to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/formats/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const eldr::result<eldr::trace> t = eldr::parse_trace(data, size, "fuzz-input");
  if (!t.ok()) return 0;
  // An accepted trace is valid and survives a round trip unchanged; anything else is a parser bug
  // that a plain crash reports best (the driver and libFuzzer both catch abort()).
  if (!eldr::validate_trace(*t).ok()) std::abort();
  const std::vector<uint8_t> again = eldr::encode_trace(*t);
  const eldr::result<eldr::trace> back =
      eldr::parse_trace(again.data(), again.size(), "re-encoded");
  if (!back.ok() || !(*back == *t)) std::abort();
  return 0;
}
