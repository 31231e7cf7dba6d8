// balanced_kmeans: recovery of planted clusters, the balance constraint against vanilla
// K-means, determinism across seeds and thread counts, the empty-cluster rule, warm starts,
// centroid alignment and input validation.
#include "core/balanced_kmeans.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/base/vector_math.hpp"

namespace eldr {
namespace {

double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Box-Muller on our own uniforms, so the data is the same with every standard library.
float gaussian(std::mt19937_64& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]: log is finite
  const double u2 = uniform01(rng);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

struct planted_data {
  std::vector<float> points;    // N x D unit rows
  std::vector<uint32_t> label;  // the planted cluster of each point
  std::vector<float> centres;   // planted centres, K x D unit rows
};

// Points around random unit centres with Gaussian noise per coordinate; `non_negative` takes
// absolute values (like count signatures), which keeps every cosine >= 0.
planted_data make_planted(const std::vector<std::size_t>& sizes, std::size_t dim, float noise,
                          uint64_t seed, bool non_negative = false) {
  std::mt19937_64 rng(seed);
  planted_data d;
  d.centres.resize(sizes.size() * dim);
  for (std::size_t c = 0; c < sizes.size(); ++c) {
    for (std::size_t j = 0; j < dim; ++j) {
      const float v = gaussian(rng);
      d.centres[c * dim + j] = non_negative ? std::abs(v) : v;
    }
    normalize(&d.centres[c * dim], dim);
  }
  for (std::size_t c = 0; c < sizes.size(); ++c) {
    for (std::size_t i = 0; i < sizes[c]; ++i) {
      const std::size_t row = d.label.size();
      d.label.push_back(static_cast<uint32_t>(c));
      d.points.resize((row + 1) * dim);
      for (std::size_t j = 0; j < dim; ++j) {
        const float v = d.centres[c * dim + j] + noise * gaussian(rng);
        d.points[row * dim + j] = non_negative ? std::abs(v) : v;
      }
      normalize(&d.points[row * dim], dim);
    }
  }
  return d;
}

// True when the two labelings describe the same partition (labels may be renamed).
bool same_partition(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.size() != b.size()) return false;
  std::map<uint32_t, uint32_t> a_to_b, b_to_a;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto [x, fresh_x] = a_to_b.emplace(a[i], b[i]);
    auto [y, fresh_y] = b_to_a.emplace(b[i], a[i]);
    if (x->second != b[i] || y->second != a[i]) return false;
  }
  return true;
}

double recomputed_objective(const planted_data& d, const kmeans_result& r, std::size_t dim) {
  double total = 0.0;
  for (std::size_t i = 0; i < d.label.size(); ++i) {
    total += 1.0 - dot(&d.points[i * dim], &r.centroids[r.assignment[i] * dim], dim);
  }
  return total / static_cast<double>(d.label.size());
}

void expect_well_formed(const kmeans_result& r, std::size_t n, std::size_t dim, std::size_t k) {
  ASSERT_EQ(r.centroids.size(), k * dim);
  ASSERT_EQ(r.assignment.size(), n);
  ASSERT_EQ(r.cluster_sizes.size(), k);
  std::vector<uint32_t> sizes(k, 0);
  for (uint32_t c : r.assignment) {
    ASSERT_LT(c, k);
    ++sizes[c];
  }
  EXPECT_EQ(sizes, r.cluster_sizes);
  for (std::size_t c = 0; c < k; ++c) {
    EXPECT_NEAR(squared_norm(&r.centroids[c * dim], dim), 1.0f, 1e-5f) << "centroid " << c;
  }
  EXPECT_GE(r.iterations, 1u);
}

constexpr std::size_t kDim = 32;

TEST(BalancedKmeans, RecoversPlantedClusters) {
  const auto d = make_planted({40, 40, 40, 40}, kDim, 0.05f, 1);
  for (auto variant : {kmeans_variant::balanced, kmeans_variant::vanilla}) {
    kmeans_options opt;
    opt.seed = 42;
    opt.variant = variant;
    auto r = balanced_kmeans(d.points, kDim, 4, opt);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    expect_well_formed(*r, 160, kDim, 4);
    EXPECT_TRUE(same_partition(r->assignment, d.label));
    EXPECT_TRUE(r->converged);
    EXPECT_NEAR(r->objective, recomputed_objective(d, *r, kDim), 1e-9);
    // Each centroid lands on its planted centre.
    for (std::size_t c = 0; c < 4; ++c) {
      float best = -1.0f;
      for (std::size_t p = 0; p < 4; ++p) {
        best = std::max(best, dot(&r->centroids[c * kDim], &d.centres[p * kDim], kDim));
      }
      EXPECT_GT(best, 0.98f);
    }
  }
}

