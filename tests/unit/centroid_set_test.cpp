// centroid_set: validation, normalisation, and scoring against a naive dot product.
#include "core/centroid_set.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace eldr {
namespace {

// Positive random rows, like normalised means of count signatures.
std::vector<float> random_rows(uint32_t k, uint32_t width, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> rows(static_cast<std::size_t>(k) * width);
  for (float& x : rows)
    x = u(gen);
  return rows;
}

// A unit-norm signature touching about density * width dimensions.
signature random_signature(uint32_t width, double density, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  signature s;
  s.width = width;
  double squared = 0.0;
  for (uint32_t d = 0; d < width; ++d) {
    if (u(gen) >= density) continue;
    const float v = static_cast<float>(u(gen) + 0.01);
    s.index.push_back(d);
    s.value.push_back(v);
    squared += static_cast<double>(v) * v;
  }
  for (float& v : s.value)
    v = static_cast<float>(v / std::sqrt(squared));
  return s;
}

// s_k = c_k . v in double, straight from the (normalised) rows.
std::vector<double> naive_scores(const centroid_set& set, const signature& v) {
  std::vector<double> out(set.k(), 0.0);
  for (uint32_t k = 0; k < set.k(); ++k) {
    const auto row = set.row(k);
    for (std::size_t i = 0; i < v.nnz(); ++i)
      out[k] += static_cast<double>(row[v.index[i]]) * v.value[i];
  }
  return out;
}

centroid_set make_set(uint32_t k, uint32_t width, uint32_t seed, uint64_t epoch = 1) {
  auto made = centroid_set::make(k, width, random_rows(k, width, seed), epoch);
  EXPECT_TRUE(made.ok()) << made.error().to_string();
  return std::move(made).value();
}

TEST(CentroidSet, MakeRenormalisesRowsAndKeepsDirection) {
  // Row 0 has norm 5 (3, 4), row 1 is already unit.
  auto made = centroid_set::make(2, 2, {3.0f, 4.0f, 0.0f, 1.0f}, 42);
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  EXPECT_EQ(made->k(), 2u);
  EXPECT_EQ(made->width(), 2u);
  EXPECT_EQ(made->epoch(), 42u);
  EXPECT_FLOAT_EQ(made->row(0)[0], 0.6f);
  EXPECT_FLOAT_EQ(made->row(0)[1], 0.8f);
  EXPECT_FLOAT_EQ(made->row(1)[0], 0.0f);
  EXPECT_FLOAT_EQ(made->row(1)[1], 1.0f);
  ASSERT_EQ(made->rows().size(), 4u);
  EXPECT_FLOAT_EQ(made->rows()[1], 0.8f);
}

TEST(CentroidSet, MakeRejectsMalformedInput) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct bad_case {
    uint32_t k, width;
    std::vector<float> rows;
    const char* must_mention;
  };
  const std::vector<bad_case> cases = {
      {0, 2, {}, "K must be >= 1"},
      {2, 0, {}, "width must be >= 1"},
      {2, 2, {1.0f, 0.0f, 1.0f}, "got 3"},
      {1, 2, {1.0f, nan}, "centroid 0 has a non-finite value at dimension 1"},
      {2, 2, {1.0f, 0.0f, inf, 0.0f}, "centroid 1 has a non-finite value at dimension 0"},
      {2, 2, {1.0f, 0.0f, 0.0f, 0.0f}, "centroid 1 is all zero"},
  };
  for (const bad_case& c : cases) {
    auto made = centroid_set::make(c.k, c.width, c.rows, 1);
    ASSERT_FALSE(made.ok()) << c.must_mention;
    EXPECT_EQ(made.error().code(), status_code::invalid_argument);
    EXPECT_NE(made.error().message().find(c.must_mention), std::string::npos)
        << made.error().message();
  }
}

