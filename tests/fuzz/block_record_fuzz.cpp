// Fuzz target: the signature cache's value decoders on arbitrary bytes (as a damaged disk could
// hand them over). validate_counts must accept only what add_counts can sum inside its row
// bounds, and decode_meta must never read past its input.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "storage/block_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first two bytes pick the shape the bytes are checked against: up to 7 layers of up to 64
  // experts, or, with the first byte's high bit set, of 449..512 (counts format 2's ids).
  const uint32_t layers = data[0] % 8;
  const uint32_t experts = 1 + data[1] % 64 + ((data[0] & 0x80) != 0 ? 448 : 0);
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  (void)eldr::record::decode_meta(bytes);
  if (!eldr::record::validate_counts(bytes, layers, experts).ok()) return 0;
  std::vector<uint32_t> sum(size_t{layers} * experts, 0);
  eldr::record::add_counts(bytes, experts, sum);
  return 0;
}