TEST(BalancedKmeans, BalancedObeysCapWhereVanillaDoesNot) {
  // One planted cluster holds 100 of 160 points; cap = ceil(160 / 4) = 40.
  const auto d = make_planted({100, 20, 20, 20}, kDim, 0.05f, 2);
  kmeans_options opt;
  opt.seed = 7;
  auto balanced = balanced_kmeans(d.points, kDim, 4, opt);
  opt.variant = kmeans_variant::vanilla;
  auto vanilla = balanced_kmeans(d.points, kDim, 4, opt);
  ASSERT_TRUE(balanced.ok() && vanilla.ok());
  expect_well_formed(*balanced, 160, kDim, 4);
  expect_well_formed(*vanilla, 160, kDim, 4);
  EXPECT_EQ(*std::max_element(balanced->cluster_sizes.begin(), balanced->cluster_sizes.end()), 40u);
  EXPECT_GT(*std::max_element(vanilla->cluster_sizes.begin(), vanilla->cluster_sizes.end()), 40u);
  EXPECT_TRUE(same_partition(vanilla->assignment, d.label));
  // Balance costs locality: the big cluster is split, so the mean distance is larger.
  EXPECT_GT(balanced->objective, vanilla->objective);
}

TEST(BalancedKmeans, WeightedCapacities) {
  const auto d = make_planted({60, 60, 60}, kDim, 0.05f, 3);
  kmeans_options opt;
  opt.worker_weights = {1.0, 1.0, 2.0};  // caps 45, 45, 90
  auto r = balanced_kmeans(d.points, kDim, 3, opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  expect_well_formed(*r, 180, kDim, 3);
  EXPECT_LE(r->cluster_sizes[0], 45u);
  EXPECT_LE(r->cluster_sizes[1], 45u);
  EXPECT_LE(r->cluster_sizes[2], 90u);
  EXPECT_EQ(r->cluster_sizes[0] + r->cluster_sizes[1] + r->cluster_sizes[2], 180u);
  // The heavy worker takes more than an equal share.
  EXPECT_GT(r->cluster_sizes[2], 60u);
}

TEST(BalancedKmeans, DeterministicForSeedAndThreadCount) {
  const auto d = make_planted({300, 200, 150, 100, 100, 80, 40, 30}, 64, 0.3f, 4);
  for (auto variant : {kmeans_variant::balanced, kmeans_variant::vanilla}) {
    kmeans_options opt;
    opt.seed = 99;
    opt.variant = variant;
    opt.threads = 1;
    auto one = balanced_kmeans(d.points, 64, 8, opt);
    auto again = balanced_kmeans(d.points, 64, 8, opt);
    opt.threads = 2;
    auto two = balanced_kmeans(d.points, 64, 8, opt);
    opt.threads = 3;
    auto three = balanced_kmeans(d.points, 64, 8, opt);
    ASSERT_TRUE(one.ok() && again.ok() && two.ok() && three.ok());
    for (const auto* other : {&*again, &*two, &*three}) {
      EXPECT_EQ(one->centroids, other->centroids);  // bitwise
      EXPECT_EQ(one->assignment, other->assignment);
      EXPECT_EQ(one->objective, other->objective);
      EXPECT_EQ(one->iterations, other->iterations);
    }
    // A different seed gives a different k-means++ start (and here a different first iterate).
    opt.seed = 100;
    opt.max_iterations = 1;
    auto other_seed = balanced_kmeans(d.points, 64, 8, opt);
    opt.seed = 99;
    auto same_seed = balanced_kmeans(d.points, 64, 8, opt);
    ASSERT_TRUE(other_seed.ok() && same_seed.ok());
    EXPECT_NE(other_seed->centroids, same_seed->centroids);
  }
}

TEST(BalancedKmeans, EmptyClusterKeepsItsCentroid) {
  // Non-negative points have cosine >= 0 with non-negative centroids and < 0 with the all-minus
  // centroid, so vanilla never assigns anything to cluster 2.
  const auto d = make_planted({30, 30}, kDim, 0.1f, 5, /*non_negative=*/true);
  kmeans_options opt;
  opt.variant = kmeans_variant::vanilla;
  opt.initial_centroids.assign(3 * kDim, -1.0f);
  std::copy_n(&d.points[0], kDim, &opt.initial_centroids[0]);
  std::copy_n(&d.points[30 * kDim], kDim, &opt.initial_centroids[kDim]);
  auto r = balanced_kmeans(d.points, kDim, 3, opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->cluster_sizes[2], 0u);
  std::vector<float> expected(kDim, -1.0f);
  normalize(expected.data(), kDim);
  EXPECT_EQ(std::vector<float>(r->centroids.begin() + 2 * kDim, r->centroids.end()), expected);
  EXPECT_TRUE(same_partition(r->assignment, d.label));
}

TEST(BalancedKmeans, WarmStartFromFixedPointConvergesImmediately) {
  const auto d = make_planted({50, 50, 50, 50}, kDim, 0.2f, 6);
  kmeans_options opt;
  opt.seed = 3;
  auto first = balanced_kmeans(d.points, kDim, 4, opt);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->converged);
  opt.initial_centroids = first->centroids;
  auto refit = balanced_kmeans(d.points, kDim, 4, opt);
  ASSERT_TRUE(refit.ok());
  EXPECT_EQ(refit->iterations, 1u);
  EXPECT_TRUE(refit->converged);
  EXPECT_EQ(refit->assignment, first->assignment);
  for (std::size_t i = 0; i < first->centroids.size(); ++i) {
    EXPECT_NEAR(refit->centroids[i], first->centroids[i], 1e-6f);
  }
}

