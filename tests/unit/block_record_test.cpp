// block_record: the signature cache's value layouts round-trip and refuse damaged bytes.
#include "storage/block_record.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

block_counts sample_counts(const model_geometry& g) {
  // 4 tokens, top-2: layer 0 experts 1 (x3), 4 (x3), 5 (x2); layer 1: 0, 2; layer 2: 6, 7.
  auto c =
      block_counts::from_parts(g, 4, {0, 3, 5, 7}, {1, 4, 5, 0, 2, 6, 7}, {3, 3, 2, 4, 4, 4, 4});
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

TEST(BlockRecord, KeysAreLittleEndianAndParseBack) {
  const std::string k = record::block_key('b', 0x0102030405060708ULL);
  ASSERT_EQ(k.size(), 9u);
  EXPECT_EQ(k[0], 'b');
  EXPECT_EQ(k[1], 8);  // low byte first: the memtable's 3-byte bucket prefix spreads
  EXPECT_EQ(k[8], 1);
  EXPECT_EQ(*record::parse_block_key(k, 'b'), 0x0102030405060708ULL);
  EXPECT_EQ(*record::parse_block_key(record::block_key('c', ~0ULL), 'c'), ~0ULL);
  EXPECT_FALSE(record::parse_block_key(k, 'c'));
  EXPECT_FALSE(record::parse_block_key("b123", 'b'));
}

TEST(BlockRecord, MetaRoundTrips) {
  record::meta m;
  m.parent = 18446744073709539271ULL;
  m.has_counts = true;
  m.created_ms = 1234567;
  m.holders.push_back({{3, 1, 0, "GPU"}, 2});
  m.holders.push_back({{4, -1, -1, ""}, 1});
  std::string bytes;
  record::encode_meta(m, bytes);
  auto back = record::decode_meta(bytes);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->parent, m.parent);
  EXPECT_TRUE(back->has_counts);
  EXPECT_EQ(back->created_ms, 1234567);
  ASSERT_EQ(back->holders.size(), 2u);
  EXPECT_EQ(back->holders[0].key, m.holders[0].key);
  EXPECT_EQ(back->holders[0].refs, 2u);
  EXPECT_EQ(back->holders[1].key.dp_rank, -1);

  // Every truncation and a trailing byte are refused.
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(record::decode_meta(std::string_view(bytes).substr(0, n)).ok()) << n;
  EXPECT_FALSE(record::decode_meta(bytes + "x").ok());
}

TEST(BlockRecord, CountsKeepOnlyTheMaskAndSum) {
  const model_geometry g{3, 8, 2};
  const block_counts c = sample_counts(g);
  const std::vector<uint32_t> mask = {0, 2};
  std::string bytes;
  record::encode_counts(c, mask, 8, bytes);
  ASSERT_TRUE(record::validate_counts(bytes, 2, 8).ok());
  EXPECT_FALSE(record::validate_counts(bytes, 3, 8).ok());
  EXPECT_FALSE(record::validate_counts(bytes, 2, 7).ok());  // expert 7 out of range
  std::vector<uint32_t> sum(2 * 8, 0);
  record::add_counts(bytes, 8, sum);
  record::add_counts(bytes, 8, sum);
  EXPECT_EQ(sum[1], 6u);
  EXPECT_EQ(sum[4], 6u);
  EXPECT_EQ(sum[5], 4u);
  EXPECT_EQ(sum[0], 0u);  // layer 1 is not in the mask
  EXPECT_EQ(sum[8 + 7], 8u);
  uint32_t total = 0;
  for (uint32_t v : sum)
    total += v;
  EXPECT_EQ(total, 32u);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(record::validate_counts(std::string_view(bytes).substr(0, n), 2, 8).ok()) << n;
}

TEST(BlockRecord, DenseLayersAreSmallerWhenMostExpertsAreTouchedAndSumTheSame) {
  // 4 experts, top-3, 2 tokens: layer 0 touches 3 of 4 experts (dense), layer 1 as well.
  const model_geometry g{2, 4, 3};
  auto c = block_counts::from_parts(g, 2, {0, 3, 7}, {0, 1, 3, 0, 1, 2, 3}, {2, 2, 2, 1, 2, 1, 2});
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const std::vector<uint32_t> mask = {0, 1};
  std::string bytes;
  record::encode_counts(*c, mask, 4, bytes);
  EXPECT_EQ(bytes.size(), 5u + 2 * 2 + 4 + 4);  // two dense rows of 4, not 6 + 8 pair bytes
  ASSERT_TRUE(record::validate_counts(bytes, 2, 4).ok());
  std::vector<uint32_t> sum(8, 0), dense(8, 0);
  record::add_counts(bytes, 4, sum);
  c->add_to(g, dense);
  EXPECT_EQ(sum, dense);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(record::validate_counts(std::string_view(bytes).substr(0, n), 2, 4).ok()) << n;
  std::string wrong = bytes;
  wrong[9] = 0;  // zero one dense count: the row no longer has the entries its size says
  EXPECT_FALSE(record::validate_counts(wrong, 2, 4).ok());
}

}  // namespace
}  // namespace eldr
