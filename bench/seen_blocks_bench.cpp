// seen_blocks_bench: what a clustered router pays for its seen blocks (actors/router/
// seen_blocks.hpp), the memory of carried blocks' masked counts that serves later prefix hits
// without a shard request (docs/cluster.md, "Prefill-affine routers").
//
// - seen_keep: keeping the 64 blocks of a 1,024-token prompt (qwen-task: 48 layers x 128 experts,
//   top-8; 12-layer mask), each new to the cache: the price every carried block pays. The cache
//   is emptied between rounds outside the timing.
// - seen_keep_again: keeping the same 64 blocks when they are already kept (a lookup each, made
//   most recent): the price of a prompt's blocks carried a second time.
// - seen_add: summing those 64 kept blocks into a masked sum, as a prefix hit on them does.
// - masked_add: the same 64 blocks summed from their block_counts with add_masked_counts, what a
//   router does with carried counts: the reference for seen_add.
// - seen_memory: the heap an entry takes, measured (glibc's mallinfo2 before and after keeping
//   16,384 entries, the 64 blocks under as many hashes), against what the budget counts for it
//   (bytes() per entry: its counts plus seen_blocks::entry_overhead, an estimate).
// Smoke mode: 2 blocks of a 4-layer model.
#include <benchmark/benchmark.h>

#include <malloc.h>

#include <memory>
#include <vector>

#include "actors/router/seen_blocks.hpp"
#include "bench/bench_support.hpp"
#include "core/expert_counts.hpp"
#include "core/signature.hpp"
#include "core/sim/synthetic.hpp"

namespace {

struct fixture {
  std::vector<eldr::block_counts> blocks;
  eldr::spec_ptr spec;
};

fixture make_fixture() {
  const uint32_t blocks = eldr::bench::smoke() ? 2 : 64;
  auto params = eldr::synthetic_preset("qwen-task").value();
  params.requests = 1;
  params.prompt_min = params.prompt_max = blocks * 16;
  params.output_min = params.output_max = 0;
  params.seed = 3;
  if (eldr::bench::smoke()) params.geometry = {4, 16, 2};
  const eldr::trace tr = eldr::generate_synthetic(params).value();
  fixture f;
  f.blocks = eldr::count_blocks(tr.geometry, tr.requests[0].experts, 0, blocks * 16, 16).value();
  std::vector<uint32_t> mask;
  const uint32_t layers = tr.geometry.layers, masked = eldr::bench::smoke() ? 2 : 12;
  for (uint32_t l = 0; l < masked; ++l)
    mask.push_back(l * layers / masked);
  f.spec = std::make_shared<const eldr::signature_spec>(
      eldr::signature_spec::make(tr.geometry, eldr::signature_transform::count, mask, {}).value());
  return f;
}

void seen_keep(benchmark::State& state, const fixture& f) {
  for (auto _ : state) {
    state.PauseTiming();
    eldr::router::seen_blocks seen(size_t{64} << 20);
    state.ResumeTiming();
    for (size_t b = 0; b < f.blocks.size(); ++b)
      seen.keep(f.spec, 1000 + b, f.blocks[b]);
    benchmark::DoNotOptimize(seen.bytes());
    state.PauseTiming();  // the cache's destruction is not the keep's
    { eldr::router::seen_blocks gone = std::move(seen); }
    state.ResumeTiming();
  }
  state.counters["blocks"] = static_cast<double>(f.blocks.size());
}

void seen_keep_again(benchmark::State& state, const fixture& f) {
  eldr::router::seen_blocks seen(size_t{64} << 20);
  for (size_t b = 0; b < f.blocks.size(); ++b)
    seen.keep(f.spec, 1000 + b, f.blocks[b]);
  for (auto _ : state)
    for (size_t b = 0; b < f.blocks.size(); ++b)
      seen.keep(f.spec, 1000 + b, f.blocks[b]);
  state.counters["bytes_per_block"] =
      static_cast<double>(seen.bytes()) / static_cast<double>(f.blocks.size());
}

void seen_add(benchmark::State& state, const fixture& f) {
  eldr::router::seen_blocks seen(size_t{64} << 20);
  for (size_t b = 0; b < f.blocks.size(); ++b)
    seen.keep(f.spec, 1000 + b, f.blocks[b]);
  std::vector<uint32_t> acc(f.spec->width(), 0);
  for (auto _ : state) {
    for (size_t b = 0; b < f.blocks.size(); ++b)
      benchmark::DoNotOptimize(seen.add_to(f.spec, 1000 + b, acc));
    benchmark::ClobberMemory();
  }
}

void masked_add(benchmark::State& state, const fixture& f) {
  std::vector<uint32_t> acc(f.spec->width(), 0);
  for (auto _ : state) {
    for (const auto& b : f.blocks)
      benchmark::DoNotOptimize(eldr::add_masked_counts(*f.spec, b, acc));
    benchmark::ClobberMemory();
  }
}

void seen_memory(benchmark::State& state, const fixture& f) {
  const size_t n = eldr::bench::smoke() ? 64 : 16384;
  double heap = 0, budget = 0, counts = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const size_t before = mallinfo2().uordblks;
    {
      eldr::router::seen_blocks seen(size_t{1} << 40);
      for (size_t i = 0; i < n; ++i)
        seen.keep(f.spec, 1000 + i, f.blocks[i % f.blocks.size()]);
      heap = static_cast<double>(mallinfo2().uordblks - before) / static_cast<double>(n);
      budget = static_cast<double>(seen.bytes()) / static_cast<double>(seen.entries());
      counts = budget - static_cast<double>(eldr::router::seen_blocks::entry_overhead);
    }
    state.ResumeTiming();
  }
  state.counters["heap_bytes_per_entry"] = heap;
  state.counters["budget_bytes_per_entry"] = budget;
  state.counters["measured_overhead"] = heap - counts;
}

}  // namespace

int main(int argc, char** argv) {
  static const fixture f = make_fixture();
  benchmark::RegisterBenchmark("seen_keep/64blocks/48x128/mask12", seen_keep, f);
  benchmark::RegisterBenchmark("seen_keep_again/64blocks/48x128/mask12", seen_keep_again, f);
  benchmark::RegisterBenchmark("seen_add/64blocks/48x128/mask12", seen_add, f);
  benchmark::RegisterBenchmark("masked_add/64blocks/48x128/mask12", masked_add, f);
  benchmark::RegisterBenchmark("seen_memory/16384entries/48x128/mask12", seen_memory, f)
      ->Iterations(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
