// counts_message: eldr's own message carrying per-KV-block expert counts from the prefill side to
// the signature cache (docs/protocol.md, "eldr-counts" versions 1 and 2). MessagePack, versioned,
// and self-describing about the model geometry, so counts of another model are refused, never
// mixed. The versions differ only in how expert ids are encoded: one byte each (version 1, models
// of at most 256 experts) or little-endian uint16 (version 2, any model).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "cluster/wire/kv_events.hpp"
#include "core/base/status.hpp"
#include "core/expert_counts.hpp"
#include "core/geometry.hpp"

namespace eldr {

inline constexpr uint32_t counts_message_v1 = 1;  // one byte per id: E <= 256
inline constexpr uint32_t counts_message_v2 = 2;  // little-endian uint16 ids: any E

// The version encode_counts_message writes: 1 when every id fits a byte, so that peers built
// before version 2 keep reading counts of such models, else 2.
uint32_t counts_message_version_for(const model_geometry& g);

struct counts_block {
  uint64_t hash = 0;
  std::optional<uint64_t> parent;
  block_counts counts;  // all L layers of the message's geometry
};

struct counts_message {
  uint32_t version = 0;  // as decoded; the encoder writes counts_message_version_for(geometry)
  model_geometry geometry;
  std::optional<uint64_t> seq;  // per publisher, for gap counting (no replay)
  std::vector<counts_block> blocks;
};

struct counts_decode_limits {
  uint32_t max_blocks = 4096;  // per message
};

// Writes the message in version counts_message_version_for(m.geometry). Blocks must be of the
// message's geometry.
std::vector<uint8_t> encode_counts_message(const counts_message& m);
// As above in the given version (1 or 2; 1 keeps only the low byte of each id, so it is meant for
// E <= 256): for tests and tools that need one version.
std::vector<uint8_t> encode_counts_message(const counts_message& m, uint32_t version);

// Writes the blocks of a message as they are added (encode_counts_message_as_added), each block
// in the same bytes encode_counts_message writes it.
class counts_block_writer {
 public:
  counts_block_writer(std::vector<uint8_t>& out, uint32_t id_bytes)
      : out_(out), id_bytes_(id_bytes) {}
  // The next block, of the message's geometry.
  void add(uint64_t hash, std::optional<uint64_t> parent, const block_counts_view& counts);
  uint32_t added() const { return added_; }

 private:
  std::vector<uint8_t>& out_;
  const uint32_t id_bytes_;
  uint32_t added_ = 0;
};

// The message of n_blocks blocks that produce adds, in order, each written as it is added: the
// bytes encode_counts_message makes of a counts_message of the same blocks, without a
// counts_block per block (eldr-proxy's conversion counts straight into its message, with
// for_each_block_count). reserve: the bytes to reserve first (a bound avoids copies as a message
// of megabytes grows). Returns produce's error, or failed_precondition when it adds another
// number of blocks than n_blocks.
result<std::vector<uint8_t>> encode_counts_message_as_added(
    const model_geometry& g, std::optional<uint64_t> seq, uint32_t n_blocks, size_t reserve,
    const std::function<status(counts_block_writer&)>& produce);

// Decodes one payload of version 1 or 2. Whole-message errors: bad_msgpack (corrupt),
// unsupported_version (failed_precondition: any other version), bad_batch (invalid_argument, also
// a version 1 message of more than 256 experts, whose ids a byte cannot hold), oversized
// (out_of_range). A block that does not validate against the geometry (ids >= E, layer sums,
// sizes, a v2 ids bin that is not two bytes per entry) is skipped and reported as bad_counts; the
// other blocks are kept.
result<counts_message> decode_counts_message(std::span<const uint8_t> payload,
                                             const counts_decode_limits& limits,
                                             std::vector<kv_decode_issue>& issues);
drop_cause counts_error_cause(const status& s);

}  // namespace eldr
