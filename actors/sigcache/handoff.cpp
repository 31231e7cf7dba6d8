// handoff: see handoff.hpp.
#include "actors/sigcache/handoff.hpp"

#include <utility>

namespace eldr::sigcache {

status put_dense_counts(signature_cache& cache, block_hash hash, std::optional<block_hash> parent,
                        const model_geometry& g, const std::vector<uint32_t>& dense) {
  if (g.layers == 0 || g.top_k == 0 || dense.size() != size_t{g.layers} * g.experts)
    return status::invalid_argument("handoff: counts do not cover every layer of the geometry");
  uint32_t first_layer = 0;
  for (uint32_t e = 0; e < g.experts; ++e)
    first_layer += dense[e];
  const uint32_t tokens = first_layer / g.top_k;
  std::vector<uint32_t> offsets{0};
  std::vector<expert_id> ids;
  std::vector<uint8_t> counts;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t e = 0; e < g.experts; ++e)
      if (const uint32_t c = dense[size_t{l} * g.experts + e]; c > 0) {
        if (c > 255) return status::invalid_argument("handoff: a count above 255");
        ids.push_back(static_cast<expert_id>(e));
        counts.push_back(static_cast<uint8_t>(c));
      }
    offsets.push_back(static_cast<uint32_t>(ids.size()));
  }
  auto bc =
      block_counts::from_parts(g, tokens, std::move(offsets), std::move(ids), std::move(counts));
  if (!bc.ok()) return bc.error();
  return cache.put_counts(hash, parent, g, *bc);
}

uint64_t take_over(model_cache& mc, const model_geometry& g,
                   const std::vector<handoff_block>& blocks) {
  uint64_t stored = 0;
  std::vector<uint32_t> masked;
  for (const auto& b : blocks) {
    auto have = mc.cache->block(b.hash);
    if (have.ok() && have->has_counts) continue;  // already here: never stored twice
    const std::optional<block_hash> parent =
        b.has_parent ? std::optional<block_hash>(b.parent) : std::nullopt;
    // A store that has never seen counts has no geometry yet: its first block goes in as
    // ordinary counts (possible when the sender keeps every layer), which fixes it.
    masked.assign(b.masked.begin(), b.masked.end());
    auto s = mc.cache->geometry().layers == 0
                 ? put_dense_counts(*mc.cache, b.hash, parent, g, masked)
                 : mc.cache->put_masked_counts(b.hash, parent, masked);
    if (s.ok()) {
      ++mc.taken_over;
      ++stored;
      mc.dirty = true;
    } else {
      ++mc.handoff_refused;
    }
  }
  return stored;
}

std::optional<std::vector<uint8_t>> handoff_bytes(const std::vector<uint32_t>& masked) {
  std::vector<uint8_t> out(masked.size());
  for (size_t i = 0; i < masked.size(); ++i) {
    if (masked[i] > 255) return std::nullopt;
    out[i] = static_cast<uint8_t>(masked[i]);
  }
  return out;
}

}  // namespace eldr::sigcache
