// sigcache_metrics on a real store, without an actor system: every family is on the page from the
// start; a followed publisher's ingest counters are copied into its series (drops per cause only
// once there is one), and its series go when it is no longer followed; the store's health and the
// publishers' totals are the registry's; the actor's own counters are registry counters.
#include "actors/sigcache/sigcache_metrics.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/sigcache/sigcache_actor.hpp"
#include "actors/sigcache/sigcache_state.hpp"
#include "core/base/msgpack.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr::sigcache {
namespace {

using bytes = std::vector<uint8_t>;

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

struct SigcacheMetrics : ::testing::Test {
  testing::temp_dir dir{"eldr-sigcache-metrics"};
  sigcache_state st;

  void SetUp() override {
    node_config c = default_node_config();
    c.data_dir = dir.path();
    c.models[0].name = "toy";
    auto ctx = std::make_shared<node_context>();
    ctx->config = c;
    ctx->metrics = std::make_shared<node_metrics>();
    ctx->now_ms = [] { return int64_t{0}; };
    auto caches = open_model_caches(c);
    ASSERT_TRUE(caches.ok()) << caches.error().to_string();
    model_cache mc;
    mc.cache = std::move(caches->front());
    mc.events = std::make_unique<ingest>(*mc.cache);
    st.models.push_back(std::move(mc));
    st.ctx = ctx;
    st.metrics = std::make_unique<sigcache_metrics>(ctx->metrics->registry(), *ctx);
  }

  std::string page() const { return st.ctx->metrics->render(); }

  // A KV publisher followed under subscription `id`, as publishers.cpp's attach_ingest makes it.
  uint32_t follow(uint32_t id, const std::string& endpoint) {
    const uint32_t p = st.models[0].events->add_kv_publisher(endpoint);
    subscription sub;
    sub.publisher = p;
    sub.endpoint = endpoint;
    st.subscriptions[id] = sub;
    return p;
  }

