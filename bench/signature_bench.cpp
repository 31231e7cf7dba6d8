// signature_bench: building a request's signature from per-block expert counts, the router's
// per-request work before scoring.
//
// - signature_from_blocks: a prompt of 64 KV blocks x 16 tokens (1,024 tokens) of the qwen-task
//   synthetic workload (48 layers x 128 experts, top-8), summed with a 12-layer mask, then
//   transformed (count_idf) and normalised. Issue target: <= 20 us.
// - signature_from_prefix: the same signature when the cache hands over the first 63 blocks as
//   one cumulative masked sum (one dense add) plus the last block.
// - block_counts_from_tokens: counting one 16-token block from the raw expert ids (prefill side).
// - sample_fill: offering the all-layer signature of a 1,024-token prompt to a fresh refit sample
//   (signature_sample) until it holds 1,024 rows: what every router pays per decision until its
//   reservoir is full (after its first sample_size decisions; each router of a cluster fills its
//   own). Per offer: a row of width floats written, its pages touched for the first time. The
//   sample's make() is timed too (since 2026-12-06 it makes the reservoir resident).
// - sample_fill_offers: the same offers to a sample of the default sample_size (4,096 rows, 100
//   MB at this width: above glibc's largest mmap threshold, so each sample is fresh memory, as a
//   router's is), with make() outside the timing: what a decision pays while its router's sample
//   fills (rows whose pages faulted in on first touch until 2026-12-06,
//   core/base/resident_buffer.hpp).
// - sample_copy: copying a full sample of the default size (4,096 rows, 100 MB) into fresh memory,
//   as the router hands its sample to a refit, on the router's thread; Arg 0 a plain vector copy
//   (its pages faulted in by the copy), Arg 1 into memory made resident first
//   (core/base/resident_buffer.hpp, what the router does since 2026-12-06).
// - sample_past_horizon: offering the same signature to a full sample already past its horizon
//   (models.sample_horizon): what a busy router pays per decision for ever -- a resident row
//   rewritten for sample_size / horizon of the offers (1/8 at the automatic horizon, every offer
//   at horizon = sample_size).
// Smoke mode: 2 blocks of a 4-layer model.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "bench/bench_support.hpp"
#include "core/base/resident_buffer.hpp"
#include "core/expert_counts.hpp"
#include "core/refit.hpp"
#include "core/signature.hpp"
#include "core/sim/synthetic.hpp"

