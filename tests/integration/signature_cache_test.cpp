// signature_cache on a real RocksDB in a temporary directory: holders with reference counts,
// eviction (remove, clear, grace), prefix sums equal to a full recompute, warm reopen, mask
// changes, bounds, centroid history.
#include "storage/signature_cache.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/support/signature_cache_fixture.hpp"

namespace eldr {
namespace {

const model_geometry geo{4, 16, 2};

// Counts of a block of 8 tokens whose experts depend on a seed (two experts per layer).
block_counts counts_for(uint64_t seed) {
  std::vector<uint32_t> off = {0};
  std::vector<expert_id> ids;
  std::vector<uint8_t> cnt;
  for (uint32_t l = 0; l < geo.layers; ++l) {
    auto a = static_cast<expert_id>((seed + l) % geo.experts);
    auto b = static_cast<expert_id>((seed * 7 + 3 * l + 1) % geo.experts);
    if (a == b) b = static_cast<expert_id>((b + 1) % geo.experts);
    if (a > b) std::swap(a, b);
    ids.insert(ids.end(), {a, b});
    cnt.insert(cnt.end(), {8, 8});
    off.push_back(static_cast<uint32_t>(ids.size()));
  }
  auto c = block_counts::from_parts(geo, 8, off, ids, cnt);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

struct SignatureCache : testing::signature_cache_fixture {
  SignatureCache() : signature_cache_fixture("eldr-sigcache", geo) {}

  // The fixture's defaults, masked to layers 1 and 3.
  signature_cache_options options() {
    signature_cache_options o = signature_cache_fixture::options();
    o.layer_mask = {1, 3};
    return o;
  }
  // Dense masked sum computed directly from counts_for.
  std::vector<uint32_t> expected_sum(std::span<const uint64_t> seeds,
                                     const std::vector<uint32_t>& mask) {
    std::vector<uint32_t> dense(geo.width(), 0), out;
    for (uint64_t s : seeds)
      counts_for(s).add_to(geo, dense);
    for (uint32_t l : mask)
      out.insert(out.end(), dense.begin() + l * geo.experts, dense.begin() + (l + 1) * geo.experts);
    return out;
  }
};

TEST_F(SignatureCache, HoldersAreReferenceCountedAndTheLastRemovalDeletes) {
  auto c = open(options());
  const uint32_t w = c->worker_id("tcp://a:1");
  const holder_key gpu{w, 0, 0, "GPU"};
  const holder_key cpu{w, 0, 0, "CPU"};
  const std::vector<block_hash> hs = {10, 11, 12};
  c->store_blocks(gpu, std::nullopt, hs);
  c->store_blocks(gpu, std::nullopt, std::vector<block_hash>{11});  // a second physical copy
  c->store_blocks(cpu, std::nullopt, std::vector<block_hash>{12});
  ASSERT_TRUE(c->commit().ok());
  EXPECT_EQ(c->block(11)->holders[0].refs, 2u);
  EXPECT_EQ(*c->block(11)->parent, 10u);
  EXPECT_EQ(*c->block(12)->parent, 11u);
  EXPECT_FALSE(c->block(10)->parent);

  c->remove_blocks(gpu, hs);
  EXPECT_FALSE(c->block(10).ok());
  ASSERT_TRUE(c->block(11).ok());
  EXPECT_EQ(c->block(11)->holders[0].refs, 1u);
  ASSERT_TRUE(c->block(12).ok());  // the CPU copy holds it
  c->remove_blocks(gpu, std::vector<block_hash>{11, 99});
  EXPECT_FALSE(c->block(11).ok());
  EXPECT_EQ(c->stats().removed_unknown, 1u);
  c->remove_blocks(cpu, std::vector<block_hash>{12});
  EXPECT_EQ(c->stats().blocks, 0u);
  EXPECT_EQ(c->stats().holders, 0u);
}

TEST_F(SignatureCache, PrefixSumEqualsTheSumOfItsBlocksWarmAndCold) {
  std::vector<block_hash> hs(64);
  std::vector<uint64_t> seeds(64);
  std::iota(seeds.begin(), seeds.end(), 100);
  for (size_t i = 0; i < hs.size(); ++i)
    hs[i] = 0xfff0000000000000ULL + i;
  {
    auto c = open(options());
    const holder_key who{c->worker_id("w"), -1, -1, "GPU"};
    c->store_blocks(who, std::nullopt, hs);
    for (size_t i = 0; i < hs.size(); ++i)
      ASSERT_TRUE(c->put_counts(hs[i], i ? std::optional(hs[i - 1]) : std::nullopt, geo,
                                counts_for(seeds[i]))
                      .ok());
    ASSERT_TRUE(c->commit().ok());
    std::vector<uint32_t> sum(2 * geo.experts, 0);
    auto info = c->sum_prefix(hs, sum);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->with_counts, 64u);
    EXPECT_EQ(info->disk_reads, 0u);
    EXPECT_EQ(sum, expected_sum(seeds, {1, 3}));
  }
  // Warm restart: the same signatures, read from RocksDB once, then from memory.
  auto c = open(options());
  EXPECT_EQ(c->stats().blocks, 64u);
  EXPECT_EQ(c->stats().blocks_with_counts, 64u);
  std::vector<uint32_t> sum(2 * geo.experts, 0);
  auto cold = c->sum_prefix(hs, sum);
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(cold->disk_reads, 64u);
  EXPECT_EQ(sum, expected_sum(seeds, {1, 3}));
  std::fill(sum.begin(), sum.end(), 0);
  auto warm = c->sum_prefix(std::span(hs).first(10), sum);
  EXPECT_EQ(warm->disk_reads, 0u);
  EXPECT_EQ(sum, expected_sum(std::span(seeds).first(10), {1, 3}));

  // A builder with a sub-mask gets the same signature as one built from the blocks directly.
  auto spec = signature_spec::make(geo, signature_transform::count, {3}, {});
  ASSERT_TRUE(spec.ok());
  auto sp = std::make_shared<const signature_spec>(*spec);
  signature_builder from_cache(sp), direct(sp);
  ASSERT_TRUE(c->add_prefix(hs, from_cache).ok());
  for (uint64_t s : seeds)
    ASSERT_TRUE(direct.add(counts_for(s)).ok());
  signature a, b;
  from_cache.finish(a);
  direct.finish(b);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.value, b.value);