  // One KV-event message, an empty batch [ts, [], dp] with sequence `seq`; or, not good, a message
  // of one frame (dropped as bad_frames, its sequence unseen).
  void send(uint32_t p, uint64_t seq, bool good) {
    bytes payload;
    msgpack::writer w(payload);
    w.write_array_header(3);
    w.write_float64(1.0);
    w.write_array_header(0);
    w.write_uint(0);
    bytes topic, sq(8);
    for (int i = 0; i < 8; ++i)
      sq[static_cast<size_t>(i)] = static_cast<uint8_t>(seq >> (56 - 8 * i));
    const std::span<const uint8_t> frames[] = {topic, sq, payload};
    st.models[0].events->on_kv_message(
        p, good ? std::span<const std::span<const uint8_t>>(frames)
                : std::span<const std::span<const uint8_t>>(frames).first(1));
  }
};

TEST_F(SigcacheMetrics, EveryFamilyIsDeclaredFromTheStart) {
  const std::string text = page();
  for (const char* family :
       {"eldr_ingest_messages_total counter", "eldr_ingest_gaps_total counter",
        "eldr_ingest_dropped_total counter", "eldr_publishers gauge", "eldr_publishers_max gauge",
        "eldr_publisher_registrations_refused_total counter", "eldr_ingest_replayed_total counter",
        "eldr_store_degraded gauge", "eldr_store_write_errors_total counter",
        "eldr_sigcache_blocks gauge"})
    EXPECT_TRUE(mentions(text, std::string("# TYPE ") + family + "\n")) << family;
  // No publisher followed yet: no per-publisher series.
  EXPECT_FALSE(mentions(text, "eldr_ingest_messages_total{"));
  // Without a frontend there are no replays to count.
  EXPECT_FALSE(mentions(text, "eldr_publisher_replays_total"));
  EXPECT_TRUE(has_line(text, "eldr_store_degraded{model=\"toy\"} 0"));
}

TEST_F(SigcacheMetrics, APublishersIngestIsCopiedWhileFollowedAndRemovedAfter) {
  const uint32_t a = follow(1, "tcp://a");
  const uint32_t b = follow(2, "tcp://b");
  send(a, 1, true);
  send(a, 2, true);
  send(a, 0, false);
  send(b, 1, true);
  st.metrics->publish_ingest(st);
  std::string text = page();
  EXPECT_TRUE(has_line(
      text, "eldr_ingest_messages_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://a\"} 2"));
  EXPECT_TRUE(has_line(
      text, "eldr_ingest_messages_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://b\"} 1"));
  EXPECT_TRUE(
      has_line(text, "eldr_ingest_gaps_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://a\"} 0"));
  EXPECT_TRUE(has_line(
      text,
      "eldr_ingest_dropped_total{cause=\"bad_frames\",model=\"toy\",publisher=\"tcp://a\"} 1"));
  // A cause with no drop, and a publisher with none, have no series.
  EXPECT_FALSE(mentions(text, "eldr_ingest_dropped_total{cause=\"bad_msgpack\""));
  EXPECT_FALSE(mentions(text,
                        "eldr_ingest_dropped_total{cause=\"bad_frames\",model=\"toy\","
                        "publisher=\"tcp://b\"}"));
  EXPECT_TRUE(has_line(text, "eldr_sigcache_blocks{model=\"toy\"} " +
                                 std::to_string(st.models[0].cache->stats().blocks)));

  // Later counts are copied at the next publish.
  send(a, 3, true);
  st.metrics->publish_ingest(st);
  EXPECT_TRUE(has_line(
      page(), "eldr_ingest_messages_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://a\"} 3"));

  // a is no longer followed (forgotten: its subscription closed): its series go, b's stay.
  st.subscriptions.erase(1);
  st.metrics->publish_ingest(st);
  text = page();
  EXPECT_FALSE(mentions(text, "publisher=\"tcp://a\""));
  EXPECT_TRUE(has_line(
      text, "eldr_ingest_messages_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://b\"} 1"));
  EXPECT_TRUE(mentions(text, "# TYPE eldr_ingest_dropped_total counter\n"));

  // Followed again under the same ingest index: its series come back with its counts.
  subscription sub;
  sub.publisher = a;
  sub.endpoint = "tcp://a";
  st.subscriptions[3] = sub;
  st.metrics->publish_ingest(st);
  text = page();
  EXPECT_TRUE(has_line(
      text, "eldr_ingest_messages_total{kind=\"kv\",model=\"toy\",publisher=\"tcp://a\"} 3"));
  EXPECT_TRUE(has_line(
      text,
      "eldr_ingest_dropped_total{cause=\"bad_frames\",model=\"toy\",publisher=\"tcp://a\"} 1"));
}

TEST_F(SigcacheMetrics, PublishersTotalsAndTheActorsCountersAreTheRegistrys) {
  st.metrics->registrations_refused->inc();
  st.metrics->subscribe_failed->inc(2);
  st.metrics->publishers_forgotten->inc();
  st.metrics->publish_publishers(st);
  const std::string text = page();
  EXPECT_TRUE(has_line(text, "eldr_publisher_registrations_refused_total 1"));
  EXPECT_TRUE(has_line(text, "eldr_publisher_subscribe_failed_total 2"));
  EXPECT_TRUE(has_line(text, "eldr_publishers_forgotten_total 1"));
  EXPECT_TRUE(has_line(text, "eldr_publishers 0"));
  EXPECT_TRUE(
      has_line(text, "eldr_publishers_max " + std::to_string(st.publishers.max_publishers())));
  EXPECT_TRUE(has_line(text, "eldr_ingest_replayed_total 0"));
  EXPECT_TRUE(has_line(text, "eldr_ingest_gaps_unfilled_total 0"));
}

TEST_F(SigcacheMetrics, TheStoresHealthIsCopiedPerModel) {
  st.metrics->publish_store(st);
  const store_health h = st.models[0].cache->health();
  const std::string text = page();
  EXPECT_TRUE(has_line(text, "eldr_store_degraded{model=\"toy\"} 0"));
  EXPECT_TRUE(has_line(
      text, "eldr_store_write_errors_total{model=\"toy\"} " + std::to_string(h.write_errors)));
  EXPECT_TRUE(has_line(
      text, "eldr_store_pending_changes{model=\"toy\"} " + std::to_string(h.pending_changes)));
  EXPECT_TRUE(has_line(text, "eldr_store_recovery_events_total{model=\"toy\"} " +
                                 std::to_string(h.recovery_events)));
}

}  // namespace
}  // namespace eldr::sigcache
