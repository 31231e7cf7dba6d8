// route_codec_bench: the route protocol's codecs, which the node's frontend thread runs once per
// route request (decode the request, encode the reply) and every prefill client the other way:
// - request_decode / request_encode: a route_request of a 4,096-token prompt (256 block hashes,
//   id and model of a real client), without counts (every block a prefix hit), and with the
//   counts of its last 4 blocks (qwen-task synthetic, 48 x 128, top-8) nested;
// - reply_encode / reply_decode: the route_reply to it, plain and with an explanation of an
//   8-worker band.
// Written against the codec's public API alone, so the same file builds on an older tree for
// side-by-side runs (BENCHMARKS.md). Smoke mode: 4 blocks, a 4-layer model.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "core/expert_counts.hpp"
#include "core/sim/synthetic.hpp"

namespace {

eldr::route_request make_request(uint32_t blocks, bool with_counts) {
  eldr::route_request m;
  m.id = "cmpl-4f1d2c0e9a8b47d3b6a5e4f3c2d1b0a9";
  m.model = "qwen3-30b-a3b";
  for (uint32_t b = 0; b < blocks; ++b)
    m.block_hashes.push_back(0x9e3779b97f4a7c15ull * (b + 1));  // full-width, as vLLM's hashes
  if (!with_counts) return m;
  auto params = eldr::synthetic_preset("qwen-task").value();
  params.requests = 1;
  params.prompt_min = params.prompt_max = 4 * 16;
  params.output_min = params.output_max = 0;
  params.seed = 3;
  if (eldr::bench::smoke()) params.geometry.layers = 4;
  const eldr::trace tr = eldr::generate_synthetic(params).value();
  auto counted = eldr::count_blocks(tr.geometry, tr.requests[0].experts, 0, 4 * 16, 16).value();
  eldr::counts_message c;
  c.geometry = tr.geometry;
  for (size_t b = 0; b < counted.size(); ++b)
    c.blocks.push_back({m.block_hashes[blocks - counted.size() + b], std::nullopt, counted[b]});
  m.counts = std::move(c);
  return m;
}

eldr::route_reply make_reply(uint32_t blocks, bool explain) {
  eldr::route_reply m;
  m.id = "cmpl-4f1d2c0e9a8b47d3b6a5e4f3c2d1b0a9";
  m.worker = 5;
  m.endpoint = "tcp://10.0.0.17:5600";
  m.epoch = 12;
  m.covered_blocks = blocks;
  m.total_blocks = blocks;
  if (explain) {
    m.explain = eldr::route_explain{"eldr", 0.05f, {}};
    for (uint32_t k = 0; k < 8; ++k)
      m.explain->band.push_back({k, 0.9f - 0.01f * static_cast<float>(k)});
  }
  return m;
}

void request_decode(benchmark::State& state, const eldr::route_request& m) {
  const std::vector<uint8_t> bytes = eldr::encode_route_request(m);
  std::vector<eldr::kv_decode_issue> issues;
  for (auto _ : state) {
    auto d = eldr::decode_route_request(bytes, eldr::route_protocol_limits{}, issues);
    benchmark::DoNotOptimize(d);
  }
  state.counters["bytes"] = static_cast<double>(bytes.size());
}

void request_encode(benchmark::State& state, const eldr::route_request& m) {
  for (auto _ : state) {
    auto bytes = eldr::encode_route_request(m);
    benchmark::DoNotOptimize(bytes.data());
  }
}

void reply_decode(benchmark::State& state, const eldr::route_reply& m) {
  const std::vector<uint8_t> bytes = eldr::encode_route_reply(m);
  for (auto _ : state) {
    auto d = eldr::decode_route_reply(bytes, eldr::route_protocol_limits{});
    benchmark::DoNotOptimize(d);
  }
}

void reply_encode(benchmark::State& state, const eldr::route_reply& m) {
  for (auto _ : state) {
    auto bytes = eldr::encode_route_reply(m);
    benchmark::DoNotOptimize(bytes.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint32_t blocks = eldr::bench::smoke() ? 4 : 256;
  static const eldr::route_request plain = make_request(blocks, false);
  static const eldr::route_request counted = make_request(blocks, true);
  static const eldr::route_reply reply = make_reply(blocks, false);
  static const eldr::route_reply explained = make_reply(blocks, true);
  benchmark::RegisterBenchmark("request_decode/blocks", request_decode, plain);
  benchmark::RegisterBenchmark("request_decode/blocks+counts4", request_decode, counted);
  benchmark::RegisterBenchmark("request_encode/blocks", request_encode, plain);
  benchmark::RegisterBenchmark("request_encode/blocks+counts4", request_encode, counted);
  benchmark::RegisterBenchmark("reply_decode/plain", reply_decode, reply);
  benchmark::RegisterBenchmark("reply_decode/explain8", reply_decode, explained);
  benchmark::RegisterBenchmark("reply_encode/plain", reply_encode, reply);
  benchmark::RegisterBenchmark("reply_encode/explain8", reply_encode, explained);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
