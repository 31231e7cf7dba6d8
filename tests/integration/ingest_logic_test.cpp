// ingest (no sockets) on a real RocksDB: sequence rules (in order, restart, gap filled by a
// replay, gap resynchronised), bad frames and payloads counted per cause while the stream goes
// on, counts of another geometry refused, metrics carried across a reopen.
#include "cluster/ingest/ingest.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/base/msgpack.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using bytes = std::vector<uint8_t>;

bytes seq8(uint64_t s) {
  bytes b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(s >> (56 - 8 * i));
  return b;
}

// [ts, [BlockStored|BlockRemoved ...], dp] in the array form.
bytes batch(const std::vector<std::pair<std::string, std::vector<uint64_t>>>& events) {
  bytes out;
  msgpack::writer w(out);
  w.write_array_header(3);
  w.write_float64(1.0);
  w.write_array_header(static_cast<uint32_t>(events.size()));
  for (const auto& [type, hashes] : events) {
    if (type == "AllBlocksCleared") {
      w.write_array_header(1);
      w.write_str(type);
      continue;
    }
    const bool stored = type == "BlockStored";
    w.write_array_header(stored ? 7 : 4);
    w.write_str(type);
    w.write_array_header(static_cast<uint32_t>(hashes.size()));
    for (uint64_t h : hashes)
      w.write_uint(h);
    if (stored) {
      w.write_nil();            // parent
      w.write_array_header(0);  // token ids
      w.write_uint(16);         // block size
      w.write_nil();            // lora id
    }
    w.write_str("GPU");          // medium
    if (!stored) w.write_nil();  // group, nil as in BlockStored above
  }
  w.write_uint(0);
  return out;
}

struct IngestLogic : ::testing::Test {
  testing::temp_dir dir{"eldr-ingest"};
  int64_t now = 0;
  std::unique_ptr<signature_cache> cache;
  std::map<uint64_t, bytes> published;  // what the fake replay socket serves

  void SetUp() override { reopen(); }
  void reopen() {
    cache.reset();
    signature_cache_options o;
    o.geometry = {2, 8, 2};
    o.clock = [this] { return now; };
    auto c = signature_cache::open(dir.sub("db"), o);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    cache = std::move(*c);
  }
  void send(ingest& in, uint32_t p, uint64_t s, const bytes& payload) {
    published[s] = payload;
    const bytes topic, sq = seq8(s);
    const std::span<const uint8_t> frames[] = {topic, sq, payload};
    in.on_kv_message(p, frames);
  }
  replay_fn fake_replay() {
    return [this](uint64_t start, const auto& deliver) {
      for (auto it = published.lower_bound(start); it != published.end(); ++it)
        deliver(it->first, it->second);
      return true;
    };
  }
  bool has(uint64_t h) { return cache->block(h).ok(); }
};