namespace {

struct fixture {
  eldr::model_geometry g;
  std::vector<eldr::block_counts> blocks;
  std::vector<eldr::expert_id> ids;
  std::shared_ptr<const eldr::signature_spec> spec;
  std::vector<uint32_t> prefix_sum;  // masked cumulative counts of all blocks but the last
};

fixture make_fixture(uint32_t blocks, uint32_t mask_layers) {
  auto params = eldr::synthetic_preset("qwen-task").value();
  params.requests = 1;
  params.prompt_min = params.prompt_max = blocks * 16;
  params.output_min = params.output_max = 0;
  params.seed = 3;
  if (eldr::bench::smoke()) params.geometry = {4, 16, 2};
  const eldr::trace tr = eldr::generate_synthetic(params).value();
  fixture f;
  f.g = tr.geometry;
  f.ids = tr.requests[0].experts;
  f.blocks = eldr::count_blocks(f.g, f.ids, 0, blocks * 16, 16).value();
  std::vector<uint32_t> mask;
  for (uint32_t l = 0; l < mask_layers && l < f.g.layers; ++l)
    mask.push_back(l * f.g.layers / mask_layers);
  std::vector<float> idf(f.g.width(), 1.0f);
  for (std::size_t i = 0; i < idf.size(); ++i)
    idf[i] = 0.5f + static_cast<float>(i % 7) * 0.1f;
  f.spec = std::make_shared<const eldr::signature_spec>(
      eldr::signature_spec::make(f.g, eldr::signature_transform::count_idf, mask, idf).value());
  // The cumulative masked sum a signature cache would keep for the 63-block prefix.
  std::vector<uint32_t> dense(f.g.width(), 0);
  for (std::size_t b = 0; b + 1 < f.blocks.size(); ++b)
    f.blocks[b].add_to(f.g, dense);
  for (uint32_t l : f.spec->layer_mask())
    f.prefix_sum.insert(f.prefix_sum.end(), dense.begin() + l * f.g.experts,
                        dense.begin() + (l + 1) * f.g.experts);
  return f;
}

void signature_from_blocks(benchmark::State& state, const fixture& f) {
  eldr::signature_builder builder(f.spec);
  eldr::signature sig;
  for (auto _ : state) {
    for (const auto& b : f.blocks)
      benchmark::DoNotOptimize(builder.add(b));
    builder.finish(sig);
    benchmark::DoNotOptimize(sig.value.data());
  }
  state.counters["nnz"] = static_cast<double>(sig.nnz());
  state.counters["width"] = sig.width;
}

void signature_from_prefix(benchmark::State& state, const fixture& f) {
  eldr::signature_builder builder(f.spec);
  eldr::signature sig;
  for (auto _ : state) {
    benchmark::DoNotOptimize(builder.add_masked(f.prefix_sum));
    benchmark::DoNotOptimize(builder.add(f.blocks.back()));
    builder.finish(sig);
    benchmark::DoNotOptimize(sig.value.data());
  }
}

// A short prompt under an all-layer spec: one block's counts, finished over L * E dimensions
// most of which are zero -- the node's common case, where finish() dominates.
void signature_one_block_all_layers(benchmark::State& state, const fixture& f) {
  eldr::signature_builder builder(f.spec);
  eldr::signature sig;
  for (auto _ : state) {
    benchmark::DoNotOptimize(builder.add(f.blocks.front()));
    builder.finish(sig);
    benchmark::DoNotOptimize(sig.value.data());
  }
  state.counters["nnz"] = static_cast<double>(sig.nnz());
  state.counters["width"] = sig.width;
}

void block_counts_from_tokens(benchmark::State& state, const fixture& f) {
  for (auto _ : state) {
    auto b = eldr::block_counts::from_tokens(f.g, f.ids, 0, 16);
    benchmark::DoNotOptimize(b);
  }
}

// The prompt's signature, as a router offers it to its refit sample; and the sample's rows.
eldr::signature prompt_signature(const fixture& f) {
  eldr::signature_builder builder(f.spec);
  eldr::signature sig;
  for (const auto& b : f.blocks)
    (void)builder.add(b);
  builder.finish(sig);
  return sig;
}
uint32_t sample_rows() {
  return eldr::bench::smoke() ? 8 : 1024;
}

void sample_fill(benchmark::State& state, const fixture& f) {
  const eldr::signature sig = prompt_signature(f);
  const uint32_t rows = sample_rows();
  for (auto _ : state) {
    auto sample = eldr::signature_sample::make(rows, sig.width, 1).value();
    for (uint32_t i = 0; i < rows; ++i)
      benchmark::DoNotOptimize(sample.add(sig));
    benchmark::DoNotOptimize(sample.points().data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
  state.counters["width"] = sig.width;
}

void sample_fill_offers(benchmark::State& state, const fixture& f) {
  const eldr::signature sig = prompt_signature(f);
  const uint32_t rows = eldr::bench::smoke() ? 8 : 4096;
  for (auto _ : state) {
    state.PauseTiming();
    auto sample = eldr::signature_sample::make(rows, sig.width, 1).value();
    state.ResumeTiming();
    for (uint32_t i = 0; i < rows; ++i)
      benchmark::DoNotOptimize(sample.add(sig));
    benchmark::DoNotOptimize(sample.points().data());
    state.PauseTiming();  // the sample's memory is given back outside the timing
    sample = eldr::signature_sample::make(1, 1, 1).value();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
  state.counters["width"] = sig.width;
}

void sample_copy(benchmark::State& state, const fixture& f) {
  const eldr::signature sig = prompt_signature(f);
  const uint32_t rows = eldr::bench::smoke() ? 8 : 4096;
  auto sample = eldr::signature_sample::make(rows, sig.width, 1).value();
  for (uint32_t i = 0; i < rows; ++i)
    (void)sample.add(sig);
  const auto pts = sample.points();
  for (auto _ : state) {
    std::vector<float> copy;
    if (state.range(0) == 1) eldr::make_resident(copy, pts.size());
    copy.assign(pts.begin(), pts.end());
    benchmark::DoNotOptimize(copy.data());
    state.PauseTiming();  // the copy's memory is given back outside the timing
    copy = {};
    state.ResumeTiming();
  }
  state.counters["MB"] = static_cast<double>(pts.size_bytes()) / 1e6;
}

void sample_past_horizon(benchmark::State& state, const fixture& f) {
  const eldr::signature sig = prompt_signature(f);
  const uint32_t rows = sample_rows();
  const auto horizon = static_cast<uint64_t>(state.range(0)) * rows;
  auto sample = eldr::signature_sample::make(rows, sig.width, 1, horizon).value();
  for (uint64_t i = 0; i < horizon; ++i)
    (void)sample.add(sig);
  for (auto _ : state)
    benchmark::DoNotOptimize(sample.add(sig));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["width"] = sig.width;
  state.counters["horizon"] = static_cast<double>(horizon);
  state.counters["nnz"] = static_cast<double>(sig.nnz());
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = eldr::bench::smoke();
  static const fixture f = make_fixture(smoke ? 2 : 64, smoke ? 2 : 12);
  benchmark::RegisterBenchmark("signature_from_blocks/64x16tok/48x128/mask12",
                               signature_from_blocks, f);
  benchmark::RegisterBenchmark("signature_from_prefix/63+1/48x128/mask12", signature_from_prefix,
                               f);
  benchmark::RegisterBenchmark("block_counts_from_tokens/16tok/48x128", block_counts_from_tokens,
                               f);
  static const fixture all_layers = make_fixture(smoke ? 2 : 64, smoke ? 2 : 48);
  benchmark::RegisterBenchmark("signature_one_block/1x16tok/48x128/mask48",
                               signature_one_block_all_layers, all_layers);
  benchmark::RegisterBenchmark("sample_fill/1024rows/64x16tok/mask48", sample_fill, all_layers);
  benchmark::RegisterBenchmark("sample_fill_offers/4096rows/64x16tok/mask48", sample_fill_offers,
                               all_layers);
  benchmark::RegisterBenchmark("sample_copy/4096rows/64x16tok/mask48", sample_copy, all_layers)
      ->Arg(0)
      ->Arg(1);
  // Horizon in multiples of the sample: 8 = automatic, 1 = every offer rewrites a row.
  benchmark::RegisterBenchmark("sample_past_horizon/1024rows/64x16tok/mask48", sample_past_horizon,
                               all_layers)
      ->Arg(8)
      ->Arg(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
