// signature: a request's expert signature, the vector ELDR routes on (docs/method.md section 1),
// and everything needed to build one: the transform, IDF, the layer mask.
//
// A signature lives in the *masked* space: |mask| * E dimensions, layer-major over the selected
// layers in ascending layer order, with ONE global L2 normalisation (not per layer). It is stored
// sparse (sorted indices, values): short prompts touch few experts, and a KV block of 16 tokens
// touches at most 16 * k experts per layer; long prompts give near-dense signatures, and scoring
// handles both shapes with one loop.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"
#include "core/expert_counts.hpp"
#include "core/geometry.hpp"

namespace eldr {

struct signature {
  uint32_t width = 0;           // dimension of the masked space: |mask| * E
  std::vector<uint32_t> index;  // strictly increasing, each < width
  std::vector<float> value;     // same length as index; unit L2 norm overall, or empty (all zero)

  bool empty() const { return index.empty(); }
  std::size_t nnz() const { return index.size(); }
};

// How raw counts become signature values before the global normalisation (paper, Fig. 7).
enum class signature_transform { count, sqrt, count_idf, binary };
inline constexpr signature_transform all_transforms[] = {
    signature_transform::count, signature_transform::sqrt, signature_transform::count_idf,
    signature_transform::binary};

std::string_view to_string(signature_transform t);
// "count", "sqrt", "count_idf" (also "count-idf"), "binary"; anything else is an error listing
// them.
result<signature_transform> parse_transform(std::string_view name);

// IDF over a calibration set: idf[l][e] = ln((N + 1) / (df[l][e] + 1)), df = number of requests
// with a non-zero count. `counts` holds N dense L * E rows back to back. Errors: N == 0, size
// not a multiple of L * E.
result<std::vector<float>> fit_idf(const model_geometry& g, std::span<const uint32_t> counts);

// Everything that turns counts into a signature: immutable once made, shared by pointer between
// the builders of many threads, and persisted in centroid files with the centroids it made.
class signature_spec {
 public:
  // layer_mask: the layers kept, each < L, no duplicates (stored ascending; empty = all layers).
  // idf: L * E finite, non-negative values; required for count_idf, ignored (may be empty) for
  // the others.
  static result<signature_spec> make(const model_geometry& g, signature_transform t,
                                     std::vector<uint32_t> layer_mask, std::vector<float> idf);

  const model_geometry& geometry() const { return geometry_; }
  signature_transform transform() const { return transform_; }
  const std::vector<uint32_t>& layer_mask() const { return layer_mask_; }
  // IDF of the full geometry (L * E), empty unless the transform is count_idf.
  const std::vector<float>& idf() const { return idf_; }
  uint32_t width() const { return static_cast<uint32_t>(layer_mask_.size()) * geometry_.experts; }

  // Value of a raw count at masked dimension d, before normalisation.
  float transform_count(uint32_t count, uint32_t d) const;
  // Dense signature (width() floats, unit norm or all zero) from full dense counts (L * E).
  void dense_from_counts(std::span<const uint32_t> counts, std::span<float> out) const;

 private:
  friend class signature_builder;  // reads masked_idf_ on the hot path
  model_geometry geometry_;
  signature_transform transform_ = signature_transform::count;
  std::vector<uint32_t> layer_mask_;
  std::vector<float> idf_;         // L * E, count_idf only
  std::vector<float> masked_idf_;  // width(), count_idf only: the hot path's lookup table
};

// Adds one block's counts over `spec`'s layer mask into `masked` (spec.width() entries,
// layer-major over the mask); only the masked layers are read. Error: a block of another geometry,
// or `masked` of another width (nothing added).
status add_masked_counts(const signature_spec& spec, const block_counts& block,
                         std::span<uint32_t> masked);

// What add_masked_counts adds, entry by entry: f(position, count) for each of the block's counts
// in the masked layers, position = (index in the layer mask) * E + expert, in increasing order.
// For a router that keeps single blocks' masked counts (actors/router/seen_blocks.hpp; its unit
// tests check the two agree). add_masked_counts, on every request's path, keeps its own plain
// loop rather than a call through a lambda. Error: a block of another geometry (f not called).
template <class F>
status for_each_masked_count(const signature_spec& spec, const block_counts& block, F&& f) {
  const model_geometry& g = spec.geometry();
  if (block.layers() != g.layers)
    return status::invalid_argument("block has " + std::to_string(block.layers()) +
                                    " layers, the signature spec expects " +
                                    std::to_string(g.layers));
  const auto& ids = block.ids();
  const auto& counts = block.counts();
  uint32_t base = 0;
  for (uint32_t l : spec.layer_mask()) {
    for (uint32_t i = block.offset(l), end = block.offset(l + 1); i < end; ++i)
      f(base + ids[i], counts[i]);
    base += g.experts;
  }
  return {};
}

// Builds signatures by summing counts (whole blocks, or dense masked partial sums such as a cached
// prefix), then applying the spec. Holds reusable scratch: one builder per thread, and after
// warm-up a build allocates nothing when `out` is reused.
class signature_builder {
 public:
  explicit signature_builder(std::shared_ptr<const signature_spec> spec);

  const signature_spec& spec() const { return *spec_; }
  void reset();
  // Adds one block's counts (only the masked layers are read). Error: a block of another geometry.
  status add(const block_counts& block);
  // Adds full dense counts (L * E, e.g. a whole prompt counted at once).
  status add_dense(std::span<const uint32_t> counts);
  // Adds masked dense counts (width() entries, layer-major over the mask).
  status add_masked(std::span<const uint32_t> masked_counts);
  // Transforms, normalises and writes the sum so far into out (reusing its capacity), then resets.
  void finish(signature& out);

 private:
  std::shared_ptr<const signature_spec> spec_;
  std::vector<uint32_t> acc_;  // width(): the masked sum
  // width() each: finish()'s compaction scratch, so that `out` is written with one exact copy.
  std::vector<uint32_t> index_scratch_;
  std::vector<float> value_scratch_;
};

// Cosine of two signatures (both unit or empty; empty gives 0).
float cosine(const signature& a, const signature& b);

}  // namespace eldr
