// balanced_assignment: capacities, the scalable cluster-graph solver against the exact Hungarian
// reference, degenerate and adversarial instances, and input validation.
#include "core/balanced_assignment.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace eldr {
namespace {

// Library-independent uniform in [lo, hi).
float uniform(std::mt19937_64& rng, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

std::vector<float> random_similarity(std::size_t n, std::size_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> sim(n * k);
  for (float& s : sim)
    s = uniform(rng, -1.0f, 1.0f);
  return sim;
}

// Every point in one cluster, no cluster over capacity, sizes and total consistent.
void expect_feasible(const cluster_assignment& a, std::span<const float> sim, std::size_t n,
                     std::size_t k, std::span<const uint32_t> caps) {
  ASSERT_EQ(a.cluster_of.size(), n);
  ASSERT_EQ(a.sizes.size(), k);
  std::vector<uint32_t> sizes(k, 0);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_LT(a.cluster_of[i], k);
    ++sizes[a.cluster_of[i]];
    total += sim[i * k + a.cluster_of[i]];
  }
  EXPECT_EQ(sizes, a.sizes);
  for (std::size_t c = 0; c < k; ++c)
    EXPECT_LE(a.sizes[c], caps[c]) << "cluster " << c;
  EXPECT_NEAR(total, a.total_similarity, 1e-9 * static_cast<double>(n));
}

// Solves with both solvers, checks both feasible and that the scalable one is optimal: equal to
// the reference up to float rounding of similarity differences (it is exact), and in any case
// within 1% of the optimal cost sum(1 - sim).
void expect_matches_exact(std::span<const float> sim, std::size_t n, std::size_t k,
                          std::span<const uint32_t> caps) {
  auto fast = solve_balanced_assignment(sim, n, k, caps);
  auto exact = solve_balanced_assignment_exact(sim, n, k, caps);
  ASSERT_TRUE(fast.ok()) << fast.error().to_string();
  ASSERT_TRUE(exact.ok()) << exact.error().to_string();
  expect_feasible(*fast, sim, n, k, caps);
  expect_feasible(*exact, sim, n, k, caps);
  const double fast_cost = static_cast<double>(n) - fast->total_similarity;
  const double exact_cost = static_cast<double>(n) - exact->total_similarity;
  EXPECT_LE(fast_cost, exact_cost * 1.01 + 1e-9) << "N=" << n << " K=" << k;
  EXPECT_NEAR(fast->total_similarity, exact->total_similarity, 1e-6 * static_cast<double>(n))
      << "N=" << n << " K=" << k;
}

TEST(Capacities, BalancedIsCeilOfNOverK) {
  EXPECT_EQ(*balanced_capacities(10, 3), (std::vector<uint32_t>{4, 4, 4}));
  EXPECT_EQ(*balanced_capacities(9, 3), (std::vector<uint32_t>{3, 3, 3}));
  EXPECT_EQ(*balanced_capacities(5, 5), (std::vector<uint32_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(*balanced_capacities(7, 1), (std::vector<uint32_t>{7}));
}

TEST(Capacities, WeightedAreProportionalAndCoverN) {
  const std::vector<double> w = {1.0, 1.0, 2.0};
  EXPECT_EQ(*weighted_capacities(100, w), (std::vector<uint32_t>{25, 25, 50}));
  EXPECT_EQ(*weighted_capacities(101, w), (std::vector<uint32_t>{26, 26, 51}));
  std::mt19937_64 rng(7);
  for (std::size_t n = 1; n <= 300; n += 7) {
    const std::size_t k = 1 + rng() % std::min<std::size_t>(n, 12);
    std::vector<double> weights(k);
    for (double& x : weights)
      x = 0.01 + uniform(rng, 0.0f, 5.0f);
    auto caps = weighted_capacities(n, weights);
    ASSERT_TRUE(caps.ok()) << caps.error().to_string();
    const double sum_w = std::accumulate(weights.begin(), weights.end(), 0.0);
    uint64_t total = 0;
    for (std::size_t c = 0; c < k; ++c) {
      EXPECT_GE((*caps)[c], 1u);
      // ceil(N w / sum), give or take the one unit a rounding shortfall may add.
      EXPECT_NEAR((*caps)[c], std::ceil(static_cast<double>(n) * weights[c] / sum_w), 1.0);
      total += (*caps)[c];
    }
    EXPECT_GE(total, n);
  }
}

TEST(Capacities, RejectInvalidInput) {
  EXPECT_EQ(balanced_capacities(0, 3).error().code(), status_code::invalid_argument);
  EXPECT_EQ(balanced_capacities(3, 0).error().code(), status_code::invalid_argument);
  EXPECT_EQ(balanced_capacities(3, 4).error().code(), status_code::invalid_argument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::vector<double>& bad :
       std::vector<std::vector<double>>{{}, {1.0, 0.0}, {1.0, -2.0}, {1.0, nan}, {inf, 1.0}}) {
    auto caps = weighted_capacities(10, bad);
    ASSERT_FALSE(caps.ok());
    EXPECT_EQ(caps.error().code(), status_code::invalid_argument);
  }
  EXPECT_FALSE(weighted_capacities(0, std::vector<double>{1.0}).ok());
  EXPECT_FALSE(weighted_capacities(1, std::vector<double>{1.0, 1.0}).ok());  // K > N
}

TEST(BalancedAssignment, MatchesExactOnRandomInstances) {
  uint64_t seed = 1;
  for (std::size_t n : {10, 100, 500, 2000}) {
    for (std::size_t k : {2, 7, 16, 64}) {
      if (k > n) continue;
      // The replicated-slot reference is slowest with few, large clusters (K = 2 at N = 2,000
      // takes seconds); small K is covered at N = 500.
      if (n == 2000 && k < 16) continue;
      SCOPED_TRACE(testing::Message() << "N=" << n << " K=" << k);
      const auto sim = random_similarity(n, k, seed++);
      const auto caps = *balanced_capacities(n, k);
      expect_matches_exact(sim, n, k, caps);
    }
  }
}

TEST(BalancedAssignment, MatchesExactWithUnevenAndLooseCapacities) {
  for (uint64_t seed = 100; seed < 106; ++seed) {
    std::mt19937_64 rng(seed);
    const std::size_t n = 150 + rng() % 150;
    const std::size_t k = 2 + rng() % 20;
    std::vector<double> weights(k);
    for (double& w : weights)
      w = 0.2 + uniform(rng, 0.0f, 3.0f);
    auto caps = *weighted_capacities(n, weights);
    if (seed % 2 == 0) {
      for (auto& c : caps)
        c += static_cast<uint32_t>(rng() % 5);  // slack
    }
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " N=" << n << " K=" << k);
    expect_matches_exact(random_similarity(n, k, seed), n, k, caps);
  }
}

TEST(BalancedAssignment, AdversarialAllPreferOneCluster) {
  const std::size_t n = 400, k = 8;
  std::mt19937_64 rng(3);
  std::vector<float> sim(n * k);
  for (std::size_t i = 0; i < n; ++i) {
    sim[i * k] = 0.9f + uniform(rng, 0.0f, 0.1f);
    for (std::size_t c = 1; c < k; ++c)
      sim[i * k + c] = uniform(rng, -0.2f, 0.3f);
  }
  const auto caps = *balanced_capacities(n, k);
  auto fast = solve_balanced_assignment(sim, n, k, caps);
  ASSERT_TRUE(fast.ok());
  expect_feasible(*fast, sim, n, k, caps);
  EXPECT_EQ(fast->sizes[0], caps[0]);  // the popular cluster is filled exactly to its cap
  expect_matches_exact(sim, n, k, caps);

  // Identical rows: every point ranks the clusters the same way.
  std::vector<float> same(n * k);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < k; ++c)
      same[i * k + c] = 1.0f - 0.1f * static_cast<float>(c);
  }
  auto s = solve_balanced_assignment(same, n, k, caps);
  ASSERT_TRUE(s.ok());
  expect_feasible(*s, same, n, k, caps);
  EXPECT_EQ(s->sizes, caps);  // n == k * cap: every cluster exactly full
}

