// ingest's bounds on a real RocksDB (issue 12, defects 3 and 14): removals without group_idx
// (golden vLLM payloads and SGLang-shaped ones) release the default group's copy; large batches
// are applied in slices while later messages wait in order; oversized batches, a full backlog
// and a publisher over its share are refused loudly, per publisher.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "cluster/ingest/ingest.hpp"
#include "core/base/msgpack.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

namespace fs = std::filesystem;
using bytes = std::vector<uint8_t>;

fs::path vectors_dir() {
  if (const char* env = std::getenv("ELDR_KV_VECTORS")) return env;
  return fs::path(ELDR_SOURCE_DIR) / ".." / "shared" / "reference" / "vllm-kv-vectors";
}

bytes golden(const std::string& name) {
  std::ifstream in(vectors_dir() / name, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bytes seq8(uint64_t s) {
  bytes b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(s >> (56 - 8 * i));
  return b;
}

// One handmade event in map form; nullopt fields are left out, as SGLang and vLLM's offloading
// connectors leave group_idx (and SGLang's radix cache the medium) out of BlockRemoved.
struct event {
  event(std::string t, std::vector<uint64_t> h, std::optional<std::string> m = "GPU",
        std::optional<int64_t> g = std::nullopt)
      : type(std::move(t)), hashes(std::move(h)), medium(std::move(m)), group(g) {}
  std::string type;
  std::vector<uint64_t> hashes;
  std::optional<std::string> medium;
  std::optional<int64_t> group;
};

bytes batch(const std::vector<event>& events, int64_t dp = 0) {
  bytes out;
  msgpack::writer w(out);
  w.write_array_header(3);
  w.write_float64(1.0);
  w.write_array_header(static_cast<uint32_t>(events.size()));
  for (const event& e : events) {
    w.write_map_header(2 + (e.medium ? 1 : 0) + (e.group ? 1 : 0));
    w.write_str("type");
    w.write_str(e.type);
    w.write_str("block_hashes");
    w.write_array_header(static_cast<uint32_t>(e.hashes.size()));
    for (uint64_t h : e.hashes)
      w.write_uint(h);
    if (e.medium) {
      w.write_str("medium");
      w.write_str(*e.medium);
    }
    if (e.group) {
      w.write_str("group_idx");
      w.write_int(*e.group);
    }
  }
  w.write_int(dp);
  return out;
}

std::vector<uint64_t> range(uint64_t first, size_t n) {
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = first + i;
  return out;
}

struct IngestLimits : ::testing::Test {
  testing::temp_dir dir{"eldr-ingest-limits"};
  int64_t now = 0;
  std::unique_ptr<signature_cache> cache;

  void open(size_t per_publisher = 0) {
    cache.reset();
    signature_cache_options o;
    o.geometry = {2, 8, 2};
    o.max_blocks_per_publisher = per_publisher;
    o.clock = [this] { return now; };
    auto c = signature_cache::open(dir.sub("db"), o);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    cache = std::move(*c);
  }
  void SetUp() override { open(); }
  static void send(ingest& in, uint32_t p, uint64_t s, const bytes& payload) {
    const bytes topic, sq = seq8(s);
    const std::span<const uint8_t> frames[] = {topic, sq, payload};
    in.on_kv_message(p, frames);
  }
  bool has(uint64_t h) { return cache->block(h).ok(); }
  uint64_t dropped(const ingest& in, uint32_t p, drop_cause c) {
    return in.kv_metrics()[p].dropped[static_cast<size_t>(c)];
  }
};

// Defect 14 with vLLM's own payloads: a copy stored with group_idx 0 (golden g_stored_realistic)
// is released by a removal without group_idx, in both shapes upstream sends it (vLLM's
// offloading connector: hashes and medium; SGLang's radix cache: hashes only); the golden
// BlockRemoved (group_idx nil) releases copies stored with group_idx 0.
TEST_F(IngestLimits, RemovalsWithoutGroupReleaseTheDefaultGroupsCopy) {
  if (!fs::exists(vectors_dir() / "vectors.json"))
    GTEST_SKIP() << "golden vectors not found in " << vectors_dir();
  const uint64_t realistic = 15760518052499183552ull;  // vectors.json, g_stored_realistic
  const uint64_t d1 = 1234567890123456789ull, d2 = 18446744073709539271ull;  // d_removed
  for (const std::string version : {"pre42892", "latest"}) {
    SCOPED_TRACE(version);
    ingest in(*cache, {}, [this] { return now; });
    const uint32_t p = in.add_kv_publisher("tcp://vllm-" + version);
    uint64_t s = 0;
    send(in, p, s++, golden(version + "-g_stored_realistic.msgpack"));
    ASSERT_TRUE(has(realistic));
    ASSERT_EQ(cache->block(realistic)->holders[0].key.group, 0);
    send(in, p, s++, batch({{"BlockRemoved", {realistic}, "GPU", std::nullopt}}));
    EXPECT_FALSE(has(realistic)) << "the group-0 copy stays held for ever";

    send(in, p, s++, golden(version + "-g_stored_realistic.msgpack"));
    send(in, p, s++, batch({{"BlockRemoved", {realistic}, std::nullopt, std::nullopt}}));
    EXPECT_FALSE(has(realistic));

    send(in, p, s++, batch({{"BlockStored", {d1, d2}, "GPU", 0}}));
    send(in, p, s++, golden(version + "-d_removed.msgpack"));
    EXPECT_FALSE(has(d1));
    EXPECT_FALSE(has(d2));
    EXPECT_EQ(cache->stats().removed_unknown, 0u);
    ASSERT_TRUE(in.commit().ok());
  }
}

// Defect 3: a batch beyond hashes_per_turn is applied a slice per call; messages that arrive
// meanwhile (this publisher's and others') wait behind it and apply in order, each sequence
// noted only when its batch is complete.
TEST_F(IngestLimits, LargeBatchesApplyInSlicesAndLaterMessagesKeepTheirOrder) {
  ingest_limits work;
  work.hashes_per_turn = 1000;
  ingest in(
      *cache, {}, [this] { return now; }, work);
  const uint32_t a = in.add_kv_publisher("a"), b = in.add_kv_publisher("b");
  const uint32_t wa = cache->worker_id("a");
  send(in, a, 0, batch({{"BlockStored", range(1, 2500)}, {"BlockRemoved", range(1, 10)}}));
  EXPECT_EQ(in.hashes_applied(), 1000u);
  EXPECT_TRUE(in.pending());
  EXPECT_FALSE(cache->last_sequence(wa)) << "a sequence is noted once its batch is applied";
  EXPECT_EQ(cache->stats().blocks, 1000u);
  EXPECT_EQ(*cache->block(1000)->parent, 999u);

  // Behind the backlog: a's next batch removes blocks of the first; b stores one of them.
  send(in, a, 1, batch({{"BlockRemoved", range(2000, 500)}}));
  EXPECT_EQ(in.hashes_applied(), 2000u);  // each message applies one slice of the backlog
  EXPECT_FALSE(has(2001));                // not stored yet
  EXPECT_EQ(*cache->block(1001)->parent, 1000u) << "a slice continues the chain";
  send(in, b, 0, batch({{"BlockStored", {2400}}}));
  EXPECT_EQ(in.hashes_applied(), 3000u);
  EXPECT_EQ(*cache->last_sequence(wa), 0u);
  EXPECT_TRUE(has(2495));  // stored by batch 0, not yet removed by batch 1
  EXPECT_FALSE(has(2400)) << "a's second batch is half applied, b waits behind it";
  size_t turns = 0;
  while (in.pending()) {
    const uint64_t before = in.hashes_applied();
    in.resume();
    EXPECT_LE(in.hashes_applied() - before, 1000u);
    ++turns;
  }
  EXPECT_EQ(in.hashes_applied(), 2500u + 10 + 500 + 1);
  EXPECT_EQ(turns, 1u);
  EXPECT_FALSE(has(5));
  EXPECT_TRUE(has(11));
  EXPECT_FALSE(has(2001));  // stored by a's batch 0, removed by its batch 1
  ASSERT_TRUE(has(2400));   // b's copy, stored after a removed its own
  EXPECT_EQ(cache->block(2400)->holders.size(), 1u);
  EXPECT_EQ(*cache->last_sequence(wa), 1u);
  EXPECT_EQ(in.kv_metrics()[a].gaps, 0u);
  EXPECT_EQ(in.kv_metrics()[a].restarts, 0u);
  ASSERT_TRUE(in.commit().ok());
}

// A batch over max_batch_hashes is dropped whole (no event of it applied), counted as
// oversized, and its sequence still advances; one within the bound is applied.
TEST_F(IngestLimits, ABatchOverTheHashBoundIsDroppedWhole) {
  kv_decode_limits limits;
  limits.max_batch_hashes = 3000;
  limits.max_hashes = 2000;
  ingest in(*cache, limits, [this] { return now; });
  const uint32_t a = in.add_kv_publisher("a");
  send(in, a, 0, batch({{"BlockStored", range(1, 2000)}, {"BlockStored", range(5000, 1001)}}));
  EXPECT_EQ(cache->stats().blocks, 0u);
  EXPECT_EQ(dropped(in, a, drop_cause::oversized), 1u);
  EXPECT_EQ(*cache->last_sequence(cache->worker_id("a")), 0u);
  send(in, a, 1, batch({{"BlockStored", range(1, 2000)}, {"BlockStored", range(5000, 1000)}}));
  EXPECT_EQ(cache->stats().blocks, 3000u);
  EXPECT_EQ(in.kv_metrics()[a].gaps, 0u);
}

// Messages beyond max_backlog_bytes behind a backlog are dropped (capacity); the next one is a
// gap, which resynchronises the publisher: nothing is applied out of order.
TEST_F(IngestLimits, AFullBacklogDropsMessagesAndTheGapResynchronises) {
  ingest_limits work;
  work.hashes_per_turn = 100;
  work.max_backlog_bytes = 150;
  ingest in(
      *cache, {}, [this] { return now; }, work);
  const uint32_t a = in.add_kv_publisher("a");
  send(in, a, 0, batch({{"BlockStored", range(1, 1000)}}));
  send(in, a, 1, batch({{"BlockStored", {5000}}}));            // waits (small)
  send(in, a, 2, batch({{"BlockStored", range(6000, 100)}}));  // beyond the bound: dropped
  EXPECT_EQ(dropped(in, a, drop_cause::capacity), 1u);
  send(in, a, 3, batch({{"BlockStored", {7000}}}));
  while (in.pending())
    in.resume();
  EXPECT_EQ(in.kv_metrics()[a].gaps, 1u);
  EXPECT_EQ(in.kv_metrics()[a].gaps_unfilled, 1u);
  EXPECT_FALSE(has(1));  // resynchronised at the gap
  EXPECT_FALSE(has(6000));
  EXPECT_TRUE(has(7000));
}

// A publisher over its share of the cache is refused and counted under publisher_quota for it
// alone; another publisher's blocks still go in.
TEST_F(IngestLimits, APublisherOverItsShareIsCountedAndOthersGoOn) {
  open(/*per_publisher=*/100);
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t a = in.add_kv_publisher("a"), b = in.add_kv_publisher("b");
  send(in, a, 0, batch({{"BlockStored", range(1, 1000)}}));
  send(in, b, 0, batch({{"BlockStored", range(5000, 100)}}));
  EXPECT_EQ(dropped(in, a, drop_cause::publisher_quota), 900u);
  EXPECT_EQ(dropped(in, b, drop_cause::publisher_quota), 0u);
  EXPECT_EQ(cache->usage(cache->worker_id("a")).blocks, 100u);
  EXPECT_EQ(cache->usage(cache->worker_id("b")).blocks, 100u);
  EXPECT_TRUE(has(5099));
  EXPECT_NE(in.metrics_json().find("\"publisher_quota\":900"), std::string::npos)
      << in.metrics_json();
}

}  // namespace
}  // namespace eldr
