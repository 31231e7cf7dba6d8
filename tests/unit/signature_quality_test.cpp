// signature_quality: Spearman, rho and greedy layer selection on data with a known answer.
#include "core/signature_quality.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "core/base/random.hpp"

namespace eldr {
namespace {

TEST(Spearman, KnownValues) {
  const std::vector<double> a = {1, 2, 3, 4, 5};
  const std::vector<double> b = {10, 20, 30, 40, 50};
  const std::vector<double> c = {5, 4, 3, 2, 1};
  EXPECT_NEAR(*spearman(a, b), 1.0, 1e-12);
  EXPECT_NEAR(*spearman(a, c), -1.0, 1e-12);
  // Monotone but non-linear: still 1.
  const std::vector<double> sq = {1, 4, 9, 16, 25};
  EXPECT_NEAR(*spearman(a, sq), 1.0, 1e-12);
  // Ties get average ranks: x ranks (1, 2.5, 2.5, 4), y = identity -> 0.9486833.
  const std::vector<double> x = {1, 2, 2, 3}, y = {1, 2, 3, 4};
  EXPECT_NEAR(*spearman(x, y), 0.9486832980505138, 1e-9);
  EXPECT_EQ(*spearman(std::vector<double>{1, 1, 1}, std::vector<double>{1, 2, 3}), 0.0);
  EXPECT_FALSE(spearman(a, std::vector<double>{1, 2}).ok());
  EXPECT_FALSE(spearman(std::vector<double>{1}, std::vector<double>{1}).ok());
}

// A calibration set with a known answer. Each request has three hidden attributes a, b, c in
// 0..3. Prefill shows a at layer 0, b at layer 1 and c (irrelevant to decode) at layers 2 and 3;
// decode shows a at layers 0-1 and b at layers 2-3. So decode overlap depends on a and b: the
// best signature keeps exactly layers 0 and 1, and layers 2-3 alone carry no information.
calibration_counts planted(uint32_t n, uint64_t seed) {
  const model_geometry g{4, 8, 1};
  calibration_counts cal;
  cal.geometry = g;
  cal.prefill.assign(std::size_t{n} * g.width(), 0);
  cal.decode.assign(std::size_t{n} * g.width(), 0);
  rng_engine rng(seed);
  auto pick = [&](uint32_t attribute) {  // 85% one of the attribute's two experts, else any
    return uniform_unit(rng) < 0.85 ? attribute * 2 + static_cast<uint32_t>(uniform_index(rng, 2))
                                    : static_cast<uint32_t>(uniform_index(rng, 8));
  };
  for (uint32_t r = 0; r < n; ++r) {
    const auto a = static_cast<uint32_t>(uniform_index(rng, 4));
    const auto b = static_cast<uint32_t>(uniform_index(rng, 4));
    const auto c = static_cast<uint32_t>(uniform_index(rng, 4));
    const uint32_t shown[4] = {a, b, c, c};
    const uint32_t decoded[4] = {a, a, b, b};
    for (uint32_t tok = 0; tok < 20; ++tok)
      for (uint32_t l = 0; l < 4; ++l) {
        ++cal.prefill[std::size_t{r} * g.width() + l * 8 + pick(shown[l])];
        ++cal.decode[std::size_t{r} * g.width() + l * 8 + pick(decoded[l])];
      }
  }
  return cal;
}

TEST(Rho, InformativeLayersScoreHigherThanNoise) {
  const auto cal = planted(200, 7);
  auto ev = rho_evaluator::make(cal, signature_transform::count, {}, 5000, 1);
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  const std::vector<uint32_t> good = {0, 1}, noise = {2, 3};
  EXPECT_GT(ev->rho(good), 0.5);
  EXPECT_LT(std::abs(ev->rho(noise)), 0.15);
  EXPECT_GT(ev->rho(good), ev->rho_all_layers());
}

TEST(Rho, DeterministicForASeedAndEqualToADirectComputation) {
  const auto cal = planted(60, 8);
  auto a = rho_evaluator::make(cal, signature_transform::sqrt, {}, 2000, 3);
  auto b = rho_evaluator::make(cal, signature_transform::sqrt, {}, 2000, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rho_all_layers(), b->rho_all_layers());

  // Direct: dense signatures through signature_spec, the same pairs, Spearman of distances.
  const model_geometry& g = cal.geometry;
  auto spec = signature_spec::make(g, signature_transform::sqrt, {}, {});
  ASSERT_TRUE(spec.ok());
  const std::size_t w = g.width();
  std::vector<std::vector<float>> sig(60, std::vector<float>(w)), dec(60, std::vector<float>(w));
  for (std::size_t r = 0; r < 60; ++r) {
    spec->dense_from_counts(std::span(cal.prefill).subspan(r * w, w), sig[r]);
    auto plain = signature_spec::make(g, signature_transform::count, {}, {});
    plain->dense_from_counts(std::span(cal.decode).subspan(r * w, w), dec[r]);
  }
  rng_engine rng(3);
  std::vector<double> x, y;
  for (int p = 0; p < 2000; ++p) {
    const auto i = uniform_index(rng, 60);
    auto j = uniform_index(rng, 59);
    if (j >= i) ++j;
    double cs = 0, cd = 0;
    for (std::size_t d = 0; d < w; ++d) {
      cs += static_cast<double>(sig[i][d]) * sig[j][d];
      cd += static_cast<double>(dec[i][d]) * dec[j][d];
    }
    x.push_back(1 - cs);
    y.push_back(1 - cd);
  }
  EXPECT_NEAR(a->rho_all_layers(), *spearman(x, y), 1e-4);
}

TEST(Rho, RejectsBadCalibration) {
  calibration_counts cal = planted(10, 9);
  EXPECT_FALSE(rho_evaluator::make(cal, signature_transform::count_idf, {}, 100, 1).ok());
  EXPECT_FALSE(rho_evaluator::make(cal, signature_transform::count, {}, 0, 1).ok());
  cal.decode.pop_back();
  EXPECT_FALSE(rho_evaluator::make(cal, signature_transform::count, {}, 100, 1).ok());
  calibration_counts no_decode = planted(10, 9);
  std::fill(no_decode.decode.begin(), no_decode.decode.end(), 0u);
  auto r = rho_evaluator::make(no_decode, signature_transform::count, {}, 100, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("decode"), std::string::npos);
}

TEST(LayerSelection, PicksInformativeLayersFirstAndIsThreadIndependent) {
  const auto cal = planted(200, 10);
  auto ev = rho_evaluator::make(cal, signature_transform::count, {}, 5000, 2);
  ASSERT_TRUE(ev.ok());
  const layer_curve one = select_layers(*ev, 1);
  const layer_curve two = select_layers(*ev, 2);
  EXPECT_EQ(one.order, two.order);
  EXPECT_EQ(one.rho, two.rho);
  ASSERT_EQ(one.order.size(), 4u);
  std::vector<uint32_t> first_two = {one.order[0], one.order[1]};
  std::sort(first_two.begin(), first_two.end());
  EXPECT_EQ(first_two, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(one.n_star, 2u);
  EXPECT_EQ(one.mask, (std::vector<uint32_t>{0, 1}));
  // The curve's last point is the all-layer rho, and its peak is at n_star.
  EXPECT_NEAR(one.rho.back(), ev->rho_all_layers(), 1e-12);
  for (double r : one.rho)
    EXPECT_LE(r, one.rho[one.n_star - 1]);
}

}  // namespace
}  // namespace eldr