TEST(BalancedAssignment, DegenerateInstances) {
  // All similarities equal: any feasible assignment is optimal.
  {
    const std::size_t n = 50, k = 7;
    const std::vector<float> sim(n * k, 0.25f);
    const auto caps = *balanced_capacities(n, k);
    auto a = solve_balanced_assignment(sim, n, k, caps);
    ASSERT_TRUE(a.ok());
    expect_feasible(*a, sim, n, k, caps);
    EXPECT_DOUBLE_EQ(a->total_similarity, 0.25 * n);
  }
  // K = 1: everything in the single cluster.
  {
    const std::size_t n = 9;
    const auto sim = random_similarity(n, 1, 11);
    const std::vector<uint32_t> caps = {9};
    auto a = solve_balanced_assignment(sim, n, 1, caps);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->sizes, caps);
  }
  // N = K with caps of one: a permutation, the classic assignment problem.
  {
    const std::size_t n = 12;
    const auto sim = random_similarity(n, n, 12);
    const std::vector<uint32_t> caps(n, 1);
    expect_matches_exact(sim, n, n, caps);
  }
  // Capacities that are exactly tight and uneven, including a zero capacity.
  {
    const std::size_t n = 60, k = 5;
    const auto sim = random_similarity(n, k, 13);
    const std::vector<uint32_t> caps = {30, 0, 10, 15, 5};
    auto a = solve_balanced_assignment(sim, n, k, caps);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->sizes, caps);
    expect_matches_exact(sim, n, k, caps);
  }
  // Heavy ties: similarities from {0, 0.5, 1}.
  {
    const std::size_t n = 300, k = 9;
    std::mt19937_64 rng(14);
    std::vector<float> sim(n * k);
    for (float& s : sim)
      s = 0.5f * static_cast<float>(rng() % 3);
    expect_matches_exact(sim, n, k, *balanced_capacities(n, k));
  }
}

