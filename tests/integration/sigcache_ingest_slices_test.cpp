// The signature-cache actor under CAF's deterministic test scheduler (issue 12, defect 3): the
// largest batch a publisher may send is applied in slices between which route requests are
// answered, a batch beyond the bounds is refused without holding memory, and one publisher at
// its share leaves room for another. Progress is observed through counters (the cache's block
// count), never through wall-clock time. RocksDB is real, hence the integration label.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "actors/load_monitor_actor.hpp"
#include "actors/node_metrics.hpp"
#include "actors/router/router_actor.hpp"
#include "actors/sigcache/sigcache_actor.hpp"
#include "tests/support/actor_testing.hpp"
#include "tests/support/kv_batches.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

std::vector<uint8_t> seq8(uint64_t s) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(s >> (56 - 8 * i));
  return b;
}

using testing::block_stored_batch;

size_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4096;
}

class SigcacheIngestSlices : public ::testing::Test, protected testing::actor_fixture {
 protected:
  SigcacheIngestSlices() : actor_fixture("eldr-sigcache-slices") {}
  ~SigcacheIngestSlices() override {
    for (auto* a : {&monitor_, &router_, &sigcache_})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    sched_.run();
  }

  void start(uint64_t max_blocks = uint64_t{1} << 22, double share = 0.25) {
    node_config c = default_node_config();
    c.data_dir = dir_.path();
    c.models[0].name = "toy";
    c.models[0].workers = 2;
    c.cache_max_blocks = max_blocks;
    c.cache_publisher_share = share;
    auto ctx = make_context(c);
    auto caches = open_model_caches(c);
    ASSERT_TRUE(caches.ok()) << caches.error().to_string();
    cache_ = caches->front().get();
    sigcache_ = spawn_sigcache(sys_, ctx, std::move(*caches), /*detached=*/false);
    router_ = spawn_router(sys_, ctx, sigcache_, std::vector<router_model_init>(1));
    monitor_ = spawn_load_monitor(sys_, ctx, router_, sigcache_);
    sched_.run();
    for (uint32_t w = 0; w < 2; ++w) {
      auto job = std::make_shared<const worker_job>(
          worker_job{{frontend_channel::worker, "decode", false},
                     worker_register{"", "toy", w, "tcp://w" + std::to_string(w), 0, ""}});
      caf::anon_send(monitor_, worker_atom::value, worker_job_ptr(job));
    }
    sched_.run();
  }

  uint32_t subscribe(const std::string& endpoint) {
    caf::anon_send(sigcache_, subscribe_atom::value, uint32_t{0}, endpoint, false);
    sched_.run();
    return sink_.id_of(endpoint);
  }
  void publish(uint32_t subscription, uint64_t seq, std::vector<uint8_t> payload) {
    auto f = std::make_shared<publisher_frames>();
    f->subscription = subscription;
    f->frames = {{}, seq8(seq), std::move(payload)};
    caf::anon_send(sigcache_, publisher_atom::value, publisher_frames_ptr(std::move(f)));
  }
  void route(const std::string& id) {
    route_request r;
    r.id = id;
    r.model = "toy";
    r.block_hashes = {1, 2, 3};
    auto job = std::make_shared<const route_job>(
        route_job{{frontend_channel::route, "client", false}, std::move(r), 0, 0});
    caf::anon_send(router_, route_atom::value, route_job_ptr(job));
  }
  // The cache's stats (cache_stats_atom), asked like eldrctl status does; the scheduler runs
  // until the answer is in, so queued slices run meanwhile, at most the ones ahead of the ask.
  nlohmann::json cache_stats() {
    nlohmann::json out;
    sys_.spawn([&out, this](caf::event_based_actor* self) {
      self->request(sigcache_, caf::infinite, cache_stats_atom::value)
          .then([&out](const std::string& s) { out = nlohmann::json::parse(s)[0]; });
    });
    while (out.is_null() && sched_.try_run_once()) {
    }
    return out;
  }

  caf::actor sigcache_, router_, monitor_;
  signature_cache* cache_ = nullptr;  // owned by the actor; read between scheduler steps only
};

