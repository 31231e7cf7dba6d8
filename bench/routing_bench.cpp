// routing_bench: one routing decision per iteration, the router's per-request hot path.
//
// - eldr_route: scores against K centroids, the locality band (tau 0.1, widen_single), the
//   least-loaded pick; K = 16, 64, 256 and widths 1,024 and 6,144 (8 and 48 layers x 128
//   experts), for a long prompt (1,024 tokens: a near-dense signature) and a short one (4 tokens).
// - eldr_adaptive_route: the same decision under "eldr-adaptive" (the band within a load slack,
//   least-recently-routed tie-break), on the same inputs, for the side-by-side comparison.
// - score_transposed / score_dense: the two scoring paths on the same near-dense signature, the
//   measurement behind centroid_set's choice (dense includes scattering v into a dense buffer).
// - jsq_route, p2c_route: the load-only baselines, for scale.
//
// Data: centroids with positive random entries (like normalised means of count signatures);
// signatures from a prompt whose tokens each pick top-8 distinct experts per layer with a skewed,
// per-layer-permuted popularity; loads uniform in [0, 32). Fixed seeds. Smoke mode: K = 4,
// width 32.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "core/centroid_set.hpp"
#include "core/routing.hpp"

namespace {

constexpr uint32_t experts_per_layer = 128;
constexpr uint32_t top_k = 8;

// A domain's expert popularity: per layer, experts in order from most to least popular.
struct popularity {
  uint32_t experts = 0;
  uint32_t layers = 0;
  std::vector<uint32_t> order;  // layers x experts
};

popularity domain_popularity(uint32_t width, uint64_t seed) {
  popularity p;
  p.experts = std::min(experts_per_layer, width);
  p.layers = width / p.experts;
  p.order.resize(static_cast<std::size_t>(p.layers) * p.experts);
  std::mt19937_64 rng(seed);
  for (uint32_t l = 0; l < p.layers; ++l) {
    auto first = p.order.begin() + static_cast<std::ptrdiff_t>(l) * p.experts;
    std::iota(first, first + p.experts, 0u);
    std::shuffle(first, first + p.experts, rng);
  }
  return p;
}

// Expert counts of a prompt of `tokens` tokens from a domain, as a unit-norm signature.
eldr::signature prompt_signature(const popularity& pop, uint32_t tokens, uint64_t seed) {
  const uint32_t k = std::min(top_k, pop.experts);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const uint32_t width = pop.layers * pop.experts;
  std::vector<float> counts(width, 0.0f);
  for (uint32_t l = 0; l < pop.layers; ++l) {
    const uint32_t* order = pop.order.data() + static_cast<std::size_t>(l) * pop.experts;
    float* layer = counts.data() + static_cast<std::size_t>(l) * pop.experts;
    for (uint32_t t = 0; t < tokens; ++t) {
      uint32_t chosen[top_k];
      for (uint32_t j = 0; j < k; ++j) {
        uint32_t e = 0;
        bool fresh = false;
        while (!fresh) {  // u^2 skews draws towards the popular end
          const double x = u(rng);
          e = order[std::min(pop.experts - 1, static_cast<uint32_t>(x * x * pop.experts))];
          fresh = std::find(chosen, chosen + j, e) == chosen + j;
        }
        chosen[j] = e;
        layer[e] += 1.0f;
      }
    }
  }
  eldr::signature s;
  s.width = width;
  double squared = 0.0;
  for (float c : counts)
    squared += static_cast<double>(c) * c;
  for (uint32_t d = 0; d < width; ++d) {
    if (counts[d] == 0.0f) continue;
    s.index.push_back(d);
    s.value.push_back(static_cast<float>(counts[d] / std::sqrt(squared)));
  }
  return s;
}

// One centroid per worker, each the signature of a 512-token prompt of its own domain.
std::shared_ptr<const eldr::centroid_set> domain_centroids(uint32_t k, uint32_t width) {
  std::vector<float> rows(static_cast<std::size_t>(k) * width, 0.0f);
  for (uint32_t c = 0; c < k; ++c) {
    const eldr::signature s = prompt_signature(domain_popularity(width, 100 + c), 512, c);
    for (std::size_t i = 0; i < s.nnz(); ++i)
      rows[static_cast<std::size_t>(c) * width + s.index[i]] = s.value[i];
  }
  auto set = eldr::centroid_set::make(k, width, std::move(rows), 1);
  return std::make_shared<const eldr::centroid_set>(std::move(set).value());
}

// A request from the domain of worker k / 3's centroid.
eldr::signature request_signature(uint32_t k, uint32_t width, uint32_t tokens) {
  return prompt_signature(domain_popularity(width, 100 + k / 3), tokens, 11);
}

std::vector<uint32_t> random_loads(uint32_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> load(k);
  for (uint32_t& l : load)
    l = static_cast<uint32_t>(rng() % 32);
  return load;
}

void centroid_route(benchmark::State& state, const char* name, uint32_t k, uint32_t width,
                    uint32_t tokens) {
  eldr::policy_config config;
  config.centroids = domain_centroids(k, width);
  auto policy = std::move(eldr::make_policy(name, config)).value();
  const eldr::signature sig = request_signature(k, width, tokens);
  const std::vector<uint32_t> load = random_loads(k, 13);
  const eldr::route_input in{&sig, load, {}, -1};
  uint64_t band = 0;
  for (auto _ : state) {
    auto d = policy->route(in);
    benchmark::DoNotOptimize(d);
    band += d->band_size;
  }
  state.counters["nnz"] = static_cast<double>(sig.nnz());
  state.counters["band"] = static_cast<double>(band) / static_cast<double>(state.iterations());
}

void score_transposed(benchmark::State& state, uint32_t k, uint32_t width, uint32_t tokens) {
  const auto set = domain_centroids(k, width);
  const eldr::signature sig = request_signature(k, width, tokens);
  std::vector<float> out(k);
  for (auto _ : state) {
    benchmark::DoNotOptimize(set->score(sig, out));
    benchmark::ClobberMemory();
  }
  state.counters["nnz"] = static_cast<double>(sig.nnz());
}

void score_dense(benchmark::State& state, uint32_t k, uint32_t width, uint32_t tokens) {
  const auto set = domain_centroids(k, width);
  const eldr::signature sig = request_signature(k, width, tokens);
  std::vector<float> out(k), dense(width);
  for (auto _ : state) {
    std::fill(dense.begin(), dense.end(), 0.0f);
    for (std::size_t i = 0; i < sig.nnz(); ++i)
      dense[sig.index[i]] = sig.value[i];
    benchmark::DoNotOptimize(set->score_dense(dense, out));
    benchmark::ClobberMemory();
  }
  state.counters["nnz"] = static_cast<double>(sig.nnz());
}

void baseline_route(benchmark::State& state, const char* name, uint32_t k) {
  eldr::policy_config config;
  config.workers = k;
  config.seed = 5;
  auto policy = std::move(eldr::make_policy(name, config)).value();
  const std::vector<uint32_t> load = random_loads(k, 13);
  const eldr::route_input in{nullptr, load, {}, -1};
  for (auto _ : state)
    benchmark::DoNotOptimize(policy->route(in));
}

void register_all() {
  const bool smoke = eldr::bench::smoke();
  const std::vector<uint32_t> ks =
      smoke ? std::vector<uint32_t>{4} : std::vector<uint32_t>{16, 64, 256};
  const std::vector<uint32_t> widths =
      smoke ? std::vector<uint32_t>{32} : std::vector<uint32_t>{1024, 6144};
  struct prompt {
    const char* name;
    uint32_t tokens;
  };
  const prompt prompts[] = {{"long", 1024}, {"short", 4}};

  for (uint32_t width : widths)
    for (uint32_t k : ks)
      for (const prompt& p : prompts) {
        const std::string suffix =
            "/K:" + std::to_string(k) + "/width:" + std::to_string(width) + "/prompt:" + p.name;
        benchmark::RegisterBenchmark(("eldr_route" + suffix).c_str(), centroid_route, "eldr", k,
                                     width, p.tokens)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("eldr_adaptive_route" + suffix).c_str(), centroid_route,
                                     "eldr-adaptive", k, width, p.tokens)
            ->Unit(benchmark::kMicrosecond);
      }
  // The scoring paths compared on the near-dense case, where a dense kernel could plausibly win.
  for (uint32_t width : widths)
    for (uint32_t k : ks) {
      const std::string suffix =
          "/K:" + std::to_string(k) + "/width:" + std::to_string(width) + "/prompt:long";
      benchmark::RegisterBenchmark(("score_transposed" + suffix).c_str(), score_transposed, k,
                                   width, 1024u)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("score_dense" + suffix).c_str(), score_dense, k, width, 1024u)
          ->Unit(benchmark::kMicrosecond);
    }
  for (uint32_t k : ks) {
    benchmark::RegisterBenchmark(("jsq_route/K:" + std::to_string(k)).c_str(), baseline_route,
                                 "jsq", k);
    benchmark::RegisterBenchmark(("p2c_route/K:" + std::to_string(k)).c_str(), baseline_route,
                                 "p2c", k);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
