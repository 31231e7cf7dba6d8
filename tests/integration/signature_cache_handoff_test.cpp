// Handing a block's counts from one signature cache to another (the hash ring moved it):
// masked_counts on the sender, put_masked_counts on the receiver, on real RocksDB in temporary
// directories. The receiver must answer every prefix lookup as the sender does, durably.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "storage/signature_cache.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

const model_geometry geo{4, 16, 2};

// Counts of a block of 1..32 tokens with random expert choices: some layers come out sparse,
// some dense in the stored encoding.
block_counts random_counts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto tokens = static_cast<uint32_t>(1 + rng() % 32);
  std::vector<expert_id> choices;
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t l = 0; l < geo.layers; ++l) {
      const auto a = static_cast<expert_id>(rng() % geo.experts);
      auto b = static_cast<expert_id>(rng() % (geo.experts - 1));
      if (b >= a) ++b;  // top_k = 2 distinct experts
      choices.insert(choices.end(), {a, b});
    }
  auto c = block_counts::from_tokens(geo, choices, 0, tokens);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

// The block's dense counts restricted to `mask` (all layers when empty).
std::vector<uint32_t> masked_of(const block_counts& c, const std::vector<uint32_t>& mask) {
  std::vector<uint32_t> dense(geo.width(), 0), out;
  c.add_to(geo, dense);
  for (uint32_t l = 0; l < geo.layers; ++l)
    if (mask.empty() || std::find(mask.begin(), mask.end(), l) != mask.end())
      out.insert(out.end(), dense.begin() + l * geo.experts, dense.begin() + (l + 1) * geo.experts);
  return out;
}

struct SignatureCacheHandoff : ::testing::TestWithParam<std::vector<uint32_t>> {
  testing::temp_dir dir{"eldr-sigcache-handoff"};

  signature_cache_options options() {
    signature_cache_options o;
    o.geometry = geo;
    o.layer_mask = GetParam();
    o.clock = [] { return int64_t{1000}; };
    return o;
  }
  std::unique_ptr<signature_cache> open(const std::string& name, signature_cache_options o) {
    auto c = signature_cache::open(dir.sub(name), std::move(o));
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static std::vector<uint32_t> sum_of(signature_cache& c, std::span<const block_hash> hs) {
    std::vector<uint32_t> sum(c.layer_mask().size() * geo.experts, 0);
    auto info = c.sum_prefix(hs, sum);
    EXPECT_TRUE(info.ok());
    EXPECT_EQ(info->with_counts, hs.size());
    return sum;
  }
};

TEST_P(SignatureCacheHandoff, ReceiverAnswersEveryPrefixAsTheSenderDoesAndKeepsItAfterReopen) {
  const size_t n = 40;
  std::vector<block_hash> hs(n);
  std::vector<block_counts> counts;
  for (size_t i = 0; i < n; ++i) {
    hs[i] = 0xabc0000000000000ULL + 977 * i;
    counts.push_back(random_counts(i + 1));
  }
  auto a = open("a", options());
  const holder_key who{a->worker_id("w"), 0, 0, "GPU"};
  a->store_blocks(who, std::nullopt, hs);
  for (size_t i = 0; i < n; ++i)
    ASSERT_TRUE(
        a->put_counts(hs[i], i ? std::optional(hs[i - 1]) : std::nullopt, geo, counts[i]).ok());
  ASSERT_TRUE(a->commit().ok());
  const std::vector<size_t> lengths = {1, 2, 15, 16, 17, 33, 40};
  for (size_t len : lengths)
    (void)sum_of(*a, std::span(hs).first(len));  // A remembers prefix sums on the way
  a->drop_memory_cache();                        // the second half comes from RocksDB on the sender

  const std::vector<uint32_t>& mask = a->layer_mask();
  auto b = open("b", options());
  for (size_t i = 0; i < n; ++i) {
    if (i == n / 2) a->drop_memory_cache();
    auto masked = a->masked_counts(hs[i]);
    ASSERT_TRUE(masked.ok()) << masked.error().to_string();
    EXPECT_EQ(*masked, masked_of(counts[i], GetParam())) << i;
    EXPECT_EQ(masked->size(), mask.size() * geo.experts);
    ASSERT_TRUE(b->put_masked_counts(hs[i], a->block(hs[i])->parent, *masked).ok());
  }
  EXPECT_EQ(b->stats().blocks_with_counts, n);
  for (size_t len : lengths)  // staged, not yet committed
    EXPECT_EQ(sum_of(*b, std::span(hs).first(len)), sum_of(*a, std::span(hs).first(len))) << len;
  ASSERT_TRUE(b->commit().ok());
  b.reset();

  b = open("b", options());
  EXPECT_EQ(b->stats().blocks, n);
  EXPECT_EQ(b->stats().blocks_with_counts, n);
  for (size_t i = 0; i < n; ++i) {
    auto info = b->block(hs[i]);
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->has_counts);
    EXPECT_EQ(info->parent, a->block(hs[i])->parent);
    EXPECT_TRUE(info->holders.empty());  // counts travel, holders are the receiver's own
  }
  for (size_t len : lengths)  // cold, from RocksDB
    EXPECT_EQ(sum_of(*b, std::span(hs).first(len)), sum_of(*a, std::span(hs).first(len))) << len;
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(*b->masked_counts(hs[i]), *a->masked_counts(hs[i])) << i;
}

