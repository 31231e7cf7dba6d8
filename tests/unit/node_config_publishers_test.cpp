// node_config: the [signature_cache] publisher keys (max_publishers, publisher_forget_ms,
// replay_timeout_ms) parsed, defaulted, and refused out of range naming the key.
#include <gtest/gtest.h>

#include "cluster/config/node_config.hpp"

namespace eldr {
namespace {

const std::string model = "[[models]]\nname = \"m\"\n";

std::string error_of(const std::string& text) {
  auto c = parse_node_config(text, "eldr.toml");
  EXPECT_FALSE(c.ok()) << "parsed:\n" << text;
  return c.ok() ? "" : c.error().message();
}

TEST(NodeConfigPublishers, ParsesAndDefaults) {
  auto d = parse_node_config(model, "eldr.toml");
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->max_publishers, 256u);
  EXPECT_EQ(d->publisher_forget_ms, 3'600'000);
  EXPECT_EQ(d->replay_timeout_ms, 2000u);
  auto c = parse_node_config(
      "[signature_cache]\nmax_publishers = 3\npublisher_forget_ms = 0\nreplay_timeout_ms = 50\n" +
          model,
      "eldr.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->max_publishers, 3u);
  EXPECT_EQ(c->publisher_forget_ms, 0);
  EXPECT_EQ(c->replay_timeout_ms, 50u);
}

TEST(NodeConfigPublishers, RefusesOutOfRangeNamingTheKey) {
  EXPECT_EQ(error_of("[signature_cache]\nmax_publishers = 0\n" + model),
            "eldr.toml: signature_cache.max_publishers: must be in 1..4096, got 0");
  EXPECT_EQ(error_of("[signature_cache]\nmax_publishers = 5000\n" + model),
            "eldr.toml: signature_cache.max_publishers: must be in 1..4096, got 5000");
  EXPECT_EQ(error_of("[signature_cache]\npublisher_forget_ms = -1\n" + model),
            "eldr.toml: signature_cache.publisher_forget_ms: must be >= 0 (0 = never), got -1");
  EXPECT_EQ(error_of("[signature_cache]\nreplay_timeout_ms = 0\n" + model),
            "eldr.toml: signature_cache.replay_timeout_ms: must be in 1..60000, got 0");
  EXPECT_EQ(error_of("[signature_cache]\nmax_publishers = 1\n" + model +
                     "kv_endpoints = [\"tcp://a:1\", \"tcp://b:1\"]\n"),
            "eldr.toml: signature_cache.max_publishers: 1 is below the 2 publishers the models "
            "configure (kv_endpoints, counts_endpoints, one per kv_events.bind)");
}

}  // namespace
}  // namespace eldr
