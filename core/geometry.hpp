// model_geometry: the shape of a MoE model's routing, shared by traces, counts, signatures and
// centroid files so that data from different models can never be mixed silently.
#pragma once

#include <cstdint>
#include <string>

#include "core/base/status.hpp"

namespace eldr {

// An expert's index within its MoE layer, 0..E-1. Sixteen bits in memory for every model, so
// that one code path serves 64-expert and 512-expert models alike; the wire and file formats
// keep their one-byte encodings for models of at most 256 experts (narrow_experts) and use two
// bytes only above (docs/protocol.md, docs/trace-format.md, docs/signature-cache.md).
using expert_id = uint16_t;

// Bounds of a valid geometry (model_geometry::validate):
// - max_layers: MoE layers.
// - max_experts: experts per layer. Real routers today go to 512 (Qwen3-Next; Kimi K2 has 384);
//   4096 leaves room for 8x that while keeping every per-layer scratch array (a counter or a
//   bit per expert) small, and the signature cache's 15-bit per-layer entry count far from its
//   limit. Ids fit expert_id with room to spare.
// - max_width: L * E, the length of a dense per-request count vector, a signature and a centroid.
//   2^20 = 4096 layers x 256 experts was the largest width before ids were widened: wider
//   expert ids do not make any dense array larger than it could already be (4 MiB of counts per
//   request), whatever a file or a message declares.
inline constexpr uint32_t max_layers = 4096;
inline constexpr uint32_t max_experts = 4096;
inline constexpr uint64_t max_width = uint64_t{1} << 20;
// Models whose ids fit one byte: the wire and file formats encode their ids as bytes, exactly as
// before ids were widened, so existing files, peers and stored blocks stay valid.
inline constexpr uint32_t narrow_experts = 256;

struct model_geometry {
  uint32_t layers = 0;   // MoE layers L (1..max_layers)
  uint32_t experts = 0;  // routed experts per layer E (1..max_experts, L * E <= max_width)
  uint32_t top_k = 0;    // experts chosen per token per layer k (1..E)

  // Width of a full (unmasked) per-request count vector: L * E.
  uint32_t width() const { return layers * experts; }
  // Whether expert ids fit one byte (E <= narrow_experts): the one-byte wire and file encodings.
  bool narrow_ids() const { return experts <= narrow_experts; }
  // ok, or invalid_argument naming the bound that is violated.
  status validate() const;
  bool operator==(const model_geometry& o) const {
    return layers == o.layers && experts == o.experts && top_k == o.top_k;
  }
  bool operator!=(const model_geometry& o) const { return !(*this == o); }
  std::string to_string() const;  // "L=26 E=64 k=6"
};

}  // namespace eldr
