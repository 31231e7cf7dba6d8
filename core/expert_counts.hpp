// expert_counts: how many tokens chose each expert at each MoE layer (docs/method.md section 1),
// per request and per KV block.
//
// Two shapes, for two jobs:
// - dense counts (L * E uint32, layer-major) for calibration work over a few thousand requests:
//   IDF, rho, layer selection, K-means input;
// - block_counts, sparse per layer, for the online path: one per KV block of block_size tokens,
//   co-indexed with the KV cache, so that prefix-cached blocks keep exact signatures. A block's
//   count for one expert at one layer is at most its token count (a token picks an expert at most
//   once per layer), so counts fit in a byte for blocks of fewer than 256 tokens (enforced by
//   every constructor); ids are expert_id (16 bits: E up to max_experts). from_tokens and
//   count_blocks also read one-byte ids (models of at most 256 experts, as vLLM returns them) with
//   the same counting code, so eldr-proxy need not widen them first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/base/status.hpp"
#include "core/geometry.hpp"

namespace eldr {

class block_counter;

// A counted block's counts as views, as block_counts holds them (layer_offsets: L + 1 entries
// from 0; ids ascending within a layer), owning nothing: valid while the function handed them
// runs, or while the block_counts they view lives.
struct block_counts_view {
  uint32_t tokens = 0;
  std::span<const uint32_t> layer_offsets;
  std::span<const expert_id> ids;
  std::span<const uint8_t> counts;
};

// Adds the expert choices of tokens [begin, end) to counts (size L * E, layer-major).
// `experts` is token-major as in eldr-trace: id of choice r of token t at layer l is element
// (t * L + l) * k + r. Ids >= E are an error (counts are left partially updated: validate first
// or use validated traces).
status add_token_counts(const model_geometry& g, std::span<const expert_id> experts, uint32_t begin,
                        uint32_t end, std::span<uint32_t> counts);

// Expert counts of one KV block, sparse per layer (CSR by layer, experts ascending within a
// layer). Immutable once built; cheap to copy around compared to a dense L * E array.
class block_counts {
 public:
  block_counts() = default;

  // Counts the choices of tokens [begin, end) of a token-major id array (see add_token_counts).
  // Errors: end - begin not in 1..255, ids >= E, an expert picked by more of the block's
  // tokens than it has (a token repeating an id in its top-k row), a range outside the array.
  static result<block_counts> from_tokens(const model_geometry& g,
                                          std::span<const expert_id> experts, uint32_t begin,
                                          uint32_t end);
  static result<block_counts> from_tokens(const model_geometry& g, std::span<const uint8_t> experts,
                                          uint32_t begin, uint32_t end);
  // From explicit per-layer entries, as received over the wire: layer_offsets has L + 1 entries
  // (first 0, non-decreasing, last == ids.size()); within a layer, ids strictly increase and are
  // < E; every count is in 1..tokens. Errors name the first violation.
  static result<block_counts> from_parts(const model_geometry& g, uint32_t tokens,
                                         std::vector<uint32_t> layer_offsets,
                                         std::vector<expert_id> ids, std::vector<uint8_t> counts);

  uint32_t tokens() const { return tokens_; }
  uint32_t layers() const {
    return layer_offsets_.empty() ? 0 : uint32_t(layer_offsets_.size() - 1);
  }
  // Entries of layer l: ids()[b, e) and counts()[b, e) with b = offset(l), e = offset(l + 1).
  uint32_t offset(uint32_t l) const { return layer_offsets_[l]; }
  const std::vector<uint32_t>& layer_offsets() const { return layer_offsets_; }
  const std::vector<expert_id>& ids() const { return ids_; }
  const std::vector<uint8_t>& counts() const { return counts_; }
  block_counts_view view() const;
  // Adds this block's counts to a dense L * E array.
  void add_to(const model_geometry& g, std::span<uint32_t> dense) const;

 private:
  friend class block_counter;  // expert_counts.cpp: the counting of from_tokens and count_blocks

  uint32_t tokens_ = 0;
  std::vector<uint32_t> layer_offsets_;
  std::vector<expert_id> ids_;
  std::vector<uint8_t> counts_;
};

// Splits tokens [begin, end) into KV blocks of block_size tokens (the last one may be partial,
// as a KV cache's last block is) and counts each (the errors of from_tokens). block_size must be
// in 1..255. token_stride: where token t's L * k ids start, t * token_stride (0: L * k, the
// token-major array of add_token_counts); a wider stride reads rows of a larger array in place,
// such as vLLM's routed experts with their dense layers, which eldr-proxy does not copy out.
result<std::vector<block_counts>> count_blocks(const model_geometry& g,
                                               std::span<const expert_id> experts, uint32_t begin,
                                               uint32_t end, uint32_t block_size,
                                               std::size_t token_stride = 0);
result<std::vector<block_counts>> count_blocks(const model_geometry& g,
                                               std::span<const uint8_t> experts, uint32_t begin,
                                               uint32_t end, uint32_t block_size,
                                               std::size_t token_stride = 0);

// count_blocks without a block_counts per block: hands block i's counts to each(i, view) as soon
// as it is counted, in order, the view valid during the call only (the counting's scratch). The
// first error, count_blocks' or each's, is returned, and no later block is counted. For writers
// that copy the counts straight into their own form: eldr-proxy's conversion writes them into
// the counts message as they come (cluster/wire/counts_message.hpp).
status for_each_block_count(const model_geometry& g, std::span<const expert_id> experts,
                            uint32_t begin, uint32_t end, uint32_t block_size,
                            std::size_t token_stride,
                            const std::function<status(uint32_t, const block_counts_view&)>& each);
status for_each_block_count(const model_geometry& g, std::span<const uint8_t> experts,
                            uint32_t begin, uint32_t end, uint32_t block_size,
                            std::size_t token_stride,
                            const std::function<status(uint32_t, const block_counts_view&)>& each);

// The ways counting gathers a layer's nonzero counts from its histogram row (expert_counts.cpp):
// each call picks the fastest this CPU runs. For tests, which check every one the CPU runs
// against the portable one.
namespace detail {

enum class row_compressor { portable, ssse3, avx512 };

bool cpu_runs(row_compressor c);

struct compressed_row {
  std::vector<expert_id> ids;  // of the nonzero counts, ascending
  std::vector<uint8_t> counts;
  uint32_t sum = 0;
  bool over = false;        // a count is over the tokens
  bool row_zeroed = false;  // the row was left all zeros, as the next block needs it
};

// `row`: one byte per expert. Nothing when the CPU does not run c.
std::optional<compressed_row> compress_row_with(row_compressor c, std::span<const uint8_t> row,
                                                uint32_t tokens);

}  // namespace detail

}  // namespace eldr
