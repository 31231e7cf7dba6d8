// The ZeroMQ ingest against real publishers: /usr/bin/python3 processes emitting vLLM's frames
// (tests/integration/py/kv_publisher.py) on loopback ephemeral ports, into a real RocksDB. Both
// event encodings and all hash forms, several publishers at once, duplicate copies, removals,
// clears, a sequence restart, gaps with replay (both reply shapes) and without, counts messages
// of the right and the wrong geometry, junk frames.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "cluster/zmq/zmq_ingest.hpp"
#include "tests/support/kv_publisher.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const model_geometry geo{2, 8, 2};

class py_publisher : public testing::kv_publisher {
 public:
  using kv_publisher::kv_publisher;
  void send(uint64_t seq, json events, const std::string& form = "array",
            const std::string& hash_form = "u64", bool lose = false) {
    const json r = cmd({{"cmd", "send"},
                        {"seq", seq},
                        {"events", std::move(events)},
                        {"form", form},
                        {"hash_form", hash_form},
                        {"lose", lose}});
    EXPECT_EQ(r.value("ok", false), true) << r.dump();
  }
};

json stored(std::vector<uint64_t> hs, json parent = nullptr, const std::string& medium = "GPU") {
  return {{"type", "BlockStored"},
          {"hashes", hs},
          {"parent", parent},
          {"medium", medium},
          {"group", 0}};
}
json removed(std::vector<uint64_t> hs, const std::string& medium = "GPU") {
  return {{"type", "BlockRemoved"}, {"hashes", hs}, {"medium", medium}, {"group", 0}};
}
json cleared() {
  return {{"type", "AllBlocksCleared"}};
}

struct KvIngestZmq : ::testing::Test {
  testing::temp_dir dir{"eldr-zmq"};
  std::unique_ptr<signature_cache> cache;
  std::unique_ptr<zmq_ingest> in;

  void open(const zmq_ingest_options& o) {
    signature_cache_options co;
    co.geometry = geo;
    auto c = signature_cache::open(dir.sub("db"), co);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    cache = std::move(*c);
    auto z = zmq_ingest::create(*cache, o);
    ASSERT_TRUE(z.ok()) << z.error().to_string();
    in = std::move(*z);
  }
  // Polls the ingest until `done` holds; bounded, since the publisher is another process.
  bool until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = in->poll_once(20);
      if (!r.ok()) return false;
      if (done()) return true;
    }
    return false;
  }
  bool acked(uint32_t worker, uint64_t seq) {
    return until([&] { return cache->last_sequence(worker) == seq; });
  }
  bool has(uint64_t h) { return cache->block(h).ok(); }
};

TEST_F(KvIngestZmq, BothEncodingsSeveralPublishersCopiesRemovalsClears) {
  py_publisher a("new"), b("new");
  ASSERT_TRUE(a.ok() && b.ok());
  zmq_ingest_options o;
  o.kv_endpoints = {a.pub(), b.pub()};
  open(o);
  ASSERT_EQ(a.cmd({{"cmd", "wait_subscriber"}})["ok"], true);
  ASSERT_EQ(b.cmd({{"cmd", "wait_subscriber"}})["ok"], true);
  const uint64_t big = 18446744073709539271ULL;  // above INT64_MAX

  // a: array form, uint64 hashes.
  a.send(0, {stored({1, 2, big})});
  a.send(1, {stored({2})});  // a second physical copy
  a.send(2, {removed({2}), removed({1})});
  // b: map form, bin hashes, then int64 hashes, then a clear.
  b.send(0, {stored({big, 4}, 2)}, "map", "bin");
  b.send(1, {stored({5}, 4, "CPU")}, "map", "int64");
  b.send(2, {stored({6}), {{"type", "BlockMovedToMars"}}, removed({6})}, "map");
  ASSERT_TRUE(acked(0, 2) && acked(1, 2));

  EXPECT_FALSE(has(1));
  ASSERT_TRUE(has(2));
  EXPECT_EQ(cache->block(2)->holders[0].refs, 1u);  // two copies stored, one removed
  ASSERT_TRUE(has(big));
  EXPECT_EQ(cache->block(big)->holders.size(), 2u);
  EXPECT_EQ(*cache->block(4)->parent, big);  // chained within one BlockStored
  ASSERT_TRUE(has(5));
  EXPECT_EQ(cache->block(5)->holders[0].key.medium, "CPU");
  EXPECT_FALSE(has(6));
  EXPECT_EQ(
      in->logic().kv_metrics()[1].dropped[static_cast<size_t>(drop_cause::unknown_event_type)], 1u);

  b.send(3, {cleared()}, "map");
  ASSERT_TRUE(acked(1, 3));
  EXPECT_FALSE(has(4));
  EXPECT_FALSE(has(5));
  ASSERT_TRUE(has(big));
  EXPECT_EQ(cache->block(big)->holders.size(), 1u);  // a's copy stays
}