// The largest batch the limits admit (65,536 hashes) arrives just before a route request: the
// request is answered while most of the batch is still to apply, and the batch completes after.
TEST_F(SigcacheIngestSlices, ARouteIsAnsweredBetweenSlicesOfALargeBatch) {
  start();
  const uint32_t sub = subscribe("tcp://publisher:1");
  const kv_decode_limits limits;
  const uint32_t per_event = limits.max_hashes;
  const uint32_t events = limits.max_batch_hashes / per_event;
  publish(sub, 0, block_stored_batch(1, events, per_event));
  sched_.run_once();  // the cache takes the batch
  route("after-the-batch");
  // A fair scheduler: the router runs whenever it has mail (the test coordinator would
  // otherwise keep resuming the cache while its mailbox is not empty). Everything runs on this
  // thread, so the cache may be read between two steps.
  while (sink_.route_replies() == 0) {
    sched_.prioritize(router_);
    if (!sched_.try_run_once()) break;
  }
  ASSERT_EQ(sink_.route_replies(), 1u);
  const uint64_t applied_when_answered = cache_->stats().blocks;
  EXPECT_LT(applied_when_answered, uint64_t{events} * per_event / 4)
      << "the route waited for the whole batch";
  sched_.run();
  EXPECT_EQ(cache_stats()["blocks"].get<uint64_t>(), uint64_t{events} * per_event);
}

// A batch of 4,194,304 hashes (the one that stalled every route for 7.8 s) is refused at decode
// as oversized: nothing of it is stored, the process holds no memory for it, routes go on.
TEST_F(SigcacheIngestSlices, AHugeBatchIsRefusedWithoutHoldingMemory) {
  start();
  const uint32_t sub = subscribe("tcp://publisher:1");
  auto huge =
      block_stored_batch(uint64_t{1} << 63, 64, 65536);  // 9 bytes per hash, like SHA-256 bits
  ASSERT_GT(huge.size(), size_t{30} << 20);
  const size_t before = rss_bytes();
  publish(sub, 0, std::move(huge));
  route("after-the-huge-batch");
  sched_.run();
  EXPECT_EQ(sink_.route_replies(), 1u);
  const auto stats = cache_stats();
  EXPECT_EQ(stats["blocks"].get<uint64_t>(), 0u);
  EXPECT_GE(stats["ingest"]["dropped"]["oversized"].get<uint64_t>(), 1u);
  // The payload itself (38 MB) was the test's; the decoder allocated nothing for its hashes.
  EXPECT_LT(rss_bytes(), before + (size_t{16} << 20));
}

// One publisher flooding up to the cache's max_blocks takes its share only; another publisher's
// blocks still go in, and the refusals are counted for the first one.
TEST_F(SigcacheIngestSlices, APublisherAtItsShareLeavesRoomForAnother) {
  start(/*max_blocks=*/20'000, /*share=*/0.25);
  const uint32_t a = subscribe("tcp://flood:1"), b = subscribe("tcp://honest:1");
  for (uint64_t s = 0; s < 4; ++s)
    publish(a, s, block_stored_batch(1 + s * 5000, 1, 5000));  // the whole cache's worth
  publish(b, 0, block_stored_batch(1'000'000, 1, 1000));
  sched_.run();
  const auto stats = cache_stats();
  EXPECT_EQ(stats["blocks"].get<uint64_t>(), 5000u + 1000u);
  EXPECT_EQ(stats["ingest"]["dropped"]["publisher_quota"].get<uint64_t>(), 15'000u);
}

// The node's caches get the uncounted-block grace and the publisher share from the config (the
// library's defaults keep such blocks for ever and have no share). The cache runs on the system
// clock here: the test polls for the expiry with a deadline.
TEST(NodeCacheOptions, TheNodeExpiresHeldBlocksThatNeverGetCounts) {
  testing::temp_dir dir{"eldr-node-cache-options"};
  node_config c = default_node_config();
  EXPECT_EQ(c.cache_uncounted_block_grace_ms, 60'000u);
  c.data_dir = dir.path();
  c.cache_uncounted_block_grace_ms = 1;
  c.cache_max_blocks = 1000;
  c.cache_publisher_share = 0.1;
  auto caches = open_model_caches(c);
  ASSERT_TRUE(caches.ok()) << caches.error().to_string();
  signature_cache& cache = *caches->front();
  const uint32_t w = cache.worker_id("tcp://publisher:1");
  std::vector<block_hash> hashes(200);
  std::iota(hashes.begin(), hashes.end(), block_hash{1});
  cache.store_blocks(holder_key{w, 0, -1, "GPU"}, std::nullopt, hashes);
  EXPECT_EQ(cache.usage(w).blocks, 100u);  // 10% of 1000
  EXPECT_EQ(cache.usage(w).refused_quota, 100u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cache.stats().blocks > 0 && std::chrono::steady_clock::now() < deadline)
    cache.expire();
  EXPECT_EQ(cache.stats().blocks, 0u);
  EXPECT_EQ(cache.stats().expired_uncounted, 100u);
}

}  // namespace
}  // namespace eldr