TEST(BalancedAssignment, HandCheckedInstance) {
  // Both points prefer cluster 0, which holds one; point 1 loses less by moving (0.9 - 0.8 vs
  // 1.0 - 0.1), so point 0 keeps cluster 0.
  const std::vector<float> sim = {1.0f, 0.1f, 0.9f, 0.8f};
  const std::vector<uint32_t> caps = {1, 1};
  auto a = solve_balanced_assignment(sim, 2, 2, caps);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->cluster_of, (std::vector<uint32_t>{0, 1}));
  EXPECT_NEAR(a->total_similarity, 1.8, 1e-6);
}

TEST(BalancedAssignment, LargeInstanceIsFeasibleAndDeterministic) {
  const std::size_t n = 20000, k = 64;
  // Planted preference: point i likes cluster i % 13 (an imbalanced subset) most.
  std::mt19937_64 rng(21);
  std::vector<float> sim(n * k);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < k; ++c)
      sim[i * k + c] = uniform(rng, 0.0f, 0.5f);
    sim[i * k + i % 13] += 0.5f;
  }
  const auto caps = *balanced_capacities(n, k);
  auto a = solve_balanced_assignment(sim, n, k, caps);
  auto b = solve_balanced_assignment(sim, n, k, caps);
  ASSERT_TRUE(a.ok() && b.ok());
  expect_feasible(*a, sim, n, k, caps);
  EXPECT_EQ(a->cluster_of, b->cluster_of);
}

TEST(BalancedAssignment, RejectsInvalidInput) {
  const auto sim = random_similarity(4, 2, 5);
  const std::vector<uint32_t> caps = {2, 2};
  auto expect_invalid = [](const result<cluster_assignment>& r) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    EXPECT_FALSE(r.error().message().empty());
  };
  for (auto solve : {&solve_balanced_assignment, &solve_balanced_assignment_exact}) {
    expect_invalid(solve(sim, 4, 3, caps));                         // N*K mismatch
    expect_invalid(solve(sim, 0, 2, caps));                         // N == 0
    expect_invalid(solve(std::span<const float>(), 4, 0, caps));    // K == 0
    expect_invalid(solve(random_similarity(2, 4, 1), 2, 4, caps));  // K > N
    expect_invalid(solve(sim, 4, 2, std::vector<uint32_t>{2}));     // caps size
    expect_invalid(solve(sim, 4, 2, std::vector<uint32_t>{2, 1}));  // caps < N
    auto nan = sim;
    nan[3] = std::numeric_limits<float>::quiet_NaN();
    expect_invalid(solve(nan, 4, 2, caps));
    auto inf = sim;
    inf[0] = -std::numeric_limits<float>::infinity();
    expect_invalid(solve(inf, 4, 2, caps));
  }
  EXPECT_EQ(solve_balanced_assignment_exact(random_similarity(6000, 1, 1), 6000, 1,
                                            std::vector<uint32_t>{6000})
                .error()
                .code(),
            status_code::out_of_range);
}

TEST(LinearAssignment, SolvesSquareAndRectangular) {
  // Of the six permutations, (2, 0, 1) is the cheapest: 1 + 8 + 2 = 11.
  const std::vector<double> square = {10, 9, 1, 8, 20, 7, 3, 2, 30};
  auto a = solve_linear_assignment(square, 3, 3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<uint32_t>{2, 0, 1}));
  const std::vector<double> wide = {5, 1, 9, 4, 3, 0};  // 2 x 3
  auto b = solve_linear_assignment(wide, 2, 3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<uint32_t>{1, 2}));
  EXPECT_FALSE(solve_linear_assignment(wide, 3, 2).ok());  // rows > cols
  EXPECT_FALSE(solve_linear_assignment(wide, 2, 2).ok());  // size mismatch
  EXPECT_FALSE(solve_linear_assignment({}, 0, 0).ok());
  std::vector<double> nan = wide;
  nan[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(solve_linear_assignment(nan, 2, 3).ok());
}

}  // namespace
}  // namespace eldr
