// status, result<T> and model_geometry validation.
#include <gtest/gtest.h>

#include "core/base/status.hpp"
#include "core/base/vector_math.hpp"
#include "core/geometry.hpp"

namespace eldr {
namespace {

TEST(Status, DefaultIsOkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(status().ok());
  status s = status::invalid_argument("K (12) exceeds N (5)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.to_string(), "invalid_argument: K (12) exceeds N (5)");
}

TEST(Result, HoldsValueOrError) {
  result<int> a = 7;
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 7);
  result<int> b = status::not_found("x");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code(), status_code::not_found);
}

TEST(Geometry, ValidatesBounds) {
  EXPECT_TRUE((model_geometry{26, 64, 6}.validate().ok()));
  EXPECT_FALSE((model_geometry{0, 64, 6}.validate().ok()));
  EXPECT_TRUE((model_geometry{26, 257, 6}.validate().ok()));  // ids are 16 bits
  EXPECT_TRUE((model_geometry{60, 384, 8}.validate().ok()));
  EXPECT_FALSE((model_geometry{26, 4097, 6}.validate().ok()));
  EXPECT_FALSE((model_geometry{257, 4096, 6}.validate().ok()));  // L * E > 2^20
  EXPECT_FALSE((model_geometry{26, 64, 0}.validate().ok()));
  EXPECT_FALSE((model_geometry{26, 4, 6}.validate().ok()));
  EXPECT_NE((model_geometry{26, 4, 6}.validate().message()), model_geometry{}.validate().message());
}

TEST(VectorMath, DotAndNormalizeMatchNaiveLoops) {
  std::vector<float> a(37), b(37);
  double naive = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i) * 0.5f - 3.0f;
    b[i] = static_cast<float>(i % 5) - 1.0f;
    naive += static_cast<double>(a[i]) * b[i];
  }
  EXPECT_NEAR(dot(a.data(), b.data(), a.size()), naive, 1e-3);
  normalize(a.data(), a.size());
  EXPECT_NEAR(squared_norm(a.data(), a.size()), 1.0f, 1e-5);
  std::vector<float> z(5, 0.0f);
  EXPECT_EQ(normalize(z.data(), z.size()), 0.0f);
  EXPECT_EQ(z[0], 0.0f);
}

}  // namespace
}  // namespace eldr
