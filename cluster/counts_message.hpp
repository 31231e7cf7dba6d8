// counts_message: eldr's own message carrying per-KV-block expert counts from the prefill side to
// the signature cache (docs/protocol.md, "eldr-counts" version 1). MessagePack, versioned, and
// self-describing about the model geometry, so counts of another model are refused, never mixed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cluster/kv_events.hpp"
#include "core/expert_counts.hpp"
#include "core/geometry.hpp"
#include "core/status.hpp"

namespace eldr {

inline constexpr uint32_t counts_message_version = 1;

struct counts_block {
  uint64_t hash = 0;
  std::optional<uint64_t> parent;
  block_counts counts;  // all L layers of the message's geometry
};

struct counts_message {
  uint32_t version = counts_message_version;
  model_geometry geometry;
  std::optional<uint64_t> seq;  // per publisher, for gap counting (no replay)
  std::vector<counts_block> blocks;
};

struct counts_decode_limits {
  uint32_t max_blocks = 4096;  // per message
};

// Writes the message (version 1). Blocks must be of the message's geometry.
std::vector<uint8_t> encode_counts_message(const counts_message& m);

// Decodes one payload. Whole-message errors: bad_msgpack (corrupt), unsupported_version
// (failed_precondition), bad_batch (invalid_argument), oversized (out_of_range). A block that does
// not validate against the geometry (ids >= E, layer sums, sizes) is skipped and reported as
// bad_counts; the other blocks are kept.
result<counts_message> decode_counts_message(std::span<const uint8_t> payload,
                                             const counts_decode_limits& limits,
                                             std::vector<kv_decode_issue>& issues);
drop_cause counts_error_cause(const status& s);

}  // namespace eldr