// The node's asynchronous replay: the request returns at once, the answers come later as
// messages; live messages that arrive meanwhile wait behind the replay, in order.
TEST_F(IngestLogic, AsynchronousReplayFillsTheGapAndAppliesHeldMessagesAfter) {
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t p = in.add_kv_publisher("async");
  std::vector<std::pair<uint64_t, uint64_t>> asked;  // (token, start)
  in.set_replay_requester(p, [&](uint64_t token, uint64_t start) {
    asked.emplace_back(token, start);
    return true;
  });
  send(in, p, 0, batch({{"BlockStored", {1}}}));
  published[1] = batch({{"BlockStored", {2}}});  // lost on the live socket, kept for replay
  published[2] = batch({{"BlockRemoved", {1}}});
  send(in, p, 3, batch({{"BlockStored", {4}}}));
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].second, 1u);
  EXPECT_TRUE(in.replay_pending(p));
  send(in, p, 4, batch({{"BlockStored", {5}}}));  // live, held behind the replay
  EXPECT_FALSE(has(4));
  EXPECT_FALSE(has(5));
  const uint64_t token = asked[0].first;
  in.on_replay_batch(p, token + 1, 1, published[1]);  // another request's answer: ignored
  EXPECT_FALSE(has(2));
  in.on_replay_batch(p, token, 1, published[1]);
  in.on_replay_batch(p, token, 2, published[2]);  // closes the gap: the held messages follow
  EXPECT_FALSE(in.replay_pending(p));
  in.on_replay_batch(p, token, 3, published[3]);  // the rest of the replay: already applied
  in.on_replay_end(p, token, true);
  EXPECT_FALSE(has(1));
  EXPECT_TRUE(has(2));
  EXPECT_TRUE(has(4));
  EXPECT_TRUE(has(5));
  EXPECT_EQ(*cache->last_sequence(0), 4u);
  EXPECT_EQ(in.kv_metrics()[p].replayed, 2u);
  EXPECT_EQ(in.kv_metrics()[p].gaps_unfilled, 0u);
  ASSERT_TRUE(in.commit().ok());
  EXPECT_EQ(nlohmann::json::parse(in.metrics_json())["replayed"], 2u);
}

// The node applies large batches in slices (ingest_limits::hashes_per_turn), so a replay's
// answers can arrive while the publisher's later live messages still wait in the backlog behind
// another publisher's batch. The replayed batches and the message that opened the gap must still
// come before those later messages: otherwise a later one would look like a new gap.
TEST_F(IngestLogic, AsynchronousReplayKeepsThePublishersOrderWhileBatchesApplyInSlices) {
  ingest_limits work;
  work.hashes_per_turn = 1;
  ingest in(
      *cache, {}, [this] { return now; }, work);
  const uint32_t q = in.add_kv_publisher("big");
  const uint32_t p = in.add_kv_publisher("async");
  std::vector<std::pair<uint64_t, uint64_t>> asked;  // (token, start)
  in.set_replay_requester(p, [&](uint64_t token, uint64_t start) {
    asked.emplace_back(token, start);
    return true;
  });
  auto hashes = [](uint64_t from) {
    std::vector<uint64_t> h;
    for (uint64_t i = 0; i < 10; ++i)
      h.push_back(from + i);
    return h;
  };
  std::map<uint64_t, bytes> p_batches = {{0, batch({{"BlockStored", {1}}})},
                                         {1, batch({{"BlockStored", {2}}})},
                                         {2, batch({{"BlockRemoved", {1}}})},
                                         {3, batch({{"BlockStored", {4}}})},
                                         {4, batch({{"BlockStored", {5}}})}};
  send(in, q, 0, batch({{"BlockStored", hashes(100)}}));
  send(in, p, 0, p_batches[0]);
  send(in, p, 3, p_batches[3]);  // 1 and 2 lost on the live socket
  send(in, q, 1, batch({{"BlockStored", hashes(200)}}));
  send(in, p, 4, p_batches[4]);
  for (int turns = 0; asked.empty() && in.pending() && turns < 100; ++turns)
    in.resume();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].second, 1u);
  ASSERT_TRUE(in.pending());  // q's second batch and p's message 4 still wait
  in.on_replay_batch(p, asked[0].first, 1, p_batches[1]);
  in.on_replay_batch(p, asked[0].first, 2, p_batches[2]);
  in.on_replay_end(p, asked[0].first, true);
  for (int turns = 0; in.pending() && turns < 100; ++turns)
    in.resume();
  EXPECT_FALSE(in.pending());
  EXPECT_FALSE(has(1));
  EXPECT_TRUE(has(2));
  EXPECT_TRUE(has(4));
  EXPECT_TRUE(has(5));
  EXPECT_TRUE(has(109));
  EXPECT_TRUE(has(209));
  EXPECT_EQ(*cache->last_sequence(cache->worker_id("async")), 4u);
  EXPECT_EQ(in.kv_metrics()[p].replayed, 2u);
  EXPECT_EQ(in.kv_metrics()[p].gaps, 1u);
  EXPECT_EQ(in.kv_metrics()[p].gaps_unfilled, 0u);
  EXPECT_EQ(in.kv_metrics()[p].restarts, 0u);
}

