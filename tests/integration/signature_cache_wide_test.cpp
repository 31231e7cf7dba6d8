// signature_cache with models of more than 256 experts (counts format 2), and warm restarts of
// data directories whose records were written in format 1 by an older build, on a real RocksDB.
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "storage/block_record.hpp"
#include "storage/signature_cache.hpp"
#include "tests/support/random_ids.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

// Counts of 16-token blocks of random routing, one per seed.
block_counts random_block(const model_geometry& g, uint64_t seed) {
  const auto ids = testing::random_ids(g, 16, seed);
  auto c = block_counts::from_tokens(g, ids, 0, 16);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

std::vector<uint32_t> masked_sum_of(const model_geometry& g, const std::vector<block_counts>& bs,
                                    const std::vector<uint32_t>& mask) {
  std::vector<uint32_t> dense(g.width(), 0), out;
  for (const block_counts& b : bs)
    b.add_to(g, dense);
  for (uint32_t l : mask)
    out.insert(out.end(), dense.begin() + l * g.experts, dense.begin() + (l + 1) * g.experts);
  return out;
}

// The raw 'c' values of a closed store, by hash.
std::vector<std::string> raw_counts(const std::string& dir, const std::vector<block_hash>& hs) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Options o;
  const rocksdb::Status s = rocksdb::DB::OpenForReadOnly(o, dir, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  std::vector<std::string> out;
  for (block_hash h : hs) {
    std::string v;
    EXPECT_TRUE(db && db->Get(rocksdb::ReadOptions(), record::block_key('c', h), &v).ok());
    out.push_back(v);
  }
  return out;
}

struct SignatureCacheWide : ::testing::Test {
  testing::temp_dir dir{"eldr-sigcache-wide"};
  std::unique_ptr<signature_cache> open(const model_geometry& g, std::vector<uint32_t> mask) {
    signature_cache_options o;
    o.geometry = g;
    o.layer_mask = std::move(mask);
    auto c = signature_cache::open(dir.sub("db"), std::move(o));
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Stores blocks with counts, chained, held by one worker; commits.
  void store(signature_cache& c, const model_geometry& g, const std::vector<block_hash>& hs,
             const std::vector<block_counts>& bs) {
    const holder_key who{c.worker_id("tcp://w:1"), 0, 0, "GPU"};
    c.store_blocks(who, std::nullopt, hs);
    for (size_t i = 0; i < hs.size(); ++i)
      ASSERT_TRUE(c.put_counts(hs[i], i ? std::optional(hs[i - 1]) : std::nullopt, g, bs[i]).ok());
    ASSERT_TRUE(c.commit().ok());
  }
};

TEST_F(SignatureCacheWide, ModelsOf384And512ExpertsStoreFormat2AndReopenWarm) {
  for (const model_geometry g : {model_geometry{6, 384, 8}, model_geometry{4, 512, 10}}) {
    SCOPED_TRACE(g.to_string());
    std::filesystem::remove_all(dir.sub("db"));
    const std::vector<uint32_t> mask = {1, 3};
    std::vector<block_hash> hs(24);
    std::vector<block_counts> bs;
    for (size_t i = 0; i < hs.size(); ++i) {
      hs[i] = 0xabc0000000000000ULL + i;
      bs.push_back(random_block(g, 100 + i));
    }
    const std::vector<uint32_t> expected = masked_sum_of(g, bs, mask);
    {
      auto c = open(g, mask);
      ASSERT_TRUE(c);
      store(*c, g, hs, bs);
      std::vector<uint32_t> sum(mask.size() * g.experts, 0);
      auto info = c->sum_prefix(hs, sum);
      ASSERT_TRUE(info.ok()) << info.error().to_string();
      EXPECT_EQ(info->with_counts, hs.size());
      EXPECT_EQ(sum, expected);
    }
    for (const std::string& v : raw_counts(dir.sub("db"), hs)) {
      ASSERT_FALSE(v.empty());
      EXPECT_EQ(static_cast<uint8_t>(v[0]), record::counts_format_wide);
    }
    auto c = open(g, mask);  // warm: read back from RocksDB
    ASSERT_TRUE(c);
    EXPECT_EQ(c->stats().blocks_with_counts, hs.size());
    std::vector<uint32_t> sum(mask.size() * g.experts, 0);
    auto cold = c->sum_prefix(hs, sum);
    ASSERT_TRUE(cold.ok()) << cold.error().to_string();
    EXPECT_EQ(cold->disk_reads, hs.size());
    EXPECT_EQ(cold->read_errors, 0u);
    EXPECT_EQ(sum, expected);
    // The single-block view agrees, ids above 255 included.
    auto one = c->masked_counts(hs[5]);
    ASSERT_TRUE(one.ok()) << one.error().to_string();
    EXPECT_EQ(*one, masked_sum_of(g, {bs[5]}, mask));
  }
}

// Format 1 as a build before format 2 wrote it, from docs/signature-cache.md: [1][tokens u16]
// [layers u16][size u16 x layers][(id u8, count u8) x size per layer], here all layers sparse.
std::string format1_record(const model_geometry& g, const block_counts& b,
                           const std::vector<uint32_t>& mask) {
  std::string out;
  auto u16 = [&](uint32_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
  };
  out.push_back('\x01');
  u16(b.tokens());
  u16(static_cast<uint32_t>(mask.size()));
  for (uint32_t l : mask) {
    const uint32_t n = b.offset(l + 1) - b.offset(l);
    EXPECT_LE(2 * n, g.experts) << "the test writes sparse layers only";
    u16(n);
  }
  for (uint32_t l : mask)
    for (uint32_t i = b.offset(l); i < b.offset(l + 1); ++i) {
      out.push_back(static_cast<char>(b.ids()[i]));
      out.push_back(static_cast<char>(b.counts()[i]));
    }
  return out;
}

TEST_F(SignatureCacheWide, ADataDirectoryWrittenInFormat1ByAnOlderBuildOpensWarm) {
  const model_geometry g{4, 64, 2};  // 16 tokens x top-2 touch at most 32 = E / 2: sparse
  const std::vector<uint32_t> mask = {0, 2};
  std::vector<block_hash> hs(12);
  std::vector<block_counts> stored, old;
  for (size_t i = 0; i < hs.size(); ++i) {
    hs[i] = 0x5150000000000000ULL + i;
    stored.push_back(random_block(g, 1 + i));
    old.push_back(random_block(g, 1000 + i));  // different counts: proves what is read
  }
  {
    auto c = open(g, mask);
    ASSERT_TRUE(c);
    store(*c, g, hs, stored);
  }
  {
    // The older build's bytes, written straight into RocksDB over what this build stored.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir.sub("db"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    for (size_t i = 0; i < hs.size(); ++i)
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), record::block_key('c', hs[i]),
                          format1_record(g, old[i], mask))
                      .ok());
  }
  auto c = open(g, mask);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stats().blocks_with_counts, hs.size());
  std::vector<uint32_t> sum(mask.size() * g.experts, 0);
  auto info = c->sum_prefix(hs, sum);
  ASSERT_TRUE(info.ok()) << info.error().to_string();
  EXPECT_EQ(info->with_counts, hs.size());
  EXPECT_EQ(info->read_errors, 0u);
  EXPECT_EQ(sum, masked_sum_of(g, old, mask));
  // New blocks of this model are still written in format 1, byte for byte the older layout.
  const block_hash extra = 0x5150000000000100ULL;
  const block_counts fresh = random_block(g, 77);
  const holder_key who{c->worker_id("tcp://w:1"), 0, 0, "GPU"};
  c->store_blocks(who, std::nullopt, std::vector<block_hash>{extra});
  ASSERT_TRUE(c->put_counts(extra, std::nullopt, g, fresh).ok());
  ASSERT_TRUE(c->commit().ok());
  ASSERT_TRUE(c->flush().ok());
  c.reset();
  EXPECT_EQ(raw_counts(dir.sub("db"), {extra})[0], format1_record(g, fresh, mask));
}

}  // namespace
}  // namespace eldr