TEST(BalancedKmeans, DegenerateSizes) {
  const auto d = make_planted({7, 5}, kDim, 0.3f, 8);
  // K = 1: the centroid is the normalised mean of all points.
  auto one = balanced_kmeans(d.points, kDim, 1);
  ASSERT_TRUE(one.ok());
  std::vector<float> mean(kDim, 0.0f);
  for (std::size_t i = 0; i < 12; ++i)
    axpy(1.0f, &d.points[i * kDim], mean.data(), kDim);
  normalize(mean.data(), kDim);
  for (std::size_t j = 0; j < kDim; ++j)
    EXPECT_NEAR(one->centroids[j], mean[j], 1e-6f);
  EXPECT_TRUE(one->converged);
  // N = K: every point is its own cluster and its own centroid.
  auto all = balanced_kmeans(d.points, kDim, 12);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->cluster_sizes, std::vector<uint32_t>(12, 1));
  EXPECT_NEAR(all->objective, 0.0, 1e-6);
  // Duplicate points (fewer distinct points than K) still give K valid centroids.
  std::vector<float> dup;
  for (int i = 0; i < 6; ++i)
    dup.insert(dup.end(), d.points.begin(), d.points.begin() + kDim);
  auto dups = balanced_kmeans(dup, kDim, 3);
  ASSERT_TRUE(dups.ok());
  EXPECT_EQ(dups->cluster_sizes, (std::vector<uint32_t>{2, 2, 2}));
}

