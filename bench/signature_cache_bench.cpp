// signature_cache_bench: the signature cache's two hot paths (issue targets in BENCHMARKS.md).
//
// - ingest_apply: vLLM KV-event payloads (array form; each batch one BlockStored of 16 blocks and
//   one BlockRemoved of the 16 blocks stored 256 batches earlier, so the database stays at a
//   steady size and every block is written to and deleted from RocksDB) decoded, applied
//   and committed to RocksDB with the WAL on (no fsync), one commit per batch (commit_every:1)
//   or per 64 batches (64: changes to a block between commits coalesce, and blocks born and
//   removed within one commit never reach RocksDB), on one thread. items/s = block events/s per
//   CPU second of the ingest thread (ingest_apply_process_cpu: per CPU second of the whole
//   process, RocksDB's background flush and compaction included). Target >= 300,000.
// - ingest_zmq: the same payloads from a local ZeroMQ PUB (a publisher thread, tcp loopback) into
//   zmq_ingest on the benchmark thread; the time is the ingest thread's, until the last sequence
//   is acknowledged.
// - prefix_lookup: the masked count sum of a 64-block prefix (48 layers x 128 experts, top-8,
//   16-token blocks, a 12-layer mask: the qwen-task geometry of signature_bench), cycling over 64
//   stored prompts. warm_lru: remembered prefix sums off, every lookup sums its 64 blocks from
//   the in-memory LRU; warm_memo: on (the default), a prefix seen before is one remembered sum;
//   cold: LRU and remembered sums dropped before each lookup, so the 64 blocks come from one
//   RocksDB MultiGet (served by RocksDB's block cache / the OS page cache). Counters p50_us and
//   p99_us are per-lookup wall-time percentiles (p99_cpu_us: of this thread's CPU time, i.e.
//   without preemption by other processes). Target p99 <= 50 us warm.
// Smoke mode: tiny sizes, to prove each runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "bench/bench_support.hpp"
#include "cluster/ingest/ingest.hpp"
#include "cluster/zmq/zmq_ingest.hpp"
#include "core/base/msgpack.hpp"
#include "storage/signature_cache.hpp"