TEST_P(SignatureCacheHandoff, MaskedCountsAreTheBlocksOwnNeverARememberedSum) {
  auto o = options();
  o.memory_cache_bytes = 1;  // no LRU: the counts come from RocksDB while the sums stay remembered
  auto c = open("a", o);
  std::vector<block_hash> hs(32);
  std::iota(hs.begin(), hs.end(), 500);
  std::vector<block_counts> counts;
  for (size_t i = 0; i < hs.size(); ++i) {
    counts.push_back(random_counts(100 + i));
    ASSERT_TRUE(c->put_counts(hs[i], std::nullopt, geo, counts[i]).ok());
  }
  ASSERT_TRUE(c->commit().ok());
  (void)sum_of(*c, hs);  // remembers the sums of 16 and 32 blocks
  std::vector<uint32_t> sum(c->layer_mask().size() * geo.experts, 0);
  EXPECT_EQ(c->sum_prefix(hs, sum)->memo_blocks, 32u);  // served from a remembered sum
  for (size_t i : {size_t{15}, size_t{31}, size_t{0}}) {
    auto own = c->masked_counts(hs[i]);
    ASSERT_TRUE(own.ok()) << own.error().to_string();
    EXPECT_EQ(*own, masked_of(counts[i], GetParam())) << i;
  }
  // Before the commit, from the staged counts.
  const block_counts late = random_counts(999);
  ASSERT_TRUE(c->put_counts(77, std::nullopt, geo, late).ok());
  EXPECT_EQ(*c->masked_counts(77), masked_of(late, GetParam()));
}

TEST_P(SignatureCacheHandoff, CommittedCountsAreReadBeforeTheBackgroundWriterHasWrittenThem) {
  auto o = options();
  o.background_writes = true;
  o.memory_cache_bytes = 1;
  auto c = open("a", o);
  std::vector<block_counts> counts;
  for (block_hash h = 1; h <= 50; ++h) {
    counts.push_back(random_counts(h));
    ASSERT_TRUE(c->put_counts(h, std::nullopt, geo, counts.back()).ok());
    ASSERT_TRUE(c->commit().ok());
  }
  for (block_hash h = 1; h <= 50; ++h)
    EXPECT_EQ(*c->masked_counts(h), masked_of(counts[h - 1], GetParam())) << h;
  EXPECT_TRUE(c->flush().ok());
}

INSTANTIATE_TEST_SUITE_P(Masks, SignatureCacheHandoff,
                         ::testing::Values(std::vector<uint32_t>{1, 3}, std::vector<uint32_t>{}),
                         [](const auto& p) { return p.param.empty() ? "all" : "some"; });

struct SignatureCacheHandoffErrors : ::testing::Test {
  testing::temp_dir dir{"eldr-sigcache-handoff"};
  const std::vector<uint32_t> mask = {1, 3};

  std::unique_ptr<signature_cache> open(signature_cache_options o, const std::string& name = "db") {
    o.clock = [] { return int64_t{1000}; };
    auto c = signature_cache::open(dir.sub(name), std::move(o));
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return c.ok() ? std::move(*c) : nullptr;
  }
  signature_cache_options options() {
    signature_cache_options o;
    o.geometry = geo;
    o.layer_mask = mask;
    return o;
  }
};

