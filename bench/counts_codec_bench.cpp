// counts_codec_bench: the byte formats on the route path, per KV block of 16 tokens of the
// qwen-task synthetic workload (48 layers x 128 experts, top-8):
// - counts_decode: decode_counts_message of a 64-block counts message (the node's frontend
//   thread decodes one per route request whose prefill computed blocks);
// - counts_encode: encode_counts_message of it (the prefill side, and the router's shard stores);
// - record_encode: the signature cache's stored value of one block (12-layer mask);
// - record_validate: validate_counts of it (every value read from RocksDB);
// - record_add: add_counts of it into a masked sum (every block of every prefix lookup).
// The same cases of a Qwen3-Next-shaped model (48 x 512, top-10: ids in two bytes) are registered
// when this build has the qwen3-next-task preset. Written against APIs that predate wide ids, so
// the same file builds on an older tree for side-by-side runs (BENCHMARKS.md).
// Smoke mode: a 4-layer model, 2 blocks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "cluster/wire/counts_message.hpp"
#include "core/expert_counts.hpp"
#include "core/sim/synthetic.hpp"
#include "storage/block_record.hpp"

namespace {

struct fixture {
  eldr::model_geometry g;
  std::vector<uint8_t> message;  // encoded, 64 blocks
  eldr::counts_message decoded;
  std::vector<uint32_t> mask;
  std::vector<std::string> records;  // one stored value per block
};

fixture make_fixture(const char* preset, uint32_t blocks) {
  auto params = eldr::synthetic_preset(preset).value();
  params.requests = 1;
  params.prompt_min = params.prompt_max = blocks * 16;
  params.output_min = params.output_max = 0;
  params.seed = 3;
  if (eldr::bench::smoke()) params.geometry.layers = 4;
  const eldr::trace tr = eldr::generate_synthetic(params).value();
  fixture f;
  f.g = tr.geometry;
  const auto& ids = tr.requests[0].experts;  // uint8_t before wide ids, expert_id after
  auto counted = eldr::count_blocks(f.g, ids, 0, blocks * 16, 16).value();
  f.decoded.geometry = f.g;
  for (std::size_t b = 0; b < counted.size(); ++b)
    f.decoded.blocks.push_back(
        {0x1000 + b, b ? std::optional<uint64_t>(0xfff + b) : std::nullopt, counted[b]});
  f.message = eldr::encode_counts_message(f.decoded);
  const uint32_t mask_layers = std::min<uint32_t>(12, f.g.layers);
  for (uint32_t l = 0; l < mask_layers; ++l)
    f.mask.push_back(l * f.g.layers / mask_layers);
  for (const auto& b : counted) {
    std::string bytes;
    eldr::record::encode_counts(b, f.mask, f.g.experts, bytes);
    f.records.push_back(std::move(bytes));
  }
  return f;
}

void counts_decode(benchmark::State& state, const fixture& f) {
  std::vector<eldr::kv_decode_issue> issues;
  for (auto _ : state) {
    auto m = eldr::decode_counts_message(f.message, {}, issues);
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.decoded.blocks.size()));
  state.counters["bytes"] = static_cast<double>(f.message.size());
}

void counts_encode(benchmark::State& state, const fixture& f) {
  for (auto _ : state) {
    auto bytes = eldr::encode_counts_message(f.decoded);
    benchmark::DoNotOptimize(bytes.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.decoded.blocks.size()));
}

void record_encode(benchmark::State& state, const fixture& f) {
  std::string bytes;
  for (auto _ : state) {
    for (const auto& b : f.decoded.blocks) {
      eldr::record::encode_counts(b.counts, f.mask, f.g.experts, bytes);
      benchmark::DoNotOptimize(bytes.data());
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.decoded.blocks.size()));
}

void record_validate(benchmark::State& state, const fixture& f) {
  const auto layers = static_cast<uint32_t>(f.mask.size());
  for (auto _ : state)
    for (const std::string& r : f.records)
      benchmark::DoNotOptimize(eldr::record::validate_counts(r, layers, f.g.experts));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.records.size()));
}

void record_add(benchmark::State& state, const fixture& f) {
  std::vector<uint32_t> sum(f.mask.size() * f.g.experts, 0);
  for (auto _ : state) {
    for (const std::string& r : f.records)
      eldr::record::add_counts(r, f.g.experts, sum);
    benchmark::DoNotOptimize(sum.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.records.size()));
}

void register_all(const std::string& name, const fixture& f) {
  benchmark::RegisterBenchmark(("counts_decode/64x16tok/" + name).c_str(), counts_decode, f);
  benchmark::RegisterBenchmark(("counts_encode/64x16tok/" + name).c_str(), counts_encode, f);
  benchmark::RegisterBenchmark(("record_encode/64x16tok/" + name + "/mask12").c_str(),
                               record_encode, f);
  benchmark::RegisterBenchmark(("record_validate/64x16tok/" + name + "/mask12").c_str(),
                               record_validate, f);
  benchmark::RegisterBenchmark(("record_add/64x16tok/" + name + "/mask12").c_str(), record_add, f);
}

}  // namespace

int main(int argc, char** argv) {
  const uint32_t blocks = eldr::bench::smoke() ? 2 : 64;
  static const fixture narrow = make_fixture("qwen-task", blocks);
  register_all("48x128", narrow);
  static fixture wide;
  if (eldr::synthetic_preset("qwen3-next-task").ok()) {
    wide = make_fixture("qwen3-next-task", blocks);
    register_all("48x512", wide);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
