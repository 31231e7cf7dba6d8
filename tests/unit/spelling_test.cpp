// spelling: the distance itself, and the suggestion rule node_config and eldrctl share.
#include "core/base/spelling.hpp"

#include <gtest/gtest.h>

#include <array>
#include <string_view>

namespace eldr {
namespace {

TEST(Spelling, EditDistanceCountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("tau", "tau"), 0u);
  EXPECT_EQ(edit_distance("tua", "tau"), 2u);  // a transposition is two substitutions
  EXPECT_EQ(edit_distance("stauts", "status"), 2u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("abc", "xbcd"), edit_distance("xbcd", "abc"));
}

TEST(Spelling, ClosestIsWithinTwoEditsAndTheFirstOnATie) {
  constexpr std::array<std::string_view, 4> keys = {"policy", "tau", "seed", "workers"};
  EXPECT_EQ(closest_spelling("tua", keys), "tau");
  EXPECT_EQ(closest_spelling("worker", keys), "workers");
  EXPECT_EQ(closest_spelling("centroids", keys), std::nullopt);  // unrelated: no suggestion
  EXPECT_EQ(closest_spelling("sed", keys), "seed");
  EXPECT_EQ(closest_spelling("ta", keys, 0), std::nullopt);
  constexpr std::array<std::string_view, 2> tie = {"ab", "ac"};
  EXPECT_EQ(closest_spelling("aa", tie), "ab");
  EXPECT_EQ(closest_spelling("x", std::span<const std::string_view>()), std::nullopt);
}

}  // namespace
}  // namespace eldr
