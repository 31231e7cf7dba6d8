// counts_message: round trip, version and geometry checks, bad blocks skipped alone.
#include "cluster/counts_message.hpp"

#include <gtest/gtest.h>

#include "core/msgpack.hpp"

namespace eldr {
namespace {

const model_geometry geo{2, 8, 2};

block_counts sample() {
  auto c = block_counts::from_parts(geo, 2, {0, 2, 4}, {1, 5, 6, 7}, {2, 2, 2, 2});
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

TEST(CountsMessage, RoundTrips) {
  counts_message m;
  m.geometry = geo;
  m.seq = 9;
  m.blocks.push_back({18446744073709539271ULL, std::nullopt, sample()});
  m.blocks.push_back({5, 18446744073709539271ULL, sample()});
  const auto bytes = encode_counts_message(m);
  std::vector<kv_decode_issue> issues;
  auto back = decode_counts_message(bytes, {}, issues);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(issues.empty());
  EXPECT_EQ(back->geometry, geo);
  EXPECT_EQ(*back->seq, 9u);
  ASSERT_EQ(back->blocks.size(), 2u);
  EXPECT_EQ(back->blocks[0].hash, 18446744073709539271ULL);
  EXPECT_FALSE(back->blocks[0].parent);
  EXPECT_EQ(*back->blocks[1].parent, 18446744073709539271ULL);
  EXPECT_EQ(back->blocks[1].counts.ids(), sample().ids());
  EXPECT_EQ(back->blocks[1].counts.counts(), sample().counts());
  EXPECT_EQ(back->blocks[1].counts.layer_offsets(), sample().layer_offsets());
}

TEST(CountsMessage, RefusesOtherVersionsAndBadBlocksAlone) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(3);
  w.write_str("v");
  w.write_uint(2);
  w.write_str("model");
  w.write_array_header(3);
  w.write_uint(2);
  w.write_uint(8);
  w.write_uint(2);
  w.write_str("blocks");
  w.write_array_header(0);
  std::vector<kv_decode_issue> issues;
  auto r = decode_counts_message(out, {}, issues);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(counts_error_cause(r.error()), drop_cause::unsupported_version);

  // Block 0: expert id 9 >= E; block 1 fine.
  out.clear();
  msgpack::writer w2(out);
  w2.write_map_header(3);
  w2.write_str("blocks");
  w2.write_array_header(2);
  for (int b = 0; b < 2; ++b) {
    w2.write_array_header(6);
    w2.write_uint(static_cast<uint64_t>(b + 1));
    w2.write_nil();
    w2.write_uint(2);
    w2.write_array_header(2);
    w2.write_uint(2);
    w2.write_uint(2);
    const std::vector<uint8_t> ids = {1, b == 0 ? uint8_t{9} : uint8_t{5}, 6, 7};
    const std::vector<uint8_t> counts = {2, 2, 2, 2};
    w2.write_bin(ids);
    w2.write_bin(counts);
  }
  w2.write_str("model");
  w2.write_array_header(3);
  w2.write_uint(2);
  w2.write_uint(8);
  w2.write_uint(2);
  w2.write_str("v");
  w2.write_uint(1);
  r = decode_counts_message(out, {}, issues);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->blocks.size(), 1u);
  EXPECT_EQ(r->blocks[0].hash, 2u);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].cause, drop_cause::bad_counts);

  counts_decode_limits tight;
  tight.max_blocks = 1;
  r = decode_counts_message(out, tight, issues);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(counts_error_cause(r.error()), drop_cause::oversized);
}

}  // namespace
}  // namespace eldr