TEST_F(IngestLogic, AsynchronousReplayThatFailsResynchronisesThenAppliesHeld) {
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t p = in.add_kv_publisher("async");
  uint64_t token = 0;
  in.set_replay_requester(p, [&](uint64_t t, uint64_t) {
    token = t;
    return true;
  });
  send(in, p, 0, batch({{"BlockStored", {1}}}));
  send(in, p, 3, batch({{"BlockStored", {4}}}));
  send(in, p, 4, batch({{"BlockStored", {5}}}));
  in.on_replay_end(p, token, false);  // a timeout, say
  EXPECT_FALSE(in.replay_pending(p));
  EXPECT_FALSE(has(1));  // resynchronised
  EXPECT_TRUE(has(4));
  EXPECT_TRUE(has(5));
  EXPECT_EQ(in.kv_metrics()[p].gaps_unfilled, 1u);
  EXPECT_EQ(in.kv_metrics()[p].replayed, 0u);

  // A requester that cannot ask resynchronises at once.
  const uint32_t q = in.add_kv_publisher("refusing");
  in.set_replay_requester(q, [](uint64_t, uint64_t) { return false; });
  send(in, q, 0, batch({{"BlockStored", {20}}}));
  send(in, q, 2, batch({{"BlockStored", {21}}}));
  EXPECT_FALSE(in.replay_pending(q));
  EXPECT_FALSE(has(20));
  EXPECT_TRUE(has(21));
  EXPECT_EQ(in.kv_metrics()[q].gaps_unfilled, 1u);
  ASSERT_TRUE(in.commit().ok());
}

TEST_F(IngestLogic, AppliesInOrderAndDropsTheWorkerOnRestart) {
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t a = in.add_kv_publisher("a"), b = in.add_kv_publisher("b");
  send(in, a, 0, batch({{"BlockStored", {1, 2, 3}}}));
  send(in, b, 7, batch({{"BlockStored", {3, 9}}}));  // b joined late: any first seq is fine
  send(in, a, 1, batch({{"BlockRemoved", {1}}}));
  ASSERT_TRUE(in.commit().ok());
  EXPECT_FALSE(has(1));
  EXPECT_TRUE(has(2));
  EXPECT_EQ(cache->block(3)->holders.size(), 2u);
  EXPECT_EQ(*cache->last_sequence(0), 1u);

  send(in, a, 0, batch({{"BlockStored", {5}}}));  // a restarted
  ASSERT_TRUE(in.commit().ok());
  EXPECT_EQ(in.kv_metrics()[a].restarts, 1u);
  EXPECT_FALSE(has(2));
  EXPECT_TRUE(has(5));
  EXPECT_EQ(cache->block(3)->holders.size(), 1u);  // b's copy stays
  EXPECT_EQ(in.kv_metrics()[a].block_events, 5u);
}

TEST_F(IngestLogic, GapsAreFilledByReplayOrResynchronised) {
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t with = in.add_kv_publisher("with-replay", fake_replay());
  const uint32_t without = in.add_kv_publisher("without");
  send(in, with, 0, batch({{"BlockStored", {1}}}));
  published[1] = batch({{"BlockStored", {2}}});  // lost on the live socket, kept for replay
  published[2] = batch({{"BlockRemoved", {1}}});
  send(in, with, 3, batch({{"BlockStored", {4}}}));
  EXPECT_FALSE(has(1));
  EXPECT_TRUE(has(2));
  EXPECT_TRUE(has(4));
  EXPECT_EQ(in.kv_metrics()[with].gaps, 1u);
  EXPECT_EQ(in.kv_metrics()[with].gaps_unfilled, 0u);
  EXPECT_EQ(in.kv_metrics()[with].replayed, 2u);

  send(in, without, 0, batch({{"BlockStored", {10}}}));
  send(in, without, 5, batch({{"BlockStored", {11}}}));
  EXPECT_FALSE(has(10));  // resynchronised: what it held before the gap is unknown
  EXPECT_TRUE(has(11));
  EXPECT_EQ(in.kv_metrics()[without].gaps_unfilled, 1u);
  ASSERT_TRUE(in.commit().ok());
}

