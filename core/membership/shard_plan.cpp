// shard_plan: local blocks first, then a greedy cover of the rest; layer-set sums.
#include "core/membership/shard_plan.hpp"

#include <algorithm>
#include <iterator>

namespace eldr {

std::vector<uint32_t> choose_signers(const std::vector<std::vector<uint32_t>>& owners,
                                     std::optional<uint32_t> local,
                                     const std::vector<uint32_t>& excluded) {
  auto allowed = [&](uint32_t m) {
    return std::find(excluded.begin(), excluded.end(), m) == excluded.end();
  };
  const bool local_allowed = local && allowed(*local);
  std::vector<uint32_t> chosen(owners.size(), no_signer);
  std::vector<size_t> open;  // blocks not summed locally that some allowed owner can sum
  uint32_t members = 0;      // 1 + the largest member index met
  for (size_t i = 0; i < owners.size(); ++i) {
    bool any = false;
    for (uint32_t m : owners[i]) {
      if (m == no_signer || !allowed(m)) continue;
      if (local_allowed && m == *local) {
        chosen[i] = m;
        any = false;
        break;
      }
      any = true;
      members = std::max(members, m + 1);
    }
    if (any) open.push_back(i);
  }

  // Each round picks one member and gives it every open block it owns; at most one round per
  // distinct member, each a pass over the open blocks.
  std::vector<size_t> covers(members), nearest(members);
  while (!open.empty()) {
    std::fill(covers.begin(), covers.end(), 0);
    std::fill(nearest.begin(), nearest.end(), 0);
    for (size_t i : open) {
      bool first = true;
      for (uint32_t m : owners[i]) {
        if (m == no_signer || !allowed(m)) continue;
        ++covers[m];
        if (first) ++nearest[m];
        first = false;
      }
    }
    uint32_t best = 0;
    for (uint32_t m = 1; m < members; ++m)
      if (covers[m] > covers[best] || (covers[m] == covers[best] && nearest[m] > nearest[best]))
        best = m;
    std::vector<size_t> rest;
    for (size_t i : open) {
      const auto& o = owners[i];
      if (std::find(o.begin(), o.end(), best) != o.end())
        chosen[i] = best;
      else
        rest.push_back(i);
    }
    open = std::move(rest);
  }
  return chosen;
}

bool add_common_layers(const std::vector<uint32_t>& from_layers, std::span<const uint32_t> from,
                       const std::vector<uint32_t>& to_layers, uint32_t experts,
                       std::span<uint32_t> to) {
  if (from.size() != from_layers.size() * experts || to.size() != to_layers.size() * experts)
    return false;
  // Both ascending: one merge-like walk.
  size_t i = 0;
  for (size_t j = 0; j < to_layers.size(); ++j) {
    while (i < from_layers.size() && from_layers[i] < to_layers[j])
      ++i;
    if (i == from_layers.size()) break;
    if (from_layers[i] != to_layers[j]) continue;
    const uint32_t* src = from.data() + i * experts;
    uint32_t* dst = to.data() + j * experts;
    for (uint32_t x = 0; x < experts; ++x)
      dst[x] += src[x];
  }
  return true;
}

std::vector<uint32_t> common_layers(const std::vector<uint32_t>& kept,
                                    const std::vector<uint32_t>& wanted) {
  std::vector<uint32_t> out;
  std::set_intersection(kept.begin(), kept.end(), wanted.begin(), wanted.end(),
                        std::back_inserter(out));
  return out;
}

uint8_t pack_sums(std::span<const uint32_t> values, std::vector<uint8_t>& out) {
  uint32_t largest = 0;
  for (uint32_t v : values)
    largest = std::max(largest, v);
  const uint8_t width = largest <= 0xffffu ? 2 : 4;
  out.resize(values.size() * width);
  uint8_t* p = out.data();
  for (uint32_t v : values)
    for (uint8_t b = 0; b < width; ++b)
      *p++ = static_cast<uint8_t>(v >> (8 * b));
  return width;
}

bool unpack_sums(std::span<const uint8_t> bytes, uint8_t value_bytes, std::vector<uint32_t>& out) {
  if ((value_bytes != 2 && value_bytes != 4) || bytes.size() % value_bytes != 0) return false;
  out.resize(bytes.size() / value_bytes);
  const uint8_t* p = bytes.data();
  for (uint32_t& v : out) {
    v = 0;
    for (uint8_t b = 0; b < value_bytes; ++b)
      v |= uint32_t{*p++} << (8 * b);
  }
  return true;
}

}  // namespace eldr
