// incarnation: a process started later draws a larger incarnation than one started earlier,
// whatever their random bits; two drawn in the same millisecond differ by their random bits.
#include "core/membership/incarnation.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace eldr {
namespace {

TEST(Incarnation, ALaterStartIsLargerWhateverTheRandomBits) {
  const uint64_t t = 1'796'000'000'000;  // a wall clock in 2026, in ms
  EXPECT_GT(incarnation_at(t + 1, 0), incarnation_at(t, 0xffff));
  EXPECT_GT(incarnation_at(t + 1000, 0x0000), incarnation_at(t, 0x8000));
  EXPECT_NE(incarnation_at(t, 1), incarnation_at(t, 2));
  EXPECT_EQ(incarnation_at(t, 0x1234) >> 16, t);
}

TEST(Incarnation, ADrawnOneCarriesTheWallClock) {
  const auto ms = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  };
  const uint64_t before = ms();
  const uint64_t drawn = draw_incarnation();
  const uint64_t after = ms();
  EXPECT_GE(drawn >> 16, before);
  EXPECT_LE(drawn >> 16, after);
}

}  // namespace
}  // namespace eldr
