// seen_blocks: see seen_blocks.hpp.
#include "actors/router/seen_blocks.hpp"

#include <cstring>

#include "core/signature.hpp"

namespace eldr::router {
namespace {

// An entry's pairs: position << 8 | count, 32 bits each (a count fits in a byte: blocks hold at
// most 255 tokens).
constexpr uint32_t max_positions = uint32_t{1} << 24;

}  // namespace

void seen_blocks::keep(const spec_ptr& spec, uint64_t hash, const block_counts& counts) {
  if (budget_ == 0 || !spec || spec->width() > max_positions) return;
  follow(spec);
  if (store_.find(hash) != nullptr) return;  // made most recent; its counts cannot differ
  if (counts.layers() != spec->geometry().layers) return;
  size_t n = 0;
  for (uint32_t l : spec->layer_mask())
    n += counts.offset(l + 1) - counts.offset(l);
  std::string entry(n * sizeof(uint32_t), '\0');
  char* out = entry.data();
  const status s = for_each_masked_count(*spec, counts, [&out](uint32_t at, uint8_t c) {
    const uint32_t packed = at << 8 | c;
    std::memcpy(out, &packed, sizeof packed);
    out += sizeof packed;
  });
  if (!s.ok()) return;
  store_.put(hash, std::move(entry));
}

bool seen_blocks::add_to(const spec_ptr& spec, uint64_t hash, std::span<uint32_t> acc) {
  if (budget_ == 0 || !spec || acc.size() != spec->width()) return false;
  follow(spec);
  const std::string* e = store_.find(hash);
  if (e == nullptr) {
    ++misses_;
    return false;
  }
  const char* p = e->data();
  for (size_t i = 0, n = e->size() / sizeof(uint32_t); i < n; ++i) {
    uint32_t packed;
    std::memcpy(&packed, p + i * sizeof packed, sizeof packed);
    acc[packed >> 8] += packed & 0xff;
  }
  ++hits_;
  return true;
}

}  // namespace eldr::router
