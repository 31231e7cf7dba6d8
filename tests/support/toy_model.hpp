// The toy model the node and actor tests route with: 2 MoE layers, 8 experts, top-2, 4 workers.
// Worker w's centroid puts its mass on experts 2w and 2w+1 of both layers, and a block whose 4
// tokens all pick those two experts belongs to worker w -- so with a one-worker band (no
// widening) the expected decision of a request is known without any load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/wire/route_protocol.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/signature.hpp"

namespace eldr::testing {

inline const model_geometry toy_geometry{2, 8, 2};
constexpr uint32_t toy_workers = 4;

// The centroids of `workers` workers of model `model`, worker w at home (w + rotate) % 4: a
// rotation moves every worker's home, so a new epoch is told apart by its decisions.
inline centroid_file toy_centroids(const std::string& model, uint32_t workers = toy_workers,
                                   uint32_t rotate = 0,
                                   signature_transform transform = signature_transform::count) {
  centroid_file f;
  f.model_name = model;
  f.spec = *signature_spec::make(toy_geometry, transform, {}, {});
  f.workers = workers;
  f.centroids.assign(std::size_t{workers} * f.spec.width(), 0.0f);
  const uint32_t experts = toy_geometry.experts;
  for (uint32_t w = 0; w < workers; ++w) {
    const uint32_t home = (w + rotate) % toy_workers;
    for (uint32_t l = 0; l < toy_geometry.layers; ++l)
      for (uint32_t e : {2 * home, 2 * home + 1})
        f.centroids[std::size_t{w} * f.spec.width() + l * experts + e] = 0.5f;
  }
  f.epoch = 1;
  f.provenance.source = "eldr tests: toy model";
  f.provenance.kmeans_variant = "balanced";
  return f;
}

// One block of 4 tokens that all pick experts {2w, 2w+1} in every layer.
inline block_counts toy_block(uint32_t w) {
  std::vector<expert_id> ids;
  for (int t = 0; t < 4; ++t)
    for (uint32_t l = 0; l < toy_geometry.layers; ++l) {
      ids.push_back(static_cast<expert_id>(2 * w));
      ids.push_back(static_cast<expert_id>(2 * w + 1));
    }
  return *block_counts::from_tokens(toy_geometry, ids, 0, 4);
}

// A route request of model `model` for the chained `blocks`, every one worker w's; with their
// counts (each block's parent is the one before it) or with the hashes alone.
inline route_request toy_request(const std::string& id, const std::string& model, uint32_t w,
                                 std::vector<uint64_t> blocks, bool with_counts = true) {
  route_request r;
  r.id = id;
  r.model = model;
  r.block_hashes = std::move(blocks);
  if (with_counts) {
    counts_message c;
    c.geometry = toy_geometry;
    std::optional<uint64_t> parent;
    for (uint64_t h : r.block_hashes) {
      c.blocks.push_back({h, parent, toy_block(w)});
      parent = h;
    }
    r.counts = std::move(c);
  }
  return r;
}

}  // namespace eldr::testing
