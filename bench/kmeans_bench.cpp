// kmeans_bench: the offline fit (balanced spherical K-means, N = 20,000, D = 1,024, K = 64) next
// to the vanilla ablation, and the balanced assignment step alone at N = 20,000 and 100,000.
//
// Data: synthetic count-like signatures with planted structure. 64 sparse non-negative centres
// (48 active experts each) draw points with Zipf-like popularity, so vanilla K-means gives very
// unequal clusters and the balance constraint has work to do; each point keeps a jittered subset
// of its centre's experts plus a few random ones, then is L2-normalised. Fixed seed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "core/balanced_assignment.hpp"
#include "core/balanced_kmeans.hpp"
#include "core/base/vector_math.hpp"

namespace {

double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}
std::size_t uniform_index(std::mt19937_64& rng, std::size_t n) {
  return std::min(n - 1, static_cast<std::size_t>(uniform01(rng) * static_cast<double>(n)));
}

struct sparse_row {
  std::vector<uint32_t> index;
  std::vector<float> value;  // unit L2 norm overall
};

struct planted_set {
  std::size_t dim = 0;
  std::vector<float> centres;      // K x D, unit rows
  std::vector<sparse_row> points;  // N sparse unit rows
};

planted_set make_planted(std::size_t n, std::size_t dim, std::size_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  planted_set s;
  s.dim = dim;
  const std::size_t active = std::min<std::size_t>(48, dim / 2);
  const std::size_t spurious = std::max<std::size_t>(1, active / 6);
  std::vector<std::vector<uint32_t>> support(k);
  s.centres.assign(k * dim, 0.0f);
  for (std::size_t c = 0; c < k; ++c) {
    for (std::size_t a = 0; a < active; ++a) {
      const auto e = static_cast<uint32_t>(uniform_index(rng, dim));
      support[c].push_back(e);
      s.centres[c * dim + e] += static_cast<float>(0.1 + uniform01(rng));
    }
    eldr::normalize(&s.centres[c * dim], dim);
  }
  // Zipf-like popularity: centre c is drawn with weight 1 / (1 + c / 4).
  std::vector<double> cumulative(k);
  double total = 0.0;
  for (std::size_t c = 0; c < k; ++c)
    cumulative[c] = (total += 1.0 / (1.0 + c / 4.0));
  std::vector<float> dense(dim);
  s.points.resize(n);
  for (auto& p : s.points) {
    const double r = uniform01(rng) * total;
    const std::size_t c = std::min<std::size_t>(
        k - 1, std::upper_bound(cumulative.begin(), cumulative.end(), r) - cumulative.begin());
    std::fill(dense.begin(), dense.end(), 0.0f);
    for (uint32_t e : support[c]) {
      if (uniform01(rng) < 0.25) continue;  // this request skipped the expert
      dense[e] += s.centres[c * dim + e] * static_cast<float>(0.3 + 1.4 * uniform01(rng));
    }
    for (std::size_t a = 0; a < spurious; ++a) {
      dense[uniform_index(rng, dim)] += static_cast<float>(0.2 * uniform01(rng));
    }
    if (eldr::normalize(dense.data(), dim) == 0.0f) dense[c % dim] = 1.0f;
    for (std::size_t e = 0; e < dim; ++e) {
      if (dense[e] > 0.0f) {
        p.index.push_back(static_cast<uint32_t>(e));
        p.value.push_back(dense[e]);
      }
    }
  }
  return s;
}

std::vector<float> densify(const planted_set& s) {
  std::vector<float> out(s.points.size() * s.dim, 0.0f);
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    for (std::size_t j = 0; j < s.points[i].index.size(); ++j) {
      out[i * s.dim + s.points[i].index[j]] = s.points[i].value[j];
    }
  }
  return out;
}

// N x K similarities of the points to the planted centres: a realistic assignment-step input.
std::vector<float> planted_similarity(const planted_set& s, std::size_t k) {
  std::vector<float> sim(s.points.size() * k, 0.0f);
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    for (std::size_t c = 0; c < k; ++c) {
      float d = 0.0f;
      for (std::size_t j = 0; j < s.points[i].index.size(); ++j) {
        d += s.points[i].value[j] * s.centres[c * s.dim + s.points[i].index[j]];
      }
      sim[i * k + c] = d;
    }
  }
  return sim;
}

void fit_bench(benchmark::State& state, std::size_t n, std::size_t dim, std::size_t k,
               eldr::kmeans_variant variant) {
  const std::vector<float> points = densify(make_planted(n, dim, k, 2026));
  eldr::kmeans_options opt;
  opt.seed = 1;
  opt.variant = variant;
  eldr::kmeans_result last;
  for (auto _ : state) {
    auto r = eldr::balanced_kmeans(points, dim, k, opt);
    if (!r.ok()) {
      state.SkipWithError(r.error().to_string().c_str());
      return;
    }
    last = std::move(*r);
  }
  state.counters["objective"] = last.objective;
  state.counters["iterations"] = last.iterations;
  state.counters["converged"] = last.converged ? 1 : 0;
  state.counters["max_cluster"] =
      *std::max_element(last.cluster_sizes.begin(), last.cluster_sizes.end());
  state.counters["min_cluster"] =
      *std::min_element(last.cluster_sizes.begin(), last.cluster_sizes.end());
}

void assignment_bench(benchmark::State& state, std::size_t n, std::size_t dim, std::size_t k) {
  const std::vector<float> sim = planted_similarity(make_planted(n, dim, k, 7), k);
  const auto caps = *eldr::balanced_capacities(n, k);
  double total = 0.0;
  for (auto _ : state) {
    auto r = eldr::solve_balanced_assignment(sim, n, k, caps);
    if (!r.ok()) {
      state.SkipWithError(r.error().to_string().c_str());
      return;
    }
    // Not DoNotOptimize(total): benchmark 1.7's asm constraint garbles doubles held in xmm.
    benchmark::DoNotOptimize(r->cluster_of.data());
    total = r->total_similarity;
  }
  state.counters["mean_similarity"] = total / static_cast<double>(n);
}

void register_all() {
  struct fit_size {
    std::size_t n, dim, k;
  };
  const bool smoke = eldr::bench::smoke();
  const fit_size fit = smoke ? fit_size{200, 32, 4} : fit_size{20000, 1024, 64};
  for (auto [variant, name] : {std::pair{eldr::kmeans_variant::balanced, "balanced"},
                               std::pair{eldr::kmeans_variant::vanilla, "vanilla"}}) {
    const std::string label = std::string("kmeans_fit/") + name + "/N=" + std::to_string(fit.n) +
                              "/D=" + std::to_string(fit.dim) + "/K=" + std::to_string(fit.k);
    benchmark::RegisterBenchmark(label.c_str(),
                                 [fit, variant = variant](benchmark::State& st) {
                                   fit_bench(st, fit.n, fit.dim, fit.k, variant);
                                 })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  const std::vector<fit_size> assign =
      smoke ? std::vector<fit_size>{{200, 32, 4}}
            : std::vector<fit_size>{{20000, 1024, 64}, {100000, 1024, 64}};
  for (const fit_size& a : assign) {
    const std::string label =
        "balanced_assignment/N=" + std::to_string(a.n) + "/K=" + std::to_string(a.k);
    benchmark::RegisterBenchmark(
        label.c_str(), [a](benchmark::State& st) { assignment_bench(st, a.n, a.dim, a.k); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
