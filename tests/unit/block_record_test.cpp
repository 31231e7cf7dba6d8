// block_record: the signature cache's value layouts round-trip and refuse damaged bytes; counts
// format 1 (one-byte ids, what older builds stored) and format 2 (two-byte ids) are both read.
#include "storage/block_record.hpp"

#include <gtest/gtest.h>

#include "tests/support/random_ids.hpp"

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

// ---- counts formats 1 and 2 ----

// The masked dense sum the record must add up to, from the block directly.
std::vector<uint32_t> masked_dense(const model_geometry& g, const block_counts& c,
                                   const std::vector<uint32_t>& mask) {
  std::vector<uint32_t> dense(g.width(), 0), out;
  c.add_to(g, dense);
  for (uint32_t l : mask)
    out.insert(out.end(), dense.begin() + l * g.experts, dense.begin() + (l + 1) * g.experts);
  return out;
}

TEST(BlockRecordWide, Format2HoldsIdsAbove255AndSumsLikeTheBlock) {
  for (const model_geometry g : {model_geometry{4, 384, 8}, model_geometry{3, 512, 10}}) {
    const std::vector<uint32_t> mask = {0, 2};
    // 16 tokens: sparse layers (fewer than E / 2 experts touched); 255 tokens: dense layers.
    for (uint32_t tokens : {16u, 255u}) {
      const auto ids = testing::random_ids(g, tokens, tokens);
      auto c = block_counts::from_tokens(g, ids, 0, tokens);
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      std::string bytes;
      record::encode_counts(*c, mask, g.experts, bytes);
      EXPECT_EQ(static_cast<uint8_t>(bytes[0]), record::counts_format_wide);
      ASSERT_TRUE(record::validate_counts(bytes, 2, g.experts).ok())
          << record::validate_counts(bytes, 2, g.experts).to_string();
      std::vector<uint32_t> sum(2 * g.experts, 0);
      record::add_counts(bytes, g.experts, sum);
      EXPECT_EQ(sum, masked_dense(g, *c, mask)) << g.to_string() << " tokens " << tokens;
      for (size_t n = 0; n < bytes.size(); ++n)
        ASSERT_FALSE(
            record::validate_counts(std::string_view(bytes).substr(0, n), 2, g.experts).ok())
            << n;
      // Validated against fewer experts, the high ids are out of range (or the rows too long).
      EXPECT_FALSE(record::validate_counts(bytes, 2, 256).ok());
    }
  }
}

TEST(BlockRecordWide, Format2SparseEntriesAreLittleEndianIdThenCount) {
  const model_geometry g{1, 512, 2};
  auto c = block_counts::from_parts(g, 1, {0, 2}, {7, 300}, {1, 1});
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  std::string bytes;
  record::encode_counts(*c, std::vector<uint32_t>{0}, g.experts, bytes);
  // format 2, tokens 1, 1 layer, size 2, then (7, 1) and (300 = 0x012c, 1).
  const std::string expected("\x02\x01\x00\x01\x00\x02\x00\x07\x00\x01\x2c\x01\x01", 13);
  EXPECT_EQ(bytes, expected);
  std::string out_of_range = expected;
  out_of_range[10] = '\x00';
  out_of_range[11] = '\x02';  // id 512
  EXPECT_FALSE(record::validate_counts(out_of_range, 1, 512).ok());
  std::string decreasing = expected;
  decreasing[7] = '\x2d';
  decreasing[8] = '\x01';  // first id 301, then 300
  EXPECT_FALSE(record::validate_counts(decreasing, 1, 512).ok());
  std::string unknown = expected;
  unknown[0] = '\x03';
  EXPECT_FALSE(record::validate_counts(unknown, 1, 512).ok());
}

// What a build before format 2 stored, written byte by byte from docs/signature-cache.md: the
// current build reads it, and still writes exactly it for models of at most 256 experts.
TEST(BlockRecordWide, Format1AsOlderBuildsStoredItIsStillReadAndWritten) {
  const model_geometry g{3, 8, 2};
  const block_counts c = sample_counts(g);
  // Mask {0, 2}: layer 0 sparse (1,3) (4,3) (5,2); layer 2 sparse (6,4) (7,4).
  const std::string old(
      "\x01\x04\x00\x02\x00\x03\x00\x02\x00"
      "\x01\x03\x04\x03\x05\x02"
      "\x06\x04\x07\x04",
      19);
  ASSERT_TRUE(record::validate_counts(old, 2, 8).ok());
  std::vector<uint32_t> sum(2 * 8, 0);
  record::add_counts(old, 8, sum);
  EXPECT_EQ(sum, masked_dense(g, c, {0, 2}));
  std::string now;
  record::encode_counts(c, std::vector<uint32_t>{0, 2}, 8, now);
  EXPECT_EQ(now, old);
  EXPECT_EQ(record::counts_format_for(256), record::counts_format_narrow);
  EXPECT_EQ(record::counts_format_for(257), record::counts_format_wide);
}

}  // namespace
}  // namespace eldr
