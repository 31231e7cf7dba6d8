// signature: transforms, IDF, masks, and the block-wise builder agreeing with dense counts.
#include "core/signature.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/base/random.hpp"
#include "tests/support/random_ids.hpp"

namespace eldr {
namespace {

using namespace eldr::testing;  // random_ids, prompt_counts, make_random_prompt

TEST(Signature, ParseTransformNamesAndRejectsOthers) {
  for (signature_transform t : all_transforms)
    EXPECT_EQ(*parse_transform(to_string(t)), t);
  auto bad = parse_transform("gate_logit");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("count_idf"), std::string::npos);
}

TEST(Signature, IdfFollowsTheFormula) {
  const model_geometry g{1, 3, 1};
  // Three requests: expert 0 used by all, expert 1 by one, expert 2 by none.
  const std::vector<uint32_t> counts = {2, 0, 0, 1, 1, 0, 5, 0, 0};
  auto idf = fit_idf(g, counts);
  ASSERT_TRUE(idf.ok());
  EXPECT_FLOAT_EQ((*idf)[0], std::log(4.0f / 4.0f));
  EXPECT_FLOAT_EQ((*idf)[1], std::log(4.0f / 2.0f));
  EXPECT_FLOAT_EQ((*idf)[2], std::log(4.0f / 1.0f));
  EXPECT_FALSE(fit_idf(g, std::vector<uint32_t>{1, 2}).ok());
  EXPECT_FALSE(fit_idf(g, {}).ok());
}

TEST(Signature, TransformsOnAKnownVector) {
  const model_geometry g{2, 2, 1};
  const std::vector<uint32_t> counts = {4, 0, 1, 9};  // layer 0: (4, 0), layer 1: (1, 9)
  const std::vector<float> idf = {0.5f, 1.0f, 2.0f, 0.0f};
  auto expect = [&](signature_transform t, std::vector<float> raw, std::vector<uint32_t> mask) {
    auto spec = signature_spec::make(g, t, mask, idf);
    ASSERT_TRUE(spec.ok()) << spec.error().to_string();
    std::vector<float> out(spec->width());
    spec->dense_from_counts(counts, out);
    float n = 0;
    for (float v : raw)
      n += v * v;
    n = std::sqrt(n);
    ASSERT_EQ(out.size(), raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i)
      EXPECT_NEAR(out[i], raw[i] / n, 1e-6) << i;
  };
  expect(signature_transform::count, {4, 0, 1, 9}, {});
  expect(signature_transform::sqrt, {2, 0, 1, 3}, {});
  expect(signature_transform::count_idf, {2, 0, 2, 0}, {});
  expect(signature_transform::binary, {1, 0, 1, 1}, {});
  // One global normalisation over the kept layers only.
  expect(signature_transform::count, {1, 9}, {1});
}

TEST(Signature, SpecRejectsBadMasksAndIdf) {
  const model_geometry g{4, 8, 2};
  EXPECT_FALSE(signature_spec::make(g, signature_transform::count, {4}, {}).ok());
  EXPECT_FALSE(signature_spec::make(g, signature_transform::count, {1, 1}, {}).ok());
  EXPECT_FALSE(signature_spec::make(g, signature_transform::count_idf, {}, {}).ok());
  std::vector<float> nan_idf(g.width(), 1.0f);
  nan_idf[3] = std::nanf("");
  EXPECT_FALSE(signature_spec::make(g, signature_transform::count_idf, {}, nan_idf).ok());
  auto spec = signature_spec::make(g, signature_transform::count, {3, 0}, {});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->layer_mask(), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(spec->width(), 16u);
}

TEST(Signature, BlockBuilderEqualsDenseForEveryTransformAndMask) {
  const model_geometry g{6, 16, 4};
  const uint32_t tokens = 70;
  const auto [ids, whole] = make_random_prompt(g, tokens, 11);
  ASSERT_EQ(whole.size(), g.width());
  std::vector<uint32_t> calib = whole;
  const std::vector<uint32_t> other_counts = prompt_counts(g, random_ids(g, 9, 12), 9);
  ASSERT_EQ(other_counts.size(), g.width());
  calib.insert(calib.end(), other_counts.begin(), other_counts.end());
  auto idf = fit_idf(g, calib);
  ASSERT_TRUE(idf.ok());
  auto blocks = count_blocks(g, ids, 0, tokens, 16);
  ASSERT_TRUE(blocks.ok());
  for (signature_transform t : all_transforms)
    for (std::vector<uint32_t> mask : {std::vector<uint32_t>{}, std::vector<uint32_t>{1, 4, 5}}) {
      auto spec = signature_spec::make(g, t, mask, *idf);
      ASSERT_TRUE(spec.ok());
      auto shared = std::make_shared<const signature_spec>(*spec);
      signature_builder builder(shared);
      for (const auto& b : *blocks)
        ASSERT_TRUE(builder.add(b).ok());
      signature sig;
      builder.finish(sig);
      std::vector<float> dense(spec->width());
      spec->dense_from_counts(whole, dense);
      ASSERT_EQ(sig.width, spec->width());
      std::vector<float> from_sparse(spec->width(), 0.0f);
      for (std::size_t i = 0; i < sig.nnz(); ++i) {
        if (i > 0) {
          EXPECT_LT(sig.index[i - 1], sig.index[i]);
        }
        EXPECT_NE(sig.value[i], 0.0f) << "only non-zeros are stored";
        from_sparse[sig.index[i]] = sig.value[i];
      }
      size_t dense_nnz = 0;
      for (float v : dense)
        dense_nnz += v != 0.0f ? 1 : 0;
      EXPECT_EQ(sig.nnz(), dense_nnz) << to_string(t);
      for (std::size_t d = 0; d < dense.size(); ++d)
        EXPECT_NEAR(from_sparse[d], dense[d], 1e-6) << to_string(t) << " dim " << d;
      // The builder resets after finish: a second build from the dense sum matches too.
      ASSERT_TRUE(builder.add_dense(whole).ok());
      signature again;
      builder.finish(again);
      EXPECT_EQ(again.index, sig.index);
      EXPECT_NEAR(cosine(again, sig), 1.0f, 1e-5);
    }
}

TEST(Signature, EmptyAndGeometryMismatch) {
  const model_geometry g{2, 4, 1};
  auto spec = std::make_shared<const signature_spec>(
      *signature_spec::make(g, signature_transform::count, {}, {}));
  signature_builder builder(spec);
  signature sig;
  builder.finish(sig);
  EXPECT_TRUE(sig.empty());
  EXPECT_EQ(cosine(sig, sig), 0.0f);
  const model_geometry other{3, 4, 1};
  const std::vector<expert_id> ids = {0, 1, 2};
  auto b = block_counts::from_tokens(other, ids, 0, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(builder.add(*b).ok());
  EXPECT_FALSE(builder.add_dense(std::vector<uint32_t>(3, 1)).ok());
  EXPECT_FALSE(builder.add_masked(std::vector<uint32_t>(3, 1)).ok());
}

}  // namespace
}  // namespace eldr
