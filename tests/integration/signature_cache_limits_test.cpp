// signature_cache's bounds on a real RocksDB (issue 12, defects 3 and 14): the per-publisher
// share of max_blocks, the uncounted-block grace on the injected clock, expiry bounded per call,
// and removals that omit the group (or medium) of the copy they release.
#include <gtest/gtest.h>

#include <numeric>

#include "storage/signature_cache.hpp"
#include "tests/support/signature_cache_fixture.hpp"

namespace eldr {
namespace {

const model_geometry geo{2, 8, 2};

block_counts some_counts() {
  std::vector<expert_id> ids;
  for (int t = 0; t < 4; ++t)
    for (int l = 0; l < 2; ++l)
      ids.insert(ids.end(), {1, 2});
  return *block_counts::from_tokens(geo, ids, 0, 4);
}

std::vector<block_hash> range(block_hash first, size_t n) {
  std::vector<block_hash> out(n);
  std::iota(out.begin(), out.end(), first);
  return out;
}

struct SignatureCacheLimits : testing::signature_cache_fixture {
  SignatureCacheLimits() : signature_cache_fixture("eldr-sigcache-limits", geo) {}
};

// One publisher at its share is refused (counted for it alone); another publisher's blocks, and
// the first one's own further copies of blocks it holds, still go in. The share holds after a
// reopen (holders are persisted) and frees up as the publisher's blocks go.
TEST_F(SignatureCacheLimits, APublisherAtItsShareDoesNotBlockAnother) {
  auto o = options();
  o.max_blocks = 100;
  o.max_blocks_per_publisher = 10;
  auto c = open(o);
  const uint32_t a = c->worker_id("tcp://a:1"), b = c->worker_id("tcp://b:1");
  const holder_key ga{a, 0, 0, "GPU"}, ca{a, 0, 0, "CPU"}, gb{b, 0, 0, "GPU"};
  c->store_blocks(ga, std::nullopt, range(1, 50));  // a hostile flood: 40 over the share
  EXPECT_EQ(c->usage(a).blocks, 10u);
  EXPECT_EQ(c->usage(a).refused_quota, 40u);
  EXPECT_EQ(c->stats().blocks, 10u);
  EXPECT_EQ(c->stats().refused_quota, 40u);
  EXPECT_EQ(c->stats().refused_capacity, 0u);
  EXPECT_FALSE(c->block(11).ok());  // a refused holding leaves no block behind

  c->store_blocks(gb, std::nullopt, range(1000, 10));  // b is not affected
  EXPECT_EQ(c->usage(b).blocks, 10u);
  EXPECT_EQ(c->usage(b).refused_quota, 0u);
  // b holding a's blocks too counts for b only; a's second copy (another medium) of a block it
  // holds is no new holding.
  c->store_blocks(gb, std::nullopt, range(1, 1));
  EXPECT_EQ(c->usage(b).refused_quota, 1u);  // b is at 10 too now
  c->store_blocks(ca, std::nullopt, range(1, 5));
  EXPECT_EQ(c->usage(a).blocks, 10u);
  EXPECT_EQ(c->usage(a).refused_quota, 40u);
  EXPECT_EQ(c->block(3)->holders.size(), 2u);
  ASSERT_TRUE(c->commit().ok());

  // Across a restart: the usage is rebuilt from the persisted holders.
  c.reset();
  c = open(o);
  EXPECT_EQ(c->usage(a).blocks, 10u);
  EXPECT_EQ(c->usage(b).blocks, 10u);
  c->store_blocks(ga, std::nullopt, range(60, 1));
  EXPECT_EQ(c->usage(a).refused_quota, 1u);
  EXPECT_FALSE(c->block(60).ok());

  // Removing a's copies frees its share once both copies of a block (GPU and CPU) are gone.
  c->remove_blocks(ga, range(1, 1));
  EXPECT_EQ(c->usage(a).blocks, 10u);
  c->remove_blocks(ca, range(1, 1));
  EXPECT_EQ(c->usage(a).blocks, 9u);
  EXPECT_FALSE(c->block(1).ok());  // b was refused a copy of it at its share
  c->remove_blocks(ga, range(6, 1));
  EXPECT_EQ(c->usage(a).blocks, 8u);
  EXPECT_FALSE(c->block(6).ok());
  c->store_blocks(ga, std::nullopt, range(60, 3));
  EXPECT_EQ(c->usage(a).blocks, 10u);
  EXPECT_TRUE(c->block(61).ok());
  EXPECT_FALSE(c->block(62).ok());
  c->clear_worker(a, false);
  EXPECT_EQ(c->usage(a).blocks, 0u);
  EXPECT_EQ(c->usage(b).blocks, 10u);
}

// A held block that never gets counts goes when its grace ends (it adds nothing to any
// signature); one that got counts stays; the publisher's share is freed with it.
TEST_F(SignatureCacheLimits, HeldBlocksWithoutCountsExpireAfterTheGrace) {
  auto o = options();
  o.uncounted_block_grace_ms = 60'000;
  o.max_blocks_per_publisher = 4;
  auto c = open(o);
  const uint32_t a = c->worker_id("tcp://a:1");
  const holder_key ga{a, 0, -1, "GPU"};
  c->store_blocks(ga, std::nullopt, range(1, 4));
  ASSERT_TRUE(c->put_counts(2, 1, geo, some_counts()).ok());
  now += 59'999;
  EXPECT_EQ(c->expire(), 0u);
  EXPECT_EQ(c->usage(a).blocks, 4u);
  now += 1;
  EXPECT_EQ(c->expire(), 3u);
  EXPECT_EQ(c->stats().expired_uncounted, 3u);
  EXPECT_TRUE(c->block(2).ok());
  EXPECT_FALSE(c->block(1).ok());
  EXPECT_EQ(c->usage(a).blocks, 1u);
  c->store_blocks(ga, std::nullopt, range(10, 3));  // the share is free again
  EXPECT_EQ(c->usage(a).blocks, 4u);
  EXPECT_EQ(c->usage(a).refused_quota, 0u);
  ASSERT_TRUE(c->commit().ok());
  // The grace counts from the block's creation, also across a reopen.
  c.reset();
  c = open(o);
  now += 60'000;
  EXPECT_EQ(c->expire(), 3u);
  EXPECT_EQ(c->stats().blocks, 1u);
}

// expire(n) examines at most n due deadlines per call: a backlog is spread over calls.
TEST_F(SignatureCacheLimits, ExpiryIsBoundedPerCall) {
  auto o = options();
  o.uncounted_block_grace_ms = 1000;
  auto c = open(o);
  const holder_key w{c->worker_id("tcp://a:1"), 0, -1, "GPU"};
  c->store_blocks(w, std::nullopt, range(1, 10'000));
  EXPECT_FALSE(c->expire_pending());
  now += 1000;
  EXPECT_TRUE(c->expire_pending());
  size_t calls = 0, gone = 0;
  while (c->expire_pending()) {
    const size_t n = c->expire(4096);
    EXPECT_LE(n, 4096u);
    gone += n;
    ++calls;
  }
  EXPECT_EQ(gone, 10'000u);
  EXPECT_EQ(calls, 3u);
  EXPECT_EQ(c->stats().blocks, 0u);
}

// Defect 14: a BlockRemoved without group (SGLang, vLLM's offloading connectors, several vLLM
// versions) releases the copy stored with group_idx 0 or nil; with copies of several groups, the
// default group's first, then the lowest group's. Without medium too, any medium matches.
TEST_F(SignatureCacheLimits, ARemovalWithoutGroupReleasesTheDefaultGroupsCopy) {
  auto c = open(options());
  const uint32_t a = c->worker_id("tcp://a:1");
  const holder_key g0{a, 0, 0, "GPU"}, gnil{a, 0, -1, "GPU"}, g1{a, 0, 1, "GPU"},
      g2{a, 0, 2, "GPU"};
  const holder_key no_group{a, 0, -1, "GPU"}, nothing{a, 0, -1, ""};

  c->store_blocks(g0, std::nullopt, range(1, 1));
  c->remove_blocks(no_group, range(1, 1));
  EXPECT_FALSE(c->block(1).ok()) << "the group-0 copy stays held for ever";
  EXPECT_EQ(c->stats().removed_unknown, 0u);

  c->store_blocks(g0, std::nullopt, range(2, 1));
  c->remove_blocks(nothing, range(2, 1));  // SGLang's radix cache: hashes only
  EXPECT_FALSE(c->block(2).ok());

  // Several groups: nil first (exact), then 0, then the lowest other group.
  c->store_blocks(g2, std::nullopt, range(3, 1));
  c->store_blocks(g1, std::nullopt, range(3, 1));
  c->store_blocks(g0, std::nullopt, range(3, 1));
  c->store_blocks(gnil, std::nullopt, range(3, 1));
  auto groups = [&] {
    std::vector<int32_t> out;
    const auto b = c->block(3);
    for (const holder& h : b->holders)
      out.push_back(h.key.group);
    std::sort(out.begin(), out.end());
    return out;
  };
  c->remove_blocks(no_group, range(3, 1));
  EXPECT_EQ(groups(), (std::vector<int32_t>{0, 1, 2}));
  c->remove_blocks(no_group, range(3, 1));
  EXPECT_EQ(groups(), (std::vector<int32_t>{1, 2}));
  c->remove_blocks(no_group, range(3, 1));
  EXPECT_EQ(groups(), (std::vector<int32_t>{2}));
  c->remove_blocks(no_group, range(3, 1));
  EXPECT_FALSE(c->block(3).ok());

  // A removal naming group 0 releases a copy stored without group (0 and nil are one group);
  // a removal of another group, medium or worker still releases nothing.
  c->store_blocks(gnil, std::nullopt, range(4, 1));
  c->remove_blocks(g1, range(4, 1));
  c->remove_blocks(holder_key{a, 0, -1, "CPU"}, range(4, 1));
  c->remove_blocks(holder_key{a + 1, 0, -1, "GPU"}, range(4, 1));
  c->remove_blocks(holder_key{a, 1, -1, "GPU"}, range(4, 1));
  EXPECT_TRUE(c->block(4).ok());
  EXPECT_EQ(c->stats().removed_unknown, 4u);
  c->remove_blocks(g0, range(4, 1));
  EXPECT_FALSE(c->block(4).ok());
  EXPECT_EQ(c->usage(a).blocks, 0u);
}

}  // namespace
}  // namespace eldr