  // A missing block is reported, the rest still summed.
  std::vector<block_hash> gap = {hs[0], 12345, hs[1]};
  std::fill(sum.begin(), sum.end(), 0);
  auto g = c->sum_prefix(gap, sum);
  EXPECT_EQ(g->with_counts, 2u);
  EXPECT_EQ(g->first_missing, 1u);
}

TEST_F(SignatureCache, WarmReopenKeepsHoldersParentsSequencesAndCentroids) {
  {
    auto c = open(options());
    const uint32_t w = c->worker_id("tcp://a:1");
    c->store_blocks({w, 1, 0, "GPU"}, 7, std::vector<block_hash>{8, 9});
    c->note_sequence(w, 41);
    ASSERT_TRUE(c->commit().ok());
    const std::vector<uint8_t> set1 = {1, 2, 3}, set2 = {4, 5};
    ASSERT_TRUE(c->put_centroid_set(1, set1).ok());
    ASSERT_TRUE(c->put_centroid_set(2, set2).ok());
    // Staged but never committed: must not survive.
    c->store_blocks({w, 1, 0, "GPU"}, std::nullopt, std::vector<block_hash>{77});
  }
  auto c = open(options());
  ASSERT_EQ(c->worker_names().size(), 1u);
  EXPECT_EQ(c->worker_id("tcp://a:1"), 0u);
  EXPECT_EQ(c->worker_id("tcp://b:1"), 1u);
  EXPECT_EQ(*c->last_sequence(0), 41u);
  EXPECT_FALSE(c->last_sequence(1));
  auto b = c->block(9);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->parent, 8u);
  EXPECT_EQ(b->holders[0].key, (holder_key{0, 1, 0, "GPU"}));
  EXPECT_FALSE(c->block(77).ok());
  EXPECT_EQ(*c->current_epoch(), 2u);
  EXPECT_EQ(c->centroid_epochs(), (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(c->rollback_to(1).ok());
  EXPECT_EQ(*c->centroid_set(1), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(c->rollback_to(5).ok());
  c.reset();
  c = open(options());
  EXPECT_EQ(*c->current_epoch(), 1u);
}

TEST_F(SignatureCache, ClearWorkerDropsOnlyItsHolders) {
  auto c = open(options());
  const uint32_t a = c->worker_id("a"), b = c->worker_id("b");
  c->store_blocks({a, 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{1, 2, 3});
  c->store_blocks({b, 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{3});
  c->note_sequence(a, 5);
  c->clear_worker(a, true);
  ASSERT_TRUE(c->commit().ok());
  EXPECT_FALSE(c->block(1).ok());
  EXPECT_FALSE(c->block(2).ok());
  ASSERT_TRUE(c->block(3).ok());
  EXPECT_EQ(c->block(3)->holders.size(), 1u);
  EXPECT_FALSE(c->last_sequence(a));
}

TEST_F(SignatureCache, GracePeriodsExpireOrphansOnTheInjectedClock) {
  auto o = options();
  o.orphan_counts_grace_ms = 100;
  o.uncounted_block_grace_ms = 500;
  auto c = open(o);
  const holder_key who{c->worker_id("a"), 0, 0, "GPU"};
  ASSERT_TRUE(c->put_counts(1, std::nullopt, geo, counts_for(1)).ok());  // counts, no holder
  ASSERT_TRUE(c->put_counts(2, std::nullopt, geo, counts_for(2)).ok());
  c->store_blocks(who, std::nullopt, std::vector<block_hash>{2, 3});  // 3: held, no counts
  now += 99;
  EXPECT_EQ(c->expire(), 0u);
  now += 1;
  EXPECT_EQ(c->expire(), 1u);
  EXPECT_FALSE(c->block(1).ok());
  EXPECT_TRUE(c->block(2).ok());
  now += 400;
  EXPECT_EQ(c->expire(), 1u);
  EXPECT_FALSE(c->block(3).ok());
  ASSERT_TRUE(c->commit().ok());
  EXPECT_EQ(c->stats().expired_orphan_counts, 1u);
  EXPECT_EQ(c->stats().expired_uncounted, 1u);
  EXPECT_EQ(c->stats().blocks, 1u);
}

TEST_F(SignatureCache, GeometryAndMaskAreFixedPerDatabase) {
  {
    auto c = open(options());
    ASSERT_TRUE(c->put_counts(1, std::nullopt, geo, counts_for(1)).ok());
    EXPECT_FALSE(c->put_counts(2, std::nullopt, model_geometry{4, 32, 2}, counts_for(2)).ok());
    EXPECT_EQ(c->stats().refused_counts_geometry, 1u);
    c->store_blocks({c->worker_id("a"), 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{1});
    ASSERT_TRUE(c->commit().ok());
  }
  auto other = options();
  other.geometry = {4, 8, 2};
  EXPECT_FALSE(signature_cache::open(dir.sub("db"), other).ok());
  auto remask = options();
  remask.layer_mask = {0};
  EXPECT_FALSE(signature_cache::open(dir.sub("db"), remask).ok());
  remask.reset_counts_on_mask_change = true;
  auto c = open(remask);
  EXPECT_EQ(c->layer_mask(), (std::vector<uint32_t>{0}));
  ASSERT_TRUE(c->block(1).ok());
  EXPECT_FALSE(c->block(1)->has_counts);  // counts dropped, holder kept
  c.reset();
  auto any = options();
  any.geometry = {};
  any.layer_mask = {};
  c = open(any);  // geometry and mask come from the database
  EXPECT_EQ(c->geometry(), geo);
  EXPECT_EQ(c->layer_mask(), (std::vector<uint32_t>{0}));
}

TEST_F(SignatureCache, MemoryStaysBoundedUnderHostileSequences) {
  auto o = options();
  o.max_blocks = 100;
  o.max_holders_per_block = 3;
  auto c = open(o);
  std::vector<block_hash> many(1000);
  std::iota(many.begin(), many.end(), 1);
  c->store_blocks({c->worker_id("a"), 0, 0, "GPU"}, std::nullopt, many);
  for (uint32_t w = 0; w < 10; ++w)
    c->store_blocks({w, 0, 0, "GPU"}, std::nullopt, std::vector<block_hash>{1});
  ASSERT_TRUE(c->commit().ok());
  EXPECT_EQ(c->stats().blocks, 100u);
  EXPECT_EQ(c->stats().refused_capacity, 900u);
  EXPECT_EQ(c->block(1)->holders.size(), 3u);
  EXPECT_GT(c->stats().refused_holders, 0u);
}

TEST_F(SignatureCache, ChangesBetweenCommitsAreCoalescedToTheFinalState) {
  auto o = options();
  o.memory_cache_bytes = 1;  // nothing fits in the LRU: counts come from staging or RocksDB
  o.prefix_memo_bytes = 0;
  {
    auto c = open(o);
    const holder_key who{c->worker_id("a"), 0, 0, "GPU"};
    c->store_blocks(who, std::nullopt, std::vector<block_hash>{1});
    ASSERT_TRUE(c->put_counts(1, std::nullopt, geo, counts_for(1)).ok());
    std::vector<uint32_t> sum(2 * geo.experts, 0);
    const std::vector<block_hash> one = {1};
    EXPECT_EQ(c->sum_prefix(one, sum)->with_counts, 1u);  // staged, not yet committed
    ASSERT_TRUE(c->commit().ok());
    std::fill(sum.begin(), sum.end(), 0);
    auto info = c->sum_prefix(one, sum);
    EXPECT_EQ(info->disk_reads, 1u);
    EXPECT_EQ(sum, expected_sum(std::vector<uint64_t>{1}, {1, 3}));

    // Within one commit: 1 goes and comes back without counts; 2 is born and gone.
    c->remove_blocks(who, one);
    c->store_blocks(who, std::nullopt, one);
    c->store_blocks(who, std::nullopt, std::vector<block_hash>{2});
    c->remove_blocks(who, std::vector<block_hash>{2});
    ASSERT_TRUE(c->commit().ok());
  }
  auto c = open(o);
  ASSERT_TRUE(c->block(1).ok());
  EXPECT_FALSE(c->block(1)->has_counts);
  EXPECT_FALSE(c->block(2).ok());
  EXPECT_EQ(c->stats().blocks, 1u);
  std::vector<uint32_t> sum(2 * geo.experts, 0);
  EXPECT_EQ(c->sum_prefix(std::vector<block_hash>{1}, sum)->with_counts, 0u);
}

TEST_F(SignatureCache, RememberedPrefixSumsServeLaterLookupsExactly) {
  auto c = open(options());
  const holder_key who{c->worker_id("a"), 0, 0, "GPU"};
  std::vector<block_hash> hs(64);
  std::vector<uint64_t> seeds(64);
  std::iota(hs.begin(), hs.end(), 1000);
  std::iota(seeds.begin(), seeds.end(), 7);
  c->store_blocks(who, std::nullopt, hs);
  for (size_t i = 0; i < hs.size(); ++i)
    ASSERT_TRUE(c->put_counts(hs[i], std::nullopt, geo, counts_for(seeds[i])).ok());
  ASSERT_TRUE(c->commit().ok());
  auto sum_of = [&](size_t n, uint32_t want_memo) {
    std::vector<uint32_t> sum(2 * geo.experts, 0);
    auto info = c->sum_prefix(std::span(hs).first(n), sum);
    EXPECT_TRUE(info.ok());
    EXPECT_EQ(info->memo_blocks, want_memo) << n;
    EXPECT_EQ(info->with_counts, n);
    EXPECT_EQ(sum, expected_sum(std::span(seeds).first(n), {1, 3})) << n;
  };
  sum_of(64, 0);   // remembers 16, 32, 48 and 64
  sum_of(64, 64);  // one remembered sum
  sum_of(40, 32);  // the stride boundary below 40, plus 8 blocks
  sum_of(50, 48);
  // The last block goes: its remembered sum with it; the boundary at 48 still serves.
  c->remove_blocks(who, std::span(hs).subspan(63, 1));
  std::vector<uint32_t> sum(2 * geo.experts, 0);
  auto info = c->sum_prefix(hs, sum);
  EXPECT_EQ(info->memo_blocks, 48u);
  EXPECT_EQ(info->with_counts, 63u);
  EXPECT_EQ(info->first_missing, 63u);
  EXPECT_EQ(sum, expected_sum(std::span(seeds).first(63), {1, 3}));
}

// A cluster shard sums subsets of prompts, and different routers ask it for different subsets:
// two lists of the same length ending in the same block must not share a remembered sum.
TEST_F(SignatureCache, RememberedSumsServeOnlyTheListTheySummed) {
  auto o = options();
  o.prefix_memo_stride = 2;
  auto c = open(o);
  const holder_key who{c->worker_id("a"), 0, 0, "GPU"};
  const std::vector<block_hash> hs = {1, 2, 3, 4};
  const std::vector<uint64_t> seeds = {11, 22, 33, 44};
  c->store_blocks(who, std::nullopt, hs);
  for (size_t i = 0; i < hs.size(); ++i)
    ASSERT_TRUE(c->put_counts(hs[i], std::nullopt, geo, counts_for(seeds[i])).ok());
  ASSERT_TRUE(c->commit().ok());
  auto sum_of = [&](const std::vector<size_t>& pick, uint32_t want_memo) {
    std::vector<block_hash> list;
    std::vector<uint64_t> picked;
    for (size_t i : pick) {
      list.push_back(hs[i]);
      picked.push_back(seeds[i]);
    }
    std::vector<uint32_t> sum(2 * geo.experts, 0);
    auto info = c->sum_prefix(list, sum);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->memo_blocks, want_memo);
    EXPECT_EQ(sum, expected_sum(picked, {1, 3}));
  };
  sum_of({0, 3}, 0);     // remembers [1, 4] under block 4
  sum_of({1, 3}, 0);     // same last block, same length, another list: summed afresh
  sum_of({0, 3}, 2);     // the first list still has its sum
  sum_of({2, 1, 3}, 0);  // a list whose length-2 prefix [3, 2] was never summed
}

}  // namespace
}  // namespace eldr

namespace eldr {
namespace {

// Background writes: commit() returns before RocksDB has written, batches land in commit order,
// flush() waits for them, and a reopen sees everything flushed -- including the centroid history,
// which put_centroid_set flushes itself.
TEST_F(SignatureCache, BackgroundWritesLandInOrderAndFlushMakesThemDurable) {
  {
    auto o = options();
    o.background_writes = true;
    auto c = open(std::move(o));
    const holder_key who{c->worker_id("tcp://a:1"), 0, 0, "GPU"};
    std::optional<block_hash> parent;
    for (uint64_t h = 1; h <= 200; ++h) {
      c->store_blocks(who, parent, std::vector<block_hash>{h});
      ASSERT_TRUE(c->put_counts(h, parent, geo, counts_for(h)).ok());
      parent = h;
      if (h % 10 == 0) {
        ASSERT_TRUE(c->commit().ok());
      }
    }
    // Removing a block after its store was committed: the later batch must win on disk.
    c->remove_blocks(who, std::vector<block_hash>{7});
    ASSERT_TRUE(c->commit().ok());
    ASSERT_TRUE(c->put_centroid_set(3, std::vector<uint8_t>{1, 2, 3}).ok());
    EXPECT_EQ(*c->centroid_set(3), (std::vector<uint8_t>{1, 2, 3}));
    ASSERT_TRUE(c->flush().ok());
    EXPECT_GE(c->stats().commits, 21u);
  }
  auto c = open(options());
  EXPECT_EQ(c->stats().blocks, 199u);
  EXPECT_FALSE(c->block(7).ok());
  ASSERT_TRUE(c->block(200).ok());
  EXPECT_TRUE(c->block(200)->has_counts);
  std::vector<block_hash> chain = {1, 2, 3};
  std::vector<uint32_t> sum(c->layer_mask().size() * geo.experts, 0);
  auto info = c->sum_prefix(chain, sum);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->with_counts, 3u);
  const std::vector<uint64_t> seeds = {1, 2, 3};
  EXPECT_EQ(sum, expected_sum(seeds, c->layer_mask()));
  EXPECT_EQ(*c->current_epoch(), 3u);
}

}  // namespace
}  // namespace eldr