TEST_F(IngestLogic, MalformedInputIsCountedAndTheStreamGoesOn) {
  {
    ingest in(*cache, {}, [this] { return now; });
    const uint32_t p = in.add_kv_publisher("a");
    const bytes junk = {0xc1}, empty;
    const std::span<const uint8_t> two[] = {empty, empty};
    in.on_kv_message(p, two);  // two frames
    const bytes short_seq = {1, 2};
    const std::span<const uint8_t> bad_seq[] = {empty, short_seq, empty};
    in.on_kv_message(p, bad_seq);
    send(in, p, 0, junk);  // not MessagePack
    send(in, p, 1, batch({{"BlockStored", {1}}, {"AllBlocksCleared", {}}, {"BlockStored", {2}}}));
    ASSERT_TRUE(in.commit().ok());
    const auto& m = in.kv_metrics()[p];
    EXPECT_EQ(m.dropped[static_cast<size_t>(drop_cause::bad_frames)], 2u);
    EXPECT_EQ(m.dropped[static_cast<size_t>(drop_cause::bad_msgpack)], 1u);
    EXPECT_FALSE(has(1));
    EXPECT_TRUE(has(2));

    // Counts: one of the cache's geometry, one of another.
    const uint32_t c = in.add_counts_publisher("counts");
    counts_message good;
    good.geometry = {2, 8, 2};
    good.blocks.push_back(
        {2, std::nullopt,
         *block_counts::from_parts(good.geometry, 1, {0, 2, 4}, {0, 1, 2, 3}, {1, 1, 1, 1})});
    counts_message other;
    other.geometry = {2, 16, 2};
    other.blocks = good.blocks;
    const bytes g = encode_counts_message(good), o = encode_counts_message(other), topic;
    const std::span<const uint8_t> f1[] = {topic, g}, f2[] = {topic, o};
    in.on_counts_message(c, f1);
    in.on_counts_message(c, f2);
    ASSERT_TRUE(in.commit().ok());
    EXPECT_TRUE(cache->block(2)->has_counts);
    EXPECT_EQ(in.counts_metrics()[c].dropped[static_cast<size_t>(drop_cause::counts_geometry)], 1u);
  }
  // The totals survive a restart of the cache.
  reopen();
  auto j = nlohmann::json::parse(*cache->metadata("ingest_metrics"));
  EXPECT_EQ(j["dropped"]["bad_frames"], 2);
  EXPECT_EQ(j["dropped"]["counts_geometry"], 1);
  ingest again(*cache);
  EXPECT_EQ(nlohmann::json::parse(again.metrics_json())["dropped"]["bad_msgpack"], 1);
}

TEST_F(IngestLogic, EachCauseIsLoggedOncePerIntervalAndCountedAlways) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  ingest in(*cache, {}, [this] { return now; });
  const uint32_t p = in.add_kv_publisher("a");
  const bytes junk = {0xc1};
  for (uint64_t s = 0; s < 3; ++s)
    send(in, p, s, junk);
  EXPECT_EQ(sink->last_formatted().size(), 1u);
  now += 10'000;
  send(in, p, 3, junk);
  EXPECT_EQ(sink->last_formatted().size(), 2u);
  EXPECT_EQ(in.kv_metrics()[p].dropped[static_cast<size_t>(drop_cause::bad_msgpack)], 4u);
  spdlog::set_default_logger(previous);
}

}  // namespace
}  // namespace eldr