namespace {

namespace fs = std::filesystem;

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& tag) {
    path = fs::temp_directory_path() /
           (tag + "-" + std::to_string(std::random_device{}()) + "-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

constexpr uint64_t blocks_per_event = 16;
// Batches a block lives: longer than any commit window, so every block costs RocksDB a put and
// a delete (coalescing cannot hide them); 4,096 blocks stay stored.
constexpr uint64_t lifetime = 256;

// Batch i: BlockStored of blocks [i*16, i*16+16), BlockRemoved of batch i-256's blocks.
std::vector<uint8_t> kv_batch(uint64_t i) {
  std::vector<uint8_t> out;
  eldr::msgpack::writer w(out);
  const bool remove = i >= lifetime;
  w.write_array_header(3);
  w.write_float64(1.0);
  w.write_array_header(remove ? 2 : 1);
  w.write_array_header(12);
  w.write_str("BlockStored");
  w.write_array_header(blocks_per_event);
  for (uint64_t k = 0; k < blocks_per_event; ++k)
    w.write_uint(0x9e3779b97f4a7c15ULL * (i * blocks_per_event + k + 1));
  if (i == 0)
    w.write_nil();
  else
    w.write_uint(0x9e3779b97f4a7c15ULL * (i * blocks_per_event));
  w.write_array_header(0);  // token ids: vLLM sends them, routing skips them
  w.write_uint(16);
  w.write_nil();
  w.write_str("GPU");
  w.write_nil();
  w.write_nil();
  w.write_uint(0);
  w.write_str("full_attention");
  w.write_nil();
  if (remove) {
    w.write_array_header(4);
    w.write_str("BlockRemoved");
    w.write_array_header(blocks_per_event);
    for (uint64_t k = 0; k < blocks_per_event; ++k)
      w.write_uint(0x9e3779b97f4a7c15ULL * ((i - lifetime) * blocks_per_event + k + 1));
    w.write_str("GPU");
    w.write_uint(0);
  }
  w.write_uint(0);
  return out;
}

uint64_t block_events(uint64_t batches) {
  return batches * blocks_per_event +
         (batches > lifetime ? (batches - lifetime) * blocks_per_event : 0);
}

std::vector<uint8_t> seq8(uint64_t s) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(s >> (56 - 8 * i));
  return b;
}

void ingest_apply(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const uint64_t commit_every = static_cast<uint64_t>(state.range(1));
  std::vector<std::vector<uint8_t>> payloads, seqs;
  for (uint64_t i = 0; i < n; ++i) {
    payloads.push_back(kv_batch(i));
    seqs.push_back(seq8(i));
  }
  const std::vector<uint8_t> topic;
  uint64_t events = 0;
  for (auto _ : state) {
    state.PauseTiming();
    scratch_dir dir("eldr-bench-ingest");
    auto cache = eldr::signature_cache::open((dir.path / "db").string(), {});
    if (!cache.ok()) {
      state.SkipWithError(cache.error().to_string().c_str());
      return;
    }
    eldr::ingest in(**cache);
    const uint32_t p = in.add_kv_publisher("bench");
    state.ResumeTiming();
    for (uint64_t i = 0; i < n; ++i) {
      const std::span<const uint8_t> frames[] = {topic, seqs[i], payloads[i]};
      in.on_kv_message(p, frames);
      if (i % commit_every == commit_every - 1 && !in.commit().ok())
        state.SkipWithError("commit failed");
    }
    if (!in.commit().ok()) state.SkipWithError("commit failed");
    state.counters["blocks"] = static_cast<double>((*cache)->stats().blocks);
    events += block_events(n);
    state.PauseTiming();
    cache->reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(events));
}

void ingest_zmq(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t i = 0; i < n; ++i)
    payloads.push_back(kv_batch(i));
  uint64_t events = 0;
  for (auto _ : state) {
    state.PauseTiming();
    scratch_dir dir("eldr-bench-zmq");
    zmq::context_t ctx(1);
    zmq::socket_t pub(ctx, zmq::socket_type::xpub);
    pub.set(zmq::sockopt::sndhwm, 0);
    pub.bind("tcp://127.0.0.1:*");
    const std::string endpoint = pub.get(zmq::sockopt::last_endpoint);
    auto cache = eldr::signature_cache::open((dir.path / "db").string(), {});
    if (!cache.ok()) {
      state.SkipWithError(cache.error().to_string().c_str());
      return;
    }
    eldr::zmq_ingest_options o;
    o.kv_endpoints = {endpoint};
    o.max_messages_per_commit = 64;  // as ingest_apply/commit_every:64: RocksDB sees every block
    auto in = eldr::zmq_ingest::create(**cache, o);
    if (!in.ok()) {
      state.SkipWithError(in.error().to_string().c_str());
      return;
    }
    zmq::message_t sub;
    (void)pub.recv(sub);  // the subscription: the subscriber is connected
    std::thread publisher([&] {
      for (uint64_t i = 0; i < n; ++i) {
        const auto s = seq8(i);
        pub.send(zmq::message_t(), zmq::send_flags::sndmore);
        pub.send(zmq::buffer(s), zmq::send_flags::sndmore);
        pub.send(zmq::buffer(payloads[i]), zmq::send_flags::none);
      }
    });
    const uint32_t worker = (*cache)->worker_id(endpoint);
    state.ResumeTiming();
    while ((*cache)->last_sequence(worker) != n - 1)
      if (!(*in)->poll_once(100).ok()) state.SkipWithError("poll failed");
    state.PauseTiming();
    publisher.join();
    // Lost messages would resynchronise and flatter the figure: there must be none.
    state.counters["gaps"] = static_cast<double>((*in)->logic().kv_metrics()[0].gaps);
    state.counters["blocks"] = static_cast<double>((*cache)->stats().blocks);
    events += block_events(n);
    in->reset();
    cache->reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(events));
}

// A 64-block prompt of the qwen-task geometry, counted from random expert choices.
struct lookup_fixture {
  eldr::model_geometry g{48, 128, 8};
  std::vector<uint32_t> mask;
  std::vector<eldr::block_counts> blocks;
  std::vector<eldr::block_hash> hashes;
  // spread: each choice among the first `spread` experts of a fresh permutation; 4 * k is skewed
  // (about 38 of 128 experts per layer per block: sparse rows), E is uniform (about 80: dense).
  lookup_fixture(bool smoke, uint32_t prompts, uint32_t spread) {
    if (smoke) g = {4, 16, 2};
    for (uint32_t l = 0; l < std::min<uint32_t>(12, g.layers); ++l)
      mask.push_back(l * (g.layers / std::min<uint32_t>(12, g.layers)));
    std::mt19937_64 rng(7);
    const uint32_t tokens = 16, per_prompt = smoke ? 4 : 64;
    std::vector<eldr::expert_id> ids(size_t{tokens} * g.layers * g.top_k);
    std::vector<eldr::expert_id> pool(g.experts);
    for (uint32_t b = 0; b < per_prompt * prompts; ++b) {
      // Skewed choices (a few hot experts per layer), as real routers are.
      for (uint32_t t = 0; t < tokens; ++t)
        for (uint32_t l = 0; l < g.layers; ++l) {
          std::iota(pool.begin(), pool.end(), eldr::expert_id{0});
          for (uint32_t r = 0; r < g.top_k; ++r) {
            const uint32_t width = std::min(spread == 0 ? g.experts : spread, g.experts) - r;
            const uint32_t pick = r + static_cast<uint32_t>(rng() % std::max<uint32_t>(width, 1));
            std::swap(pool[r], pool[pick]);
            ids[(size_t{t} * g.layers + l) * g.top_k + r] = pool[r];
          }
        }
      auto c = eldr::block_counts::from_tokens(g, ids, 0, tokens);
      blocks.push_back(std::move(*c));
      hashes.push_back(0xabcdef0123456789ULL * (b + 1));
    }
  }
};