TEST_F(SignatureCacheHandoffErrors, NoGeometryWrongSizesUnknownBlocksAndImplausibleCounts) {
  {
    auto c = open(signature_cache_options{}, "bare");  // no geometry until the first put_counts
    std::vector<uint32_t> any(2 * geo.experts, 0);
    EXPECT_EQ(c->masked_counts(1).error().code(), status_code::failed_precondition);
    EXPECT_EQ(c->put_masked_counts(1, std::nullopt, any).code(), status_code::failed_precondition);
  }
  auto c = open(options());
  const size_t width = mask.size() * geo.experts;
  auto good = masked_of(random_counts(5), mask);
  ASSERT_EQ(good.size(), width);

  EXPECT_EQ(c->masked_counts(42).error().code(), status_code::not_found);  // unknown
  c->store_blocks({c->worker_id("w"), 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{43});
  EXPECT_EQ(c->masked_counts(43).error().code(), status_code::not_found);  // no counts

  std::vector<uint32_t> longer = good;
  longer.push_back(0);
  EXPECT_EQ(c->put_masked_counts(1, std::nullopt, longer).code(), status_code::invalid_argument);
  EXPECT_EQ(c->put_masked_counts(1, std::nullopt, std::span(good).first(width - 1)).code(),
            status_code::invalid_argument);
  EXPECT_EQ(c->put_masked_counts(1, std::nullopt, masked_of(random_counts(5), {})).code(),
            status_code::invalid_argument);  // all layers into a masked cache
  EXPECT_EQ(c->stats().refused_counts_geometry, 3u);

  auto refused = [&](std::vector<uint32_t> v) {
    EXPECT_EQ(c->put_masked_counts(2, std::nullopt, v).code(), status_code::invalid_argument);
  };
  refused(std::vector<uint32_t>(width, 0));  // no tokens
  {
    auto v = good;  // the second layer sums to two more than the first
    v[geo.experts] += 2;
    refused(v);
  }
  {
    std::vector<uint32_t> v(width, 0);  // odd sum: not tokens * top_k
    v[0] = 1;
    v[geo.experts] = 1;
    refused(v);
  }
  {
    std::vector<uint32_t> v(width, 0);  // 8 tokens with one expert chosen 16 times a layer
    v[0] = 16;
    v[geo.experts] = 16;
    refused(v);
  }
  {
    std::vector<uint32_t> v(width, 0);  // a count that does not fit a block's 255 tokens
    v[0] = 256 + 2;
    v[1] = 256 - 2;
    v[geo.experts] = 256 + 2;
    v[geo.experts + 1] = 256 - 2;
    refused(v);
  }
  EXPECT_FALSE(c->block(1).ok());
  EXPECT_FALSE(c->block(2).ok());
  EXPECT_EQ(c->stats().blocks_with_counts, 0u);

  // A held block without counts gets them and its parent; the first counts win.
  ASSERT_TRUE(c->put_masked_counts(43, block_hash{41}, good).ok());
  EXPECT_EQ(*c->masked_counts(43), good);
  EXPECT_EQ(c->block(43)->parent, block_hash{41});
  EXPECT_EQ(c->block(43)->holders.size(), 1u);
  ASSERT_TRUE(c->put_masked_counts(43, std::nullopt, masked_of(random_counts(6), mask)).ok());
  EXPECT_EQ(*c->masked_counts(43), good);
}

TEST_F(SignatureCacheHandoffErrors, MaxBlocksIsRespected) {
  auto o = options();
  o.max_blocks = 3;
  auto c = open(o);
  c->store_blocks({c->worker_id("w"), 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{1});
  for (block_hash h = 2; h <= 5; ++h)
    EXPECT_TRUE(c->put_masked_counts(h, std::nullopt, masked_of(random_counts(h), mask)).ok());
  EXPECT_EQ(c->stats().blocks, 3u);
  EXPECT_EQ(c->stats().refused_capacity, 2u);
  EXPECT_EQ(c->masked_counts(4).error().code(), status_code::not_found);
  EXPECT_EQ(c->masked_counts(5).error().code(), status_code::not_found);
  // A block already stored still takes counts at capacity.
  const auto one = masked_of(random_counts(1), mask);
  ASSERT_TRUE(c->put_masked_counts(1, std::nullopt, one).ok());
  EXPECT_EQ(*c->masked_counts(1), one);
  EXPECT_EQ(c->stats().blocks_with_counts, 3u);
}

}  // namespace
}  // namespace eldr
