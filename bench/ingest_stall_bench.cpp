// ingest_stall_bench: how long one turn of the signature-cache actor can hold the route path
// behind publisher work (issue 12, defect 3; figures in BENCHMARKS.md). Each benchmark is one
// unit of work the actor does in a single message: decoding the largest batch the limits admit,
// applying one slice of it, expiring one bounded round of deadlines, and the commit that stages
// what one commit interval of slices dirtied. The worst turn is the sum of a decode and a slice.
#include <benchmark/benchmark.h>

#include <numeric>

#include "bench/bench_support.hpp"
#include "cluster/ingest/ingest.hpp"
#include "tests/support/kv_batches.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

using namespace eldr;

constexpr size_t slice = 2048;  // ingest_hashes_per_turn (actors/sigcache/sigcache_state.hpp)

// The largest admitted batch: max_batch_hashes hashes in events of max_hashes, each block with
// its 16 token ids (vLLM writes them), hashes as 64-bit integers (9 bytes, like SHA-256 bits).
std::vector<uint8_t> largest_batch(uint64_t first) {
  const kv_decode_limits limits;
  const uint32_t per_event = eldr::bench::smoke() ? 16 : limits.max_hashes;
  const uint32_t events = eldr::bench::smoke() ? 2 : limits.max_batch_hashes / per_event;
  return eldr::testing::block_stored_batch(first, events, per_event, /*with_tokens=*/true);
}

void BM_DecodeLargestBatch(benchmark::State& state) {
  const auto payload = largest_batch(uint64_t{1} << 63);
  std::vector<kv_decode_issue> issues;
  for (auto _ : state) {
    auto b = decode_kv_batch(payload, {}, issues);
    benchmark::DoNotOptimize(b);
  }
  state.counters["payload_bytes"] = static_cast<double>(payload.size());
}
BENCHMARK(BM_DecodeLargestBatch)->Unit(benchmark::kMillisecond);

struct cache_fixture {
  testing::temp_dir dir{"eldr-ingest-stall"};
  std::unique_ptr<signature_cache> cache;
  int64_t now = 0;
  explicit cache_fixture(int64_t uncounted_grace = 0) {
    signature_cache_options o;
    o.geometry = {48, 128, 8};
    o.uncounted_block_grace_ms = uncounted_grace;
    o.background_writes = true;  // as on the node
    o.clock = [this] { return now; };
    auto c = signature_cache::open(dir.sub("db"), o);
    cache = std::move(*c);
  }
};

// One slice of new blocks (the worst case: every hash creates a block and a holder).
void BM_StoreOneSlice(benchmark::State& state) {
  cache_fixture f;
  const holder_key who{f.cache->worker_id("tcp://p:1"), 0, 0, "GPU"};
  std::vector<block_hash> hashes(slice);
  block_hash next = 1;
  for (auto _ : state) {
    std::iota(hashes.begin(), hashes.end(), next);
    next += slice;
    f.cache->store_blocks(who, std::nullopt, hashes);
    if (f.cache->stats().blocks >= (size_t{1} << 20)) {
      state.PauseTiming();
      f.cache->clear_worker(who.worker, false);
      (void)f.cache->flush();
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_StoreOneSlice)->Unit(benchmark::kMillisecond);

// The commit after one commit interval of back-to-back slices (10 ms: about two slices).
void BM_CommitAfterLargestBatch(benchmark::State& state) {
  cache_fixture f;
  const holder_key who{f.cache->worker_id("tcp://p:1"), 0, 0, "GPU"};
  const size_t n = eldr::bench::smoke() ? 64 : 2 * slice;
  std::vector<block_hash> hashes(n);
  block_hash next = 1;
  for (auto _ : state) {
    state.PauseTiming();
    std::iota(hashes.begin(), hashes.end(), next);
    next += n;
    f.cache->store_blocks(who, std::nullopt, hashes);
    state.ResumeTiming();
    (void)f.cache->commit();
  }
}
BENCHMARK(BM_CommitAfterLargestBatch)->Unit(benchmark::kMillisecond);

// One bounded round of expiry (sigcache_actor's expire_per_commit) over held uncounted blocks.
void BM_ExpireOneRound(benchmark::State& state) {
  cache_fixture f(/*uncounted_grace=*/1);
  const holder_key who{f.cache->worker_id("tcp://p:1"), 0, 0, "GPU"};
  std::vector<block_hash> hashes(slice);
  block_hash next = 1;
  for (auto _ : state) {
    state.PauseTiming();
    std::iota(hashes.begin(), hashes.end(), next);
    next += slice;
    f.cache->store_blocks(who, std::nullopt, hashes);
    f.now += 2;
    state.ResumeTiming();
    benchmark::DoNotOptimize(f.cache->expire(4096));  // expire_per_commit
  }
}
BENCHMARK(BM_ExpireOneRound)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
