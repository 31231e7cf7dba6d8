// node_config: the signature cache's per-publisher share and uncounted-block grace (issue 12,
// defect 3) parse, default to bounded values, and are refused out of range naming the key.
#include <gtest/gtest.h>

#include <string>

#include "cluster/config/node_config.hpp"

namespace eldr {
namespace {

const std::string model = "[[models]]\nname = \"m\"\n";

TEST(NodeConfigCacheLimits, DefaultsBoundEveryPublisherAndExpireUncountedBlocks) {
  auto c = parse_node_config(model, "eldr.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_DOUBLE_EQ(c->cache_publisher_share, 0.25);
  EXPECT_EQ(c->cache_uncounted_block_grace_ms, 60'000u);
}

TEST(NodeConfigCacheLimits, KeysParseAndOutOfRangeSharesAreRefused) {
  auto c = parse_node_config(
      "[signature_cache]\npublisher_share = 0.5\nuncounted_block_grace_ms = 0\n" + model,
      "eldr.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_DOUBLE_EQ(c->cache_publisher_share, 0.5);
  EXPECT_EQ(c->cache_uncounted_block_grace_ms, 0u);
  for (const char* bad : {"0", "0.0", "1.5", "-0.25", "nan"}) {
    auto r = parse_node_config(
        std::string("[signature_cache]\npublisher_share = ") + bad + "\n" + model, "eldr.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("signature_cache.publisher_share"), std::string::npos)
        << r.error().message();
  }
  auto negative =
      parse_node_config("[signature_cache]\nuncounted_block_grace_ms = -1\n" + model, "eldr.toml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message().find("signature_cache.uncounted_block_grace_ms"),
            std::string::npos)
      << negative.error().message();
}

}  // namespace
}  // namespace eldr