TEST(BalancedKmeans, RejectsInvalidInput) {
  const auto d = make_planted({10, 10}, kDim, 0.1f, 9);
  auto expect_invalid = [](const result<kmeans_result>& r, const char* what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code(), status_code::invalid_argument) << what;
    EXPECT_FALSE(r.error().message().empty());
  };
  expect_invalid(balanced_kmeans(d.points, 0, 2), "D == 0");
  expect_invalid(balanced_kmeans(std::span<const float>(d.points).first(kDim * 3 - 1), kDim, 2),
                 "size not a multiple of D");
  expect_invalid(balanced_kmeans(std::span<const float>(), kDim, 2), "N == 0");
  expect_invalid(balanced_kmeans(d.points, kDim, 0), "K == 0");
  expect_invalid(balanced_kmeans(d.points, kDim, 21), "K > N");
  auto nan = d.points;
  nan[5 * kDim + 3] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(balanced_kmeans(nan, kDim, 2), "NaN");
  auto inf = d.points;
  inf[1] = std::numeric_limits<float>::infinity();
  expect_invalid(balanced_kmeans(inf, kDim, 2), "Inf");
  auto zero = d.points;
  std::fill_n(&zero[4 * kDim], kDim, 0.0f);
  expect_invalid(balanced_kmeans(zero, kDim, 2), "zero row");
  auto scaled = d.points;
  for (std::size_t j = 0; j < kDim; ++j)
    scaled[j] *= 2.0f;
  expect_invalid(balanced_kmeans(scaled, kDim, 2), "non-unit row");

  kmeans_options opt;
  opt.worker_weights = {1.0};
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "weights count");
  opt.worker_weights = {1.0, 0.0};
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "zero weight");
  opt.worker_weights = {1.0, -1.0};
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "negative weight");
  opt.worker_weights.clear();
  opt.initial_centroids.assign(kDim, 1.0f);
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "initial centroids size");
  opt.initial_centroids.assign(2 * kDim, 0.0f);
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "zero initial centroid");
  opt.initial_centroids.assign(2 * kDim, 1.0f);
  opt.initial_centroids[kDim] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "NaN initial centroid");
  opt.initial_centroids.clear();
  opt.max_iterations = 0;
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "max_iterations 0");
  opt.max_iterations = 5;
  opt.tolerance = -1.0;
  expect_invalid(balanced_kmeans(d.points, kDim, 2, opt), "negative tolerance");
}

TEST(AlignCentroids, RecoversAKnownPermutation) {
  const std::size_t k = 6, dim = 16;
  const auto d = make_planted({1, 1, 1, 1, 1, 1}, dim, 0.0f, 10);
  const std::vector<uint32_t> perm = {3, 0, 5, 1, 4, 2};
  // The refit found the same regions, slightly moved, in another order: old w is new perm[w].
  std::mt19937_64 rng(11);
  std::vector<float> moved(k * dim);
  for (std::size_t w = 0; w < k; ++w) {
    for (std::size_t j = 0; j < dim; ++j) {
      moved[perm[w] * dim + j] = d.centres[w * dim + j] + 0.05f * gaussian(rng);
    }
  }
  auto got = align_centroids(d.centres, moved, dim);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(*got, perm);

  // Applying it renames clusters so that worker w gets back the centroid near its old one.
  kmeans_result fit;
  fit.centroids = moved;
  fit.cluster_sizes = {10, 11, 12, 13, 14, 15};
  fit.assignment = {0, 1, 2, 3, 4, 5, 5};
  ASSERT_TRUE(apply_alignment(*got, fit).ok());
  for (std::size_t w = 0; w < k; ++w) {
    EXPECT_EQ(fit.cluster_sizes[w], 10u + perm[w]);
    EXPECT_TRUE(
        std::equal(&fit.centroids[w * dim], &fit.centroids[w * dim] + dim, &moved[perm[w] * dim]));
  }
  // Point 0 was in new cluster 0 = perm[1], so it now belongs to worker 1.
  EXPECT_EQ(fit.assignment, (std::vector<uint32_t>{1, 3, 5, 0, 4, 2, 2}));
}

TEST(AlignCentroids, RejectsInvalidInput) {
  const std::vector<float> a(8, 0.5f), b(12, 0.5f);
  EXPECT_FALSE(align_centroids(a, b, 4).ok());                            // different K
  EXPECT_FALSE(align_centroids(a, a, 0).ok());                            // D == 0
  EXPECT_FALSE(align_centroids(a, a, 3).ok());                            // not a multiple
  EXPECT_FALSE(align_centroids({}, {}, 4).ok());                          // K == 0
  EXPECT_FALSE(align_centroids(a, std::vector<float>(8, 0.0f), 4).ok());  // zero rows
  kmeans_result fit;
  fit.centroids = a;
  fit.cluster_sizes = {1, 1};
  fit.assignment = {0, 1};
  EXPECT_FALSE(apply_alignment(std::vector<uint32_t>{0, 0}, fit).ok());
  EXPECT_FALSE(apply_alignment(std::vector<uint32_t>{0, 2}, fit).ok());
  EXPECT_FALSE(apply_alignment(std::vector<uint32_t>{0}, fit).ok());
  EXPECT_TRUE(apply_alignment(std::vector<uint32_t>{1, 0}, fit).ok());
  EXPECT_EQ(fit.assignment, (std::vector<uint32_t>{1, 0}));
}

}  // namespace
}  // namespace eldr
