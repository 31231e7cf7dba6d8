// Fuzz target: decode_kv_batch on arbitrary bytes returns a batch or an error, never crashes,
// reads out of bounds or allocates beyond what the input and the limits allow; whatever it
// accepts respects those limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cluster/wire/kv_events.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  eldr::kv_decode_limits limits;
  limits.max_events = 256;
  limits.max_hashes = 1024;
  limits.keep_details = (size % 2) == 0;  // both paths, from the same corpus
  std::vector<eldr::kv_decode_issue> issues;
  const auto batch = eldr::decode_kv_batch({data, size}, limits, issues);
  if (!batch.ok()) return 0;
  if (batch->events.size() > limits.max_events) std::abort();
  for (const eldr::kv_event& e : batch->events)
    if (e.block_hashes.size() > limits.max_hashes || e.block_hashes.size() > size) std::abort();
  return 0;
}
