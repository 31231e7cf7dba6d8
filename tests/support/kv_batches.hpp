// vLLM KV event batches as the node decodes them (cluster/wire/kv_events.hpp), written directly
// with the project's msgpack writer: for tests and benchmarks that feed the signature cache
// without a publisher process.
#pragma once

#include <cstdint>
#include <vector>

#include "core/base/msgpack.hpp"

namespace eldr::testing {

// [ts, [event...], 0]: `events` BlockStored events of `per_event` consecutive hashes from
// `first`, no parents. Without tokens an event is the short form [tag, hashes, parent]; with
// tokens it is vLLM's whole event [tag, hashes, parent, token ids, block size 16, lora id nil,
// medium "GPU"], 16 token ids a block.
inline std::vector<uint8_t> block_stored_batch(uint64_t first, uint32_t events, uint32_t per_event,
                                               bool with_tokens = false) {
  constexpr uint32_t block_size = 16;
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_array_header(3);
  w.write_float64(1.0);
  w.write_array_header(events);
  uint64_t h = first;
  for (uint32_t e = 0; e < events; ++e) {
    w.write_array_header(with_tokens ? 7 : 3);
    w.write_str("BlockStored");
    w.write_array_header(per_event);
    for (uint32_t i = 0; i < per_event; ++i)
      w.write_uint(h++);
    w.write_nil();
    if (!with_tokens) continue;
    w.write_array_header(per_event * block_size);
    for (uint32_t i = 0; i < per_event * block_size; ++i)
      w.write_uint(100000 + i % 50000);
    w.write_uint(block_size);
    w.write_nil();
    w.write_str("GPU");
  }
  w.write_uint(0);
  return out;
}

}  // namespace eldr::testing
