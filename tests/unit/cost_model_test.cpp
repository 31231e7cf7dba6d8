// cost_model: parameter validation, the step latency's shape, and exact distinct-expert counts.
#include "core/cost_model.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <set>
#include <vector>

namespace eldr {
namespace {

TEST(DecodeCostParams, RejectsNonFiniteAndNegativeCoefficients) {
  EXPECT_TRUE(decode_cost_params{}.validate().ok());
  const double bad[] = {-0.5, std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity()};
  const char* names[] = {"base_ms", "per_distinct_expert_ms", "per_sequence_ms",
                         "per_context_kilotoken_ms"};
  for (double value : bad) {
    for (int field = 0; field < 4; ++field) {
      decode_cost_params p;
      double* fields[] = {&p.base_ms, &p.per_distinct_expert_ms, &p.per_sequence_ms,
                          &p.per_context_kilotoken_ms};
      *fields[field] = value;
      auto model = decode_cost_model::make(p);
      ASSERT_FALSE(model.ok());
      EXPECT_EQ(model.error().code(), status_code::invalid_argument);
      EXPECT_NE(model.error().message().find(names[field]), std::string::npos)
          << model.error().message();
    }
  }
}

TEST(DecodeCostModel, IsTheDocumentedLinearFormula) {
  decode_cost_params p;
  p.base_ms = 2.0;
  p.per_distinct_expert_ms = 0.01;
  p.per_sequence_ms = 0.1;
  p.per_context_kilotoken_ms = 0.5;
  auto model = decode_cost_model::make(p);
  ASSERT_TRUE(model.ok());
  EXPECT_DOUBLE_EQ(model->step_latency_ms({}), 2.0);
  EXPECT_DOUBLE_EQ(model->step_latency_ms({10, 300, 4000}), 2.0 + 3.0 + 1.0 + 2.0);
}

TEST(DecodeCostModel, DefaultsAreMonotonicInExpertsAndNearlyFlatInBatchSize) {
  auto model = decode_cost_model::make(decode_cost_params{});
  ASSERT_TRUE(model.ok());
  // 48 layers x 128 experts, as the defaults' rationale assumes.
  double previous = 0.0;
  for (uint64_t experts = 0; experts <= 48 * 128; experts += 48) {
    const double ms = model->step_latency_ms({64, experts, 64'000});
    EXPECT_GT(ms, previous);
    previous = ms;
  }
  // Few experts (one token's top-8 per layer) against all of them: several times slower.
  const double few = model->step_latency_ms({32, 48 * 8, 32'000});
  const double all = model->step_latency_ms({32, 48 * 128, 32'000});
  EXPECT_GT(all / few, 3.0);
  // Batch 32 -> 128 at the same distinct experts moves the step by under 10%.
  const double b32 = model->step_latency_ms({32, 48 * 100, 32'000});
  const double b128 = model->step_latency_ms({128, 48 * 100, 128'000});
  EXPECT_GT(b128, b32);
  EXPECT_LT(b128 / b32, 1.10);
}

TEST(DistinctExpertCounter, CountsExactlyOnHandMadeBatch) {
  auto counter = distinct_expert_counter::make({2, 8, 2});
  ASSERT_TRUE(counter.ok());
  // Request-major: [request][layer][slot].
  const std::vector<expert_id> ids = {
      0, 1, /* r0 l0 */ 2, 3, /* r0 l1 */
      1, 2, /* r1 l0 */ 3, 3, /* r1 l1: a repeated id counts once */
      7, 0, /* r2 l0 */ 2, 2, /* r2 l1 */
  };
  std::vector<uint32_t> per_layer(2);
  auto stats = counter->count(ids, per_layer);
  ASSERT_TRUE(stats.ok()) << stats.error().to_string();
  EXPECT_EQ(per_layer[0], 4u);  // {0, 1, 2, 7}
  EXPECT_EQ(per_layer[1], 2u);  // {2, 3}
  EXPECT_EQ(stats->total, 6u);
  EXPECT_DOUBLE_EQ(stats->mean_per_layer, 3.0);
  EXPECT_EQ(stats->max_per_layer, 4u);

  // Reuse: the previous batch leaves nothing behind; an empty batch is all zero.
  auto empty = counter->count({}, per_layer);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->total, 0u);
  EXPECT_EQ(per_layer[0], 0u);
}

TEST(DistinctExpertCounter, HandlesWordBoundariesAndTheLargestExpertId) {
  auto counter = distinct_expert_counter::make({1, 256, 4});
  ASSERT_TRUE(counter.ok());
  const std::vector<expert_id> ids = {63, 64, 127, 128, /* r1 */ 255, 0, 64, 191};
  auto stats = counter->count(ids);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->total, 7u);  // 63, 64, 127, 128, 255, 0, 191
}

TEST(DistinctExpertCounter, CountsIdsAbove255OfWideModels) {
  auto counter = distinct_expert_counter::make({2, 512, 4});
  ASSERT_TRUE(counter.ok());
  const std::vector<expert_id> ids = {0,
                                      63,
                                      64,
                                      511,
                                      /* layer 1 */ 255,
                                      256,
                                      300,
                                      447,
                                      /* r1 */ 511,
                                      300,
                                      256,
                                      0,
                                      /* layer 1 */ 448,
                                      256,
                                      300,
                                      1};
  std::vector<uint32_t> per_layer(2);
  auto stats = counter->count(ids, per_layer);
  ASSERT_TRUE(stats.ok()) << stats.error().to_string();
  EXPECT_EQ(per_layer[0], 6u);  // 0, 63, 64, 511, 300, 256
  EXPECT_EQ(per_layer[1], 6u);  // 255, 256, 300, 447, 448, 1
  EXPECT_EQ(stats->total, 12u);
  auto again = counter->count(std::vector<expert_id>(ids.begin(), ids.begin() + 8));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->total, 8u);  // the previous batch's bits were cleared
  auto bad = counter->count(std::vector<expert_id>{0, 1, 2, 512, 0, 1, 2, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("names expert 512"), std::string::npos);
}

TEST(DistinctExpertCounter, MatchesASetOnRandomBatches) {
  const model_geometry g{5, 64, 6};
  auto counter = distinct_expert_counter::make(g);
  ASSERT_TRUE(counter.ok());
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> expert(0, 63);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t requests = 1 + trial * 3;
    std::vector<expert_id> ids(requests * g.layers * g.top_k);
    for (expert_id& e : ids)
      e = static_cast<expert_id>(expert(gen));
    std::vector<std::set<int>> naive(g.layers);
    for (std::size_t r = 0; r < requests; ++r)
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t j = 0; j < g.top_k; ++j)
          naive[l].insert(ids[(r * g.layers + l) * g.top_k + j]);
    std::vector<uint32_t> per_layer(g.layers);
    auto stats = counter->count(ids, per_layer);
    ASSERT_TRUE(stats.ok());
    uint64_t total = 0;
    for (uint32_t l = 0; l < g.layers; ++l) {
      EXPECT_EQ(per_layer[l], naive[l].size());
      total += naive[l].size();
    }
    EXPECT_EQ(stats->total, total);
  }
}

TEST(DistinctExpertCounter, RejectsMalformedInput) {
  EXPECT_FALSE(distinct_expert_counter::make({0, 8, 2}).ok());
  EXPECT_FALSE(distinct_expert_counter::make({2, 4097, 2}).ok());
  auto counter = distinct_expert_counter::make({2, 8, 2});
  ASSERT_TRUE(counter.ok());

  const std::vector<expert_id> ragged = {0, 1, 2};
  auto r = counter->count(ragged);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("not a whole number of requests"), std::string::npos);

  const std::vector<expert_id> out_of_range = {0, 1, 2, 3, /* r1 */ 0, 1, 2, 8};
  r = counter->count(out_of_range);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("request 1, layer 1 names expert 8"), std::string::npos)
      << r.error().message();

  std::vector<uint32_t> wrong(3);
  r = counter->count(std::vector<expert_id>{0, 1, 2, 3}, wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("expected 2 layers"), std::string::npos);
}

}  // namespace
}  // namespace eldr
