// model_geometry: the shape of a MoE model's routing, shared by traces, counts, signatures and
// centroid files so that data from different models can never be mixed silently.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.hpp"

namespace eldr {

struct model_geometry {
  uint32_t layers = 0;   // MoE layers L (>= 1)
  uint32_t experts = 0;  // routed experts per layer E (1..256: ids fit in a byte)
  uint32_t top_k = 0;    // experts chosen per token per layer k (1..E)

  // Width of a full (unmasked) per-request count vector: L * E.
  uint32_t width() const { return layers * experts; }
  // ok, or invalid_argument naming the bound that is violated.
  status validate() const;
  bool operator==(const model_geometry& o) const {
    return layers == o.layers && experts == o.experts && top_k == o.top_k;
  }
  bool operator!=(const model_geometry& o) const { return !(*this == o); }
  std::string to_string() const;  // "L=26 E=64 k=6"
};

}  // namespace eldr