TEST_F(KvIngestZmq, GapsAreReplayedInBothShapesOrResynchronisedAndRestartsDropBlocks) {
  py_publisher fresh("new"), old("old"), none("new");
  ASSERT_TRUE(fresh.ok() && old.ok() && none.ok());
  zmq_ingest_options o;
  o.kv_endpoints = {fresh.pub(), old.pub(), none.pub()};
  o.replay_endpoints = {fresh.replay(), old.replay()};
  open(o);
  for (py_publisher* p : {&fresh, &old, &none})
    ASSERT_EQ(p->cmd({{"cmd", "wait_subscriber"}})["ok"], true);

  for (auto [p, base] : {std::pair{&fresh, 100u}, std::pair{&old, 200u}, std::pair{&none, 300u}}) {
    p->send(0, {stored({base + 1})});
    p->send(1, {stored({base + 2})}, "array", "u64", /*lose=*/true);
    p->send(2, {removed({base + 1})}, "map", "u64", /*lose=*/true);
    p->send(3, {stored({base + 3})}, "map");
  }
  ASSERT_TRUE(acked(0, 3) && acked(1, 3) && acked(2, 3));
  for (uint64_t base : {100u, 200u}) {
    EXPECT_FALSE(has(base + 1)) << base;  // removed in a replayed batch
    EXPECT_TRUE(has(base + 2)) << base;
    EXPECT_TRUE(has(base + 3)) << base;
  }
  EXPECT_EQ(in->logic().kv_metrics()[0].replayed, 2u);
  EXPECT_EQ(in->logic().kv_metrics()[1].replayed, 2u);
  EXPECT_EQ(in->logic().kv_metrics()[0].gaps_unfilled, 0u);
  // Without replay the worker is resynchronised: what it held before the gap is dropped.
  EXPECT_FALSE(has(301));
  EXPECT_TRUE(has(303));
  EXPECT_EQ(in->logic().kv_metrics()[2].gaps, 1u);
  EXPECT_EQ(in->logic().kv_metrics()[2].gaps_unfilled, 1u);

  // The engine behind `fresh` restarts: sequence 0 again, its blocks go, others stay.
  ASSERT_EQ(fresh.cmd({{"cmd", "reset_buffer"}})["ok"], true);
  fresh.send(0, {stored({150})});
  ASSERT_TRUE(until([&] { return has(150); }));
  EXPECT_FALSE(has(102));
  EXPECT_FALSE(has(103));
  EXPECT_TRUE(has(203));
  EXPECT_EQ(in->logic().kv_metrics()[0].restarts, 1u);
}

TEST_F(KvIngestZmq, CountsArriveAndBadInputIsCountedWhileTheStreamGoesOn) {
  py_publisher p("new");
  ASSERT_TRUE(p.ok());
  zmq_ingest_options o;
  o.kv_endpoints = {p.pub()};
  o.counts_endpoints = {p.counts()};
  open(o);
  ASSERT_EQ(p.cmd({{"cmd", "wait_subscriber"}})["ok"], true);
  ASSERT_EQ(p.cmd({{"cmd", "wait_subscriber"}, {"counts", true}})["ok"], true);

  const json block = {{"hash", 7},       {"parent", nullptr},   {"tokens", 1},
                      {"sizes", {2, 2}}, {"ids", {0, 1, 2, 3}}, {"counts", {1, 1, 1, 1}}};
  json bad_id = block;
  bad_id["hash"] = 8;
  bad_id["ids"] = {0, 9, 2, 3};  // 9 >= E
  ASSERT_EQ(p.cmd({{"cmd", "send_counts"}, {"model", {2, 8, 2}}, {"blocks", {block, bad_id}}})
                .value("ok", false),
            true);
  ASSERT_EQ(p.cmd({{"cmd", "send_counts"}, {"model", {2, 16, 2}}, {"blocks", {block}}})
                .value("ok", false),
            true);
  ASSERT_EQ(p.cmd({{"cmd", "send_counts"}, {"v", 9}, {"model", {2, 8, 2}}, {"blocks", {block}}})
                .value("ok", false),
            true);
  ASSERT_EQ(p.cmd({{"cmd", "send_raw"}, {"frames_hex", {"", "0102"}}}).value("ok", false), true);
  ASSERT_EQ(p.cmd({{"cmd", "send_raw"}, {"frames_hex", {"", "0000000000000000", "c1"}}})
                .value("ok", false),
            true);
  p.send(1, {stored({7})});
  ASSERT_TRUE(acked(0, 1));
  const auto& cm = in->logic().counts_metrics()[0];
  ASSERT_TRUE(until([&] {
    return cm.dropped[static_cast<size_t>(drop_cause::unsupported_version)] == 1 &&
           cm.dropped[static_cast<size_t>(drop_cause::counts_geometry)] == 1;
  }));
  EXPECT_TRUE(cache->block(7)->has_counts);
  EXPECT_FALSE(has(8));
  EXPECT_EQ(cm.dropped[static_cast<size_t>(drop_cause::bad_counts)], 1u);
  const auto& km = in->logic().kv_metrics()[0];
  EXPECT_EQ(km.dropped[static_cast<size_t>(drop_cause::bad_frames)], 1u);
  EXPECT_EQ(km.dropped[static_cast<size_t>(drop_cause::bad_msgpack)], 1u);
  ASSERT_EQ(cache->block(7)->holders.size(), 1u);
}

}  // namespace
}  // namespace eldr