// Every K in the list exercises a different mix of the kernel's 64/32/16/8-column blocks and its
// scalar tail (K = 13, 61); widths include both production ones.
TEST(CentroidSet, SparseAndDenseScoresMatchNaiveDotProduct) {
  const uint32_t ks[] = {1, 13, 16, 61, 64, 256};
  const uint32_t widths[] = {32, 1024, 6144};
  const double densities[] = {0.0, 0.02, 0.3, 0.97};
  uint32_t seed = 1;
  for (uint32_t k : ks) {
    for (uint32_t width : widths) {
      const centroid_set set = make_set(k, width, seed++);
      for (double density : densities) {
        const signature v = random_signature(width, density, seed++);
        std::vector<float> sparse(k), dense(k);
        ASSERT_TRUE(set.score(v, sparse).ok());
        std::vector<float> densified(width, 0.0f);
        for (std::size_t i = 0; i < v.nnz(); ++i)
          densified[v.index[i]] = v.value[i];
        ASSERT_TRUE(set.score_dense(densified, dense).ok());
        const std::vector<double> expected = naive_scores(set, v);
        for (uint32_t c = 0; c < k; ++c) {
          EXPECT_NEAR(sparse[c], expected[c], 1e-5)
              << "K=" << k << " D=" << width << " density=" << density << " k=" << c;
          EXPECT_NEAR(dense[c], expected[c], 1e-5) << "K=" << k << " D=" << width;
        }
      }
    }
  }
}

TEST(CentroidSet, ScoreOfUnitVectorIsCosine) {
  // A signature equal to a centroid scores exactly 1 against it.
  const centroid_set set = make_set(8, 64, 7);
  signature v;
  v.width = 64;
  for (uint32_t d = 0; d < 64; ++d) {
    v.index.push_back(d);
    v.value.push_back(set.row(5)[d]);
  }
  std::vector<float> s(8);
  ASSERT_TRUE(set.score(v, s).ok());
  EXPECT_NEAR(s[5], 1.0f, 1e-6);
  for (uint32_t k = 0; k < 8; ++k)
    EXPECT_LE(s[k], 1.0f + 1e-6f);
}

TEST(CentroidSet, EmptySignatureScoresZero) {
  const centroid_set set = make_set(16, 32, 3);
  signature v;
  v.width = 32;
  std::vector<float> s(16, 7.0f);
  ASSERT_TRUE(set.score(v, s).ok());
  for (float x : s)
    EXPECT_EQ(x, 0.0f);
}

TEST(CentroidSet, ScoreRejectsMalformedSignatures) {
  const centroid_set set = make_set(4, 16, 9);
  std::vector<float> s(4);
  auto expect_error = [&](const signature& v, std::span<float> out, const char* mention) {
    const status st = set.score(v, out);
    ASSERT_FALSE(st.ok()) << mention;
    EXPECT_EQ(st.code(), status_code::invalid_argument);
    EXPECT_NE(st.message().find(mention), std::string::npos) << st.message();
  };
  signature good;
  good.width = 16;
  good.index = {1, 5};
  good.value = {0.6f, 0.8f};
  ASSERT_TRUE(set.score(good, s).ok());

  signature v = good;
  v.width = 17;
  expect_error(v, s, "width 17 does not match the centroid set's width 16");
  v = good;
  v.value.push_back(0.1f);
  expect_error(v, s, "2 indices but 3 values");
  v = good;
  v.index = {5, 1};
  expect_error(v, s, "not strictly increasing at position 1");
  v = good;
  v.index = {5, 5};
  expect_error(v, s, "not strictly increasing");
  v = good;
  v.index = {1, 16};
  expect_error(v, s, "index 16 at position 1 is outside its width 16");
  v = good;
  v.value[0] = std::numeric_limits<float>::quiet_NaN();
  expect_error(v, s, "non-finite");
  v = good;
  v.value[1] = std::numeric_limits<float>::infinity();
  expect_error(v, s, "non-finite");
  std::vector<float> short_out(3);
  expect_error(good, short_out, "3 slots, expected K = 4");
}

TEST(CentroidSet, ScoreDenseRejectsMalformedInput) {
  const centroid_set set = make_set(4, 16, 9);
  std::vector<float> s(4);
  std::vector<float> v(15, 0.0f);
  EXPECT_EQ(set.score_dense(v, s).code(), status_code::invalid_argument);
  v.assign(16, 0.25f);
  std::vector<float> short_out(5);
  EXPECT_EQ(set.score_dense(v, short_out).code(), status_code::invalid_argument);
  v[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(set.score_dense(v, s).code(), status_code::invalid_argument);
}

}  // namespace
}  // namespace eldr