enum class lookup_mode { lru, memo, cold };

// This thread's CPU time: a lookup's cost without the time other processes took the core.
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

void prefix_lookup(benchmark::State& state, lookup_mode mode) {
  const bool cold = mode == lookup_mode::cold;
  const bool smoke = eldr::bench::smoke();
  const uint32_t prompts = smoke ? 2 : 64;
  const uint32_t spread = state.range(0) == 0 ? 0 : 32;  // 0: uniform over E
  lookup_fixture f(smoke, prompts, spread);
  scratch_dir dir("eldr-bench-lookup");
  eldr::signature_cache_options o;
  o.geometry = f.g;
  o.layer_mask = f.mask;
  if (mode == lookup_mode::lru) o.prefix_memo_bytes = 0;  // every lookup sums its 64 blocks
  auto cache = eldr::signature_cache::open((dir.path / "db").string(), o);
  if (!cache.ok()) {
    state.SkipWithError(cache.error().to_string().c_str());
    return;
  }
  auto& c = **cache;
  const eldr::holder_key who{c.worker_id("w"), 0, 0, "GPU"};
  const size_t per_prompt = f.hashes.size() / prompts;
  for (size_t i = 0; i < f.hashes.size(); ++i) {
    std::optional<eldr::block_hash> parent;
    if (i % per_prompt) parent = f.hashes[i - 1];
    c.store_blocks(who, parent, std::span(f.hashes).subspan(i, 1));
    (void)c.put_counts(f.hashes[i], parent, f.g, f.blocks[i]);
  }
  if (!c.commit().ok()) state.SkipWithError("commit failed");
  std::vector<uint32_t> sum(f.mask.size() * f.g.experts);
  std::vector<double> us, cpu_us;
  size_t p = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (cold) c.drop_memory_cache();
    std::fill(sum.begin(), sum.end(), 0);
    const auto prefix = std::span(f.hashes).subspan((p++ % prompts) * per_prompt, per_prompt);
    state.ResumeTiming();
    const double c0 = thread_cpu_us();
    const auto t0 = std::chrono::steady_clock::now();
    auto info = c.sum_prefix(prefix, sum);
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = thread_cpu_us();
    benchmark::DoNotOptimize(sum.data());
    if (!info.ok() || info->with_counts != per_prompt) state.SkipWithError("lookup missed");
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    cpu_us.push_back(c1 - c0);
  }
  std::sort(us.begin(), us.end());
  if (!us.empty()) {
    state.counters["p50_us"] = us[us.size() / 2];
    state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    std::sort(cpu_us.begin(), cpu_us.end());
    state.counters["p99_cpu_us"] = cpu_us[std::min(cpu_us.size() - 1, cpu_us.size() * 99 / 100)];
  }
  state.counters["blocks"] = static_cast<double>(per_prompt);
}

void prefix_lookup_lru(benchmark::State& state) {
  prefix_lookup(state, lookup_mode::lru);
}
void prefix_lookup_memo(benchmark::State& state) {
  prefix_lookup(state, lookup_mode::memo);
}
void prefix_lookup_cold(benchmark::State& state) {
  prefix_lookup(state, lookup_mode::cold);
}

void register_all() {
  const bool smoke = eldr::bench::smoke();
  benchmark::RegisterBenchmark("ingest_apply", ingest_apply)
      ->ArgNames({"batches", "commit_every"})
      ->Args({smoke ? 16 : 20000, 1})
      ->Args({smoke ? 16 : 20000, 64})
      ->Unit(benchmark::kMillisecond);
  // The same, charged with the CPU of RocksDB's flush and compaction threads too.
  benchmark::RegisterBenchmark("ingest_apply_process_cpu", ingest_apply)
      ->ArgNames({"batches", "commit_every"})
      ->Args({smoke ? 16 : 20000, 1})
      ->MeasureProcessCPUTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("ingest_zmq", ingest_zmq)
      ->Arg(smoke ? 16 : 20000)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int skewed : {1, 0}) {
    benchmark::RegisterBenchmark("prefix_lookup/warm_lru", prefix_lookup_lru)
        ->ArgName("skewed")
        ->Arg(skewed)
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(smoke ? 4 : 20000);
    benchmark::RegisterBenchmark("prefix_lookup/warm_memo", prefix_lookup_memo)
        ->ArgName("skewed")
        ->Arg(skewed)
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(smoke ? 4 : 20000);
    benchmark::RegisterBenchmark("prefix_lookup/cold", prefix_lookup_cold)
        ->ArgName("skewed")
        ->Arg(skewed)
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(smoke ? 4 : 5000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
