// Fuzz target: the admin protocol's decoders on arbitrary bytes never crash, throw, recurse
// unboundedly or over-allocate (args/result values are converted to nlohmann::json under depth and
// value-count limits); whatever they accept stays within the limits and re-encodes to the same
// bytes after a second round trip (compared as bytes: a NaN never equals itself as a json value).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cluster/wire/admin_protocol.hpp"

namespace {

using nlohmann::json;

// Containers nested in v (v itself included), and the values it holds (v itself included).
void measure(const json& v, uint32_t depth, uint32_t& max_depth, uint64_t& values) {
  ++values;
  if (!v.is_array() && !v.is_object()) return;
  ++depth;
  if (depth > max_depth) max_depth = depth;
  for (const json& e : v)
    measure(e, depth, max_depth, values);
}

void check_value(const json& v, const eldr::admin_protocol_limits& limits) {
  uint32_t depth = 0;
  uint64_t values = 0;
  measure(v, 0, depth, values);
  if (depth > limits.max_depth || values > limits.max_values) std::abort();
  // Strings were checked as UTF-8: dumping never throws.
  try {
    (void)v.dump();
  } catch (const json::exception&) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  eldr::admin_protocol_limits limits;
  limits.max_depth = 8;  // small limits, so the fuzzer reaches them
  limits.max_values = 256;
  limits.max_id_bytes = 16;
  limits.max_command_bytes = 16;
  limits.max_error_bytes = 64;
  const std::span<const uint8_t> in(data, size);

  if (const auto q = eldr::decode_admin_request(in, limits); q.ok()) {
    if (q->command.empty() || q->command.size() > limits.max_command_bytes ||
        q->id.size() > limits.max_id_bytes || !q->args.is_object())
      std::abort();
    check_value(q->args, limits);
    const std::vector<uint8_t> once = eldr::encode_admin_request(*q);
    const auto back = eldr::decode_admin_request(once, limits);
    if (!back.ok() || back->id != q->id || back->command != q->command ||
        eldr::encode_admin_request(*back) != once)
      std::abort();
  }

  if (const auto r = eldr::decode_admin_reply(in, limits); r.ok()) {
    if (r->id.size() > limits.max_id_bytes || r->error.size() > limits.max_error_bytes)
      std::abort();
    check_value(r->result, limits);
    const std::vector<uint8_t> once = eldr::encode_admin_reply(*r);
    const auto back = eldr::decode_admin_reply(once, limits);
    if (!back.ok() || back->id != r->id || back->ok != r->ok ||
        eldr::encode_admin_reply(*back) != once)
      std::abort();
  }
  return 0;
}
