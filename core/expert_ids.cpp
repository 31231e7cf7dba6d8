// expert_ids: see expert_ids.hpp.
#include "core/expert_ids.hpp"

#include <cassert>

namespace eldr {

void append_expert_ids(std::span<const expert_id> ids, uint32_t id_bytes,
                       std::vector<uint8_t>& out) {
  assert(id_bytes == narrow_id_bytes || id_bytes == wide_id_bytes);
  if (id_bytes == narrow_id_bytes) {
    // One pass, each id narrowed as it is copied (no zero-fill first): the counts encoder's
    // inner loop for every model of at most 256 experts.
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  const size_t at = out.size();
  out.resize(at + ids.size() * id_bytes);
  uint8_t* p = out.data() + at;
  for (size_t i = 0; i < ids.size(); ++i) {
    p[2 * i] = static_cast<uint8_t>(ids[i] & 0xffu);
    p[2 * i + 1] = static_cast<uint8_t>(ids[i] >> 8);
  }
}

bool read_expert_ids(std::span<const uint8_t> bytes, uint32_t id_bytes,
                     std::vector<expert_id>& out) {
  if (id_bytes == narrow_id_bytes) {
    out.assign(bytes.begin(), bytes.end());  // widened element by element (vectorised)
    return true;
  }
  if (id_bytes != wide_id_bytes || bytes.size() % wide_id_bytes != 0) return false;
  const size_t n = bytes.size() / wide_id_bytes;
  out.resize(n);
  const uint8_t* p = bytes.data();
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<expert_id>(p[2 * i] | (p[2 * i + 1] << 8));
  return true;
}

}  // namespace eldr
