// block_record: the byte layouts of the signature cache's RocksDB values (docs/signature-cache.md).
//
// Two values per block, so that the frequent holder changes never rewrite the counts:
//   'b' + hash (8 bytes little-endian) -> meta: parent, creation time, holders
//   'c' + hash                         -> masked counts, sparse per layer
// Little-endian on purpose: the memtable buckets keys by their first 3 bytes, and the low bytes
// of a hash spread evenly even when hashes are small or sequential. Nothing relies on key order.
// Every value starts with a format byte; decoders check every length against the bytes present.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"
#include "core/expert_counts.hpp"
#include "storage/signature_cache.hpp"

namespace eldr::record {

inline constexpr uint8_t meta_format = 1;
// Counts formats differ only in the sparse entries' id width: one byte (format 1, written for
// models of at most 256 experts, as before ids were widened, so that a data directory written by
// an older build opens warm and an older build can still read what this one writes for such
// models) or two bytes little-endian (format 2, models of more experts). Both are always read.
inline constexpr uint8_t counts_format_narrow = 1;
inline constexpr uint8_t counts_format_wide = 2;
// The format encode_counts writes for a model of this many experts.
inline uint8_t counts_format_for(uint32_t experts) {
  return experts <= narrow_experts ? counts_format_narrow : counts_format_wide;
}
inline constexpr size_t max_medium_bytes = 32;

// Keys: a one-byte tag then the hash, little-endian.
std::string block_key(char tag, block_hash h);
// Inverse for keys of 9 bytes; nullopt otherwise.
std::optional<block_hash> parse_block_key(std::string_view key, char tag);

struct meta {
  std::optional<block_hash> parent;
  bool has_counts = false;
  int64_t created_ms = 0;
  std::vector<holder> holders;
  // In memory only, never encoded: whether the 'b' and 'c' keys exist in RocksDB, so that a
  // block created and deleted between two commits costs no RocksDB write at all.
  bool meta_on_disk = false;
  bool counts_on_disk = false;
};

void encode_meta(const meta& m, std::string& out);
result<meta> decode_meta(std::string_view bytes);

// Masked counts: [format][tokens u16][n u16 = |mask|][size u16 x n][layer data x n], little-
// endian, only the layers of `mask`, in mask order. Each layer is in the smaller of two forms:
// sparse, size = entries and data = (id, count u8) pairs with ids increasing, the id a u8
// (format 1) or a little-endian u16 (format 2); or dense, size = dense_layer | entries and
// data = E count bytes indexed by expert id (both formats). Entries per layer are at most
// E <= max_experts, far below dense_layer.
inline constexpr uint32_t dense_layer = 0x8000;
static_assert(max_experts < dense_layer);
void encode_counts(const block_counts& c, std::span<const uint32_t> mask, uint32_t experts,
                   std::string& out);
// Checks the layout (either format) against `layers` (= |mask|) and `experts`, and that ids
// strictly increase within each layer (what add_counts relies on).
status validate_counts(std::string_view bytes, uint32_t layers, uint32_t experts);
// Adds validated counts into masked_sum (layers * experts, layer-major). Hot path: no checks
// beyond what validate_counts did when the bytes entered memory.
void add_counts(std::string_view bytes, uint32_t experts, std::span<uint32_t> masked_sum);

// The store's other records, beside the blocks:
//   "m:geometry"       -> L, E, top_k (u32s)
//   "m:mask"           -> the layer mask (u32s)
//   "m:current_epoch"  -> the current centroid epoch (u64_value)
//   'e' + epoch        -> a centroid set's bytes as given (epoch_key, laid out as block_key)
//   'w' + id           -> [1][has sequence 0/1][sequence u64][name] (worker_key: id big-endian)
//   "x:" + name        -> a metadata value as given
inline const std::string key_geometry = "m:geometry";
inline const std::string key_mask = "m:mask";
inline const std::string key_current_epoch = "m:current_epoch";

// u32 values, each 4 bytes little-endian; parse_u32s ignores a trailing partial value.
std::string u32s(std::span<const uint32_t> v);
std::vector<uint32_t> parse_u32s(std::string_view s);
std::string worker_key(uint32_t id);
std::string epoch_key(uint64_t epoch);
// 8 bytes little-endian; parse_u64 reads at most 8 bytes, missing ones as 0.
std::string u64_value(uint64_t v);
uint64_t parse_u64(std::string_view s);

}  // namespace eldr::record
