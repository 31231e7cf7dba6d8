#include "core/membership/incarnation.hpp"

#include <chrono>
#include <random>

namespace eldr {

uint64_t incarnation_at(uint64_t wall_ms, uint16_t random_bits) {
  return (wall_ms << 16) | random_bits;
}

uint64_t draw_incarnation() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::random_device rd;
  return incarnation_at(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now).count()),
      static_cast<uint16_t>(rd()));
}

}  // namespace eldr
