// refit: the reservoir sample (validation, algorithm R's uniformity, determinism), the
// distinct-expert score on hand-computed cases, every validation check on constructed centroid
// sets, and the end-to-end refit (fit, alignment to worker identities, epoch, rejection).
#include "core/refit.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/base/resident_buffer.hpp"

namespace eldr {
namespace {

// ---- data ---------------------------------------------------------------------------------------

// "Blocks": worker-sized domains. Domain b's requests touch experts b*8 .. b*8+7 only.
constexpr uint32_t block_dims = 8;

void normalise(std::span<float> row) {
  double s = 0.0;
  for (float x : row)
    s += static_cast<double>(x) * x;
  const double inv = 1.0 / std::sqrt(s);
  for (float& x : row)
    x = static_cast<float>(x * inv);
}

// per_block points per block; each touches 3 distinct experts of its block, plus (when styles > 0)
// the 2 dimensions of "style" i % styles, after the blocks and shared by every block.
std::vector<float> block_points(uint32_t blocks, uint32_t per_block, uint64_t seed,
                                uint32_t styles = 0) {
  const uint32_t width = blocks * block_dims + styles * 2;
  rng_engine rng(seed);
  std::vector<float> out;
  for (uint32_t i = 0; i < per_block; ++i) {
    for (uint32_t b = 0; b < blocks; ++b) {
      std::vector<float> row(width, 0.0f);
      uint32_t placed = 0;
      while (placed < 3) {
        const auto d = static_cast<uint32_t>(b * block_dims + uniform_index(rng, block_dims));
        if (row[d] == 0.0f) {
          row[d] = 1.0f;
          ++placed;
        }
      }
      if (styles > 0) {
        const uint32_t s = i % styles;  // exactly balanced styles
        row[blocks * block_dims + 2 * s] = 1.0f;
        row[blocks * block_dims + 2 * s + 1] = 1.0f;
      }
      normalise(row);
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  return out;
}

// block_points(blocks, per_block, seed), then `extra` more points in block 0 (drawn with
// `extra_seed`, zero beyond the first block): a sample lopsided towards block 0.
std::vector<float> block_points_heavy_first(uint32_t blocks, uint32_t per_block, uint64_t seed,
                                            uint32_t extra, uint64_t extra_seed) {
  std::vector<float> points = block_points(blocks, per_block, seed);
  const auto more = block_points(1, extra, extra_seed);
  for (std::size_t r = 0; r < extra; ++r) {
    std::vector<float> row(static_cast<std::size_t>(blocks) * block_dims, 0.0f);
    std::copy_n(more.begin() + static_cast<std::ptrdiff_t>(r * block_dims), block_dims,
                row.begin());
    points.insert(points.end(), row.begin(), row.end());
  }
  return points;
}

// One centroid per entry of `regions`: uniform over dims [first, first + count).
std::shared_ptr<const centroid_set> region_set(
    uint32_t width, const std::vector<std::pair<uint32_t, uint32_t>>& regions, uint64_t epoch = 1) {
  const auto k = static_cast<uint32_t>(regions.size());
  std::vector<float> rows(static_cast<std::size_t>(k) * width, 0.0f);
  for (uint32_t r = 0; r < k; ++r)
    for (uint32_t d = 0; d < regions[r].second; ++d)
      rows[static_cast<std::size_t>(r) * width + regions[r].first + d] = 1.0f;
  auto made = centroid_set::make(k, width, std::move(rows), epoch);
  EXPECT_TRUE(made.ok()) << made.error().to_string();
  return std::make_shared<const centroid_set>(std::move(made).value());
}

// Centroid w = block order[w].
std::shared_ptr<const centroid_set> block_set(uint32_t width, const std::vector<uint32_t>& order,
                                              uint64_t epoch = 1) {
  std::vector<std::pair<uint32_t, uint32_t>> regions;
  for (uint32_t b : order)
    regions.emplace_back(b * block_dims, block_dims);
  return region_set(width, regions, epoch);
}

std::vector<float> rows_of(const centroid_set& set) {
  return {set.rows().begin(), set.rows().end()};
}

double cosine_rows(std::span<const float> a, std::span<const float> b) {
  double dot = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    dot += static_cast<double>(a[i]) * b[i];
  return dot;  // both unit
}

// ---- signature_sample ---------------------------------------------------------------------------

TEST(SignatureSample, MakeValidates) {
  EXPECT_FALSE(signature_sample::make(0, 4, 1).ok());
  EXPECT_FALSE(signature_sample::make(4, 0, 1).ok());
  auto huge = signature_sample::make(1u << 20, 1u << 12, 1);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code(), status_code::out_of_range);
}

TEST(SignatureSample, HoldsTheFirstRowsNormalisedAndRefusesMalformedSignatures) {
  auto made = signature_sample::make(3, 4, 7);
  ASSERT_TRUE(made.ok());
  signature_sample s = std::move(made).value();

  signature a{4, {0, 2}, {3.0f, 4.0f}};  // not unit: stored as (0.6, 0, 0.8, 0)
  ASSERT_TRUE(s.add(a).ok());
  ASSERT_TRUE(s.add_dense(std::vector<float>{0, 2, 0, 0}).ok());
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.seen(), 2u);
  const std::vector<float> want = {0.6f, 0, 0.8f, 0, 0, 1, 0, 0};
  ASSERT_EQ(s.points().size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(s.points()[i], want[i], 1e-6) << i;

  EXPECT_FALSE(s.add(signature{5, {0}, {1.0f}}).ok());           // width
  EXPECT_FALSE(s.add(signature{4, {0, 1}, {1.0f}}).ok());        // lengths
  EXPECT_FALSE(s.add(signature{4, {2, 1}, {1.0f, 1.0f}}).ok());  // order
  EXPECT_FALSE(s.add(signature{4, {1, 1}, {1.0f, 1.0f}}).ok());  // duplicate
  EXPECT_FALSE(s.add(signature{4, {4}, {1.0f}}).ok());           // range
  EXPECT_FALSE(s.add(signature{4, {0}, {std::numeric_limits<float>::quiet_NaN()}}).ok());
  EXPECT_FALSE(s.add_dense(std::vector<float>{1, 0, 0}).ok());
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.seen(), 2u);

  ASSERT_TRUE(s.add(signature{4, {}, {}}).ok());  // empty: skipped, not seen
  ASSERT_TRUE(s.add_dense(std::vector<float>{0, 0, 0, 0}).ok());
  EXPECT_EQ(s.skipped(), 2u);
  EXPECT_EQ(s.seen(), 2u);
  EXPECT_EQ(s.size(), 2u);

  s.clear();
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.seen(), 0u);
  ASSERT_TRUE(s.reset(6).ok());
  EXPECT_EQ(s.width(), 6u);
  EXPECT_FALSE(s.add(a).ok());  // the old width is refused after a new layer mask
  ASSERT_TRUE(s.add(signature{6, {5}, {1.0f}}).ok());
  EXPECT_EQ(s.points().size(), 6u);
  EXPECT_FALSE(s.reset(0).ok());
  EXPECT_EQ(s.width(), 6u);
}

// Item i is the one-hot row e_i, so the held rows say which items were kept.
std::vector<uint32_t> kept_items(const signature_sample& s) {
  std::vector<uint32_t> items;
  for (std::size_t r = 0; r < s.size(); ++r) {
    const auto row = s.points().subspan(r * s.width(), s.width());
    items.push_back(static_cast<uint32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  std::sort(items.begin(), items.end());
  return items;
}

std::vector<uint32_t> sample_stream(uint32_t capacity, uint32_t items, uint64_t seed) {
  signature_sample s = std::move(signature_sample::make(capacity, items, seed)).value();
  for (uint32_t i = 0; i < items; ++i)
    EXPECT_TRUE(s.add(signature{items, {i}, {1.0f}}).ok());
  EXPECT_EQ(s.size(), capacity);
  EXPECT_EQ(s.seen(), items);
  return kept_items(s);
}

TEST(SignatureSample, AlgorithmRKeepsEveryItemWithEqualProbability) {
  constexpr uint32_t capacity = 10, items = 100, trials = 3000;
  std::vector<uint32_t> hits(items, 0);
  for (uint64_t seed = 0; seed < trials; ++seed) {
    const auto kept = sample_stream(capacity, items, seed);
    EXPECT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end());  // no item twice
    for (uint32_t i : kept)
      ++hits[i];
  }
  // Each item: Binomial(3000, 0.1), mean 300, sd 16.4; 5 sd bounds (the seeds are fixed, so this
  // either always passes or always fails).
  for (uint32_t i = 0; i < items; ++i) {
    EXPECT_GT(hits[i], 218u) << "item " << i;
    EXPECT_LT(hits[i], 382u) << "item " << i;
  }
  // Early and late halves equally represented (a biased replacement favours one of them).
  const uint32_t early = std::accumulate(hits.begin(), hits.begin() + 50, 0u);
  const uint32_t late = std::accumulate(hits.begin() + 50, hits.end(), 0u);
  EXPECT_NEAR(static_cast<double>(early) / (early + late), 0.5, 0.02);
}

TEST(SignatureSample, PastItsFillAnOfferIsReadOnlyWhenTheReservoirKeepsIt) {
  signature_sample s = std::move(signature_sample::make(2, 4, 5)).value();
  EXPECT_FALSE(s.add(signature{4, {1}, {0.0f}}).ok());  // entries all zero, kept during the fill
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.seen(), 0u);
  ASSERT_TRUE(s.add(signature{4, {0}, {1.0f}}).ok());
  ASSERT_TRUE(s.add(signature{4, {1}, {1.0f}}).ok());
  const std::vector<float> held(s.points().begin(), s.points().end());
  // 1,000 malformed offers: the ones the draw keeps (about 2 ln(1002 / 3) = 12) are refused and
  // change nothing; the others are dropped unread, as a well-formed one would be.
  uint64_t refused = 0;
  const signature nan{4, {2}, {std::numeric_limits<float>::quiet_NaN()}};
  for (int i = 0; i < 1000; ++i)
    refused += s.add(nan).ok() ? 0 : 1;
  EXPECT_GT(refused, 2u);
  EXPECT_LT(refused, 40u);
  EXPECT_EQ(s.seen(), 2 + 1000 - refused);
  EXPECT_EQ(std::vector<float>(s.points().begin(), s.points().end()), held);
}

// The reservoir is allocated whole when the sample is made (and again at a reset to another
// width) and never moves while it fills: rows kept on the route path write memory that is already
// there (core/base/resident_buffer.hpp).
TEST(SignatureSample, TheReservoirIsAllocatedWhenMadeAndNeverMovesWhileItFills) {
  signature_sample s = std::move(signature_sample::make(64, 8, 3)).value();
  ASSERT_TRUE(s.add(signature{8, {1}, {1.0f}}).ok());
  const float* first = s.points().data();
  for (uint32_t i = 1; i < 64; ++i)
    ASSERT_TRUE(s.add(signature{8, {i % 8}, {1.0f}}).ok());
  EXPECT_EQ(s.size(), 64u);
  EXPECT_EQ(s.points().data(), first);
  ASSERT_TRUE(s.reset(16).ok());
  ASSERT_TRUE(s.add(signature{16, {15}, {2.0f}}).ok());
  const float* again = s.points().data();
  for (uint32_t i = 1; i < 64; ++i)
    ASSERT_TRUE(s.add(signature{16, {i % 16}, {1.0f}}).ok());
  EXPECT_EQ(s.points().data(), again);
  EXPECT_FLOAT_EQ(s.points()[15], 1.0f);  // the first row, normalised
}

TEST(ResidentBuffer, LeavesTheVectorEmptyWithItsWholeCapacity) {
  std::vector<float> v = {1, 2, 3};
  make_resident(v, 1000);
  EXPECT_TRUE(v.empty());
  EXPECT_GE(v.capacity(), 1000u);
  const float* p = v.data();
  v.resize(1000);
  EXPECT_EQ(v.data(), p);
  EXPECT_EQ(v[999], 0.0f);
}

TEST(SignatureSample, MakeRefusesAHorizonBelowTheCapacity) {
  EXPECT_FALSE(signature_sample::make(10, 4, 1, 9).ok());
  auto at = signature_sample::make(10, 4, 1, 10);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->horizon(), 10u);
  EXPECT_EQ(signature_sample::make(10, 4, 1)->horizon(), signature_sample::whole_history);
  EXPECT_EQ(resolved_sample_horizon(4096, 0), 8u * 4096);  // automatic
  EXPECT_EQ(resolved_sample_horizon(4096, 5000), 5000u);
}

TEST(SignatureSample, UpToItsHorizonTheSampleIsAlgorithmRs) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    signature_sample r = std::move(signature_sample::make(5, 50, seed)).value();
    signature_sample h = std::move(signature_sample::make(5, 50, seed, 50)).value();
    for (uint32_t i = 0; i < 50; ++i) {
      ASSERT_TRUE(r.add(signature{50, {i}, {1.0f}}).ok());
      ASSERT_TRUE(h.add(signature{50, {i}, {1.0f}}).ok());
    }
    EXPECT_EQ(kept_items(r), kept_items(h)) << "seed " << seed;
  }
}

// Item i as a row that says its index: (1, i / scale), normalised; the ratio gives i back.
signature indexed_item(uint32_t i, double scale) {
  return signature{2, {0, 1}, {1.0f, static_cast<float>(i / scale)}};
}

TEST(SignatureSample, PastItsHorizonAHeldSignatureAgesOutExponentially) {
  // A held row is replaced with probability (capacity / horizon) x (1 / capacity) per offer, so
  // its age is exponential with mean `horizon`; algorithm R's held rows are spread uniformly over
  // the whole stream (mean age about items / 2).
  constexpr uint32_t capacity = 100, horizon = 1000, items = 20000;
  constexpr double scale = 1 << 15;
  double age_sum = 0, age_sum_r = 0, rows = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    signature_sample h = std::move(signature_sample::make(capacity, 2, seed, horizon)).value();
    signature_sample r = std::move(signature_sample::make(capacity, 2, seed)).value();
    for (uint32_t i = 0; i < items; ++i) {
      ASSERT_TRUE(h.add(indexed_item(i, scale)).ok());
      ASSERT_TRUE(r.add(indexed_item(i, scale)).ok());
    }
    ASSERT_EQ(h.size(), capacity);
    for (std::size_t k = 0; k < capacity; ++k) {
      const auto hp = h.points().subspan(2 * k, 2), rp = r.points().subspan(2 * k, 2);
      age_sum += (items - 1) - std::round(hp[1] / hp[0] * scale);
      age_sum_r += (items - 1) - std::round(rp[1] / rp[0] * scale);
      ++rows;
    }
  }
  // 2,000 ages; exponential: mean 1,000, standard error about 22 (the seeds are fixed).
  EXPECT_NEAR(age_sum / rows, horizon, 150.0);
  EXPECT_NEAR(age_sum_r / rows, items / 2.0, 1000.0);
}

TEST(SignatureSample, AHorizonFollowsAChangeOfTrafficThatTheWholeHistoryHides) {
  // 100,000 signatures of one kind (e_0), then three horizons of another (e_1).
  constexpr uint32_t capacity = 200, horizon = 2000;
  auto share_of_new = [&](uint64_t h) {
    signature_sample s = std::move(signature_sample::make(capacity, 2, 3, h)).value();
    for (uint32_t i = 0; i < 100000; ++i)
      EXPECT_TRUE(s.add(signature{2, {0}, {1.0f}}).ok());
    for (uint32_t i = 0; i < 3 * horizon; ++i)
      EXPECT_TRUE(s.add(signature{2, {1}, {1.0f}}).ok());
    double held_new = 0;
    for (std::size_t k = 0; k < s.size(); ++k)
      held_new += s.points()[2 * k + 1];
    return held_new / static_cast<double>(s.size());
  };
  // 1 - exp(-3) = 0.95 of the rows are the new kind; algorithm R: 6,000 / 106,000 = 0.057.
  EXPECT_GT(share_of_new(horizon), 0.88);
  EXPECT_LT(share_of_new(signature_sample::whole_history), 0.12);
}

TEST(SignatureSample, SameSeedSameSample) {
  EXPECT_EQ(sample_stream(5, 50, 9), sample_stream(5, 50, 9));
  EXPECT_NE(sample_stream(5, 50, 9), sample_stream(5, 50, 10));
}

// ---- predicted distinct experts -----------------------------------------------------------------

TEST(DistinctExperts, MatchesAHandComputedCase) {
  // Centroids e0 and e2 in 4 dims. p0, p1 prefer worker 0; p2, p3 worker 1.
  auto set = region_set(4, {{0, 1}, {2, 1}});
  const float h = static_cast<float>(1.0 / std::sqrt(2.0));
  const std::vector<float> points = {h, h, 0, 0,   // dims {0,1}
                                     h, 0, 0, h,   // dims {0,3}
                                     0, 0, 1, 0,   // dims {2}
                                     0, h, h, 0};  // dims {1,2}
  refit_validation_options o;
  o.batch_size = 2;  // one batch per worker: {0,1,3} and {1,2}
  auto s = predicted_distinct_experts(*set, points, 4, o);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_DOUBLE_EQ(*s, 2.5);
  o.batch_size = 1;  // every point alone: 2, 2, 1, 2
  EXPECT_DOUBLE_EQ(*predicted_distinct_experts(*set, points, 4, o), 1.75);
  o.batch_size = 3;  // fewer points than a batch: the batch holds them all
  EXPECT_DOUBLE_EQ(*predicted_distinct_experts(*set, points, 4, o), 2.5);
}

TEST(DistinctExperts, TiesGoToTheLowerWorker) {
  auto set = region_set(3, {{0, 1}, {1, 1}});
  const float h = static_cast<float>(1.0 / std::sqrt(2.0));
  // The first point scores h against both centroids and belongs to worker 0: batches {0,1} and
  // {1,2}, 2 experts each. Were ties given to worker 1, it would hold one batch of 3.
  const std::vector<float> points = {h, h, 0, 0, 0.6f, 0.8f};
  refit_validation_options o;
  o.batch_size = 2;
  EXPECT_DOUBLE_EQ(*predicted_distinct_experts(*set, points, 3, o), 2.0);
}

TEST(DistinctExperts, LocalityAwareSetScoresLowerThanAStyleSet) {
  const uint32_t blocks = 4, styles = 4, width = blocks * block_dims + styles * 2;
  const auto points = block_points(blocks, 64, 3, styles);
  auto by_block = block_set(width, {0, 1, 2, 3});
  auto by_style = region_set(width, {{32, 2}, {34, 2}, {36, 2}, {38, 2}});
  refit_validation_options o;
  const double good = *predicted_distinct_experts(*by_block, points, width, o);
  const double bad = *predicted_distinct_experts(*by_style, points, width, o);
  EXPECT_LE(good, 16.0);  // at most 8 block experts + 8 style dimensions
  EXPECT_GT(bad, good + 5.0) << good << " vs " << bad;
  // Deterministic in the seed; the batch draw matters only through the seed.
  EXPECT_DOUBLE_EQ(*predicted_distinct_experts(*by_style, points, width, o), bad);
}

TEST(DistinctExperts, RejectsBadArguments) {
  auto set = region_set(4, {{0, 1}, {2, 1}});
  refit_validation_options o;
  EXPECT_FALSE(predicted_distinct_experts(*set, {}, 4, o).ok());
  EXPECT_FALSE(predicted_distinct_experts(*set, std::vector<float>(5, 0.5f), 5, o).ok());
  EXPECT_FALSE(predicted_distinct_experts(*set, std::vector<float>(6, 0.5f), 4, o).ok());
  EXPECT_FALSE(predicted_distinct_experts(
                   *set, std::vector<float>{std::numeric_limits<float>::infinity(), 0, 0, 0}, 4, o)
                   .ok());
  o.batch_size = 0;
  EXPECT_FALSE(predicted_distinct_experts(*set, std::vector<float>{1, 0, 0, 0}, 4, o).ok());
}

// ---- validate_refit -----------------------------------------------------------------------------

constexpr uint32_t plain_width = 4 * block_dims;

TEST(ValidateRefit, AcceptsAGoodSetWithoutACurrentOneAndSaysTheScoreWasNotCompared) {
  const auto points = block_points(4, 50, 1);
  auto set = block_set(plain_width, {2, 0, 3, 1});
  auto r = validate_refit(*set, nullptr, points, plain_width);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->accepted) << r->reason;
  EXPECT_EQ(r->reason, "");
  EXPECT_FALSE(r->score_checked);
  EXPECT_EQ(r->score_note, "no current set");
  EXPECT_EQ(r->points, 200u);
  EXPECT_EQ(r->min_cluster_points, 5u);  // max(1, 200 / 40)
  EXPECT_EQ(r->min_cluster_size, 50u);
  EXPECT_EQ(r->max_cluster_size, 50u);
  EXPECT_DOUBLE_EQ(r->balance_ratio, 1.0);
  EXPECT_NEAR(r->objective, 3.0 / std::sqrt(3.0 * 8.0), 1e-5);  // cos(3-of-8 point, block mean)
  EXPECT_GT(r->candidate_score, 0.0);
}

TEST(ValidateRefit, RejectsASampleTooSmall) {
  auto set = block_set(plain_width, {0, 1, 2, 3});
  auto r = validate_refit(*set, nullptr, std::span<const float>{}, plain_width);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->accepted);
  EXPECT_EQ(r->reason.rfind("sample too small", 0), 0u) << r->reason;

  const auto points = block_points(4, 5, 1);  // 20 points
  refit_validation_options o;
  o.min_cluster_points = 6;  // needs 24
  r = validate_refit(*set, nullptr, points, plain_width, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason.rfind("sample too small", 0), 0u) << r->reason;
  o.min_cluster_points = 5;
  r = validate_refit(*set, nullptr, points, plain_width, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->accepted) << r->reason;
}

TEST(ValidateRefit, RejectsDegenerateClusters) {
  const auto points = block_points(4, 50, 1);
  // Worker 3 duplicates worker 2: every tie goes to 2, worker 3 is preferred by nobody.
  auto set = block_set(plain_width, {0, 1, 2, 2});
  auto r = validate_refit(*set, nullptr, points, plain_width);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->accepted);
  EXPECT_EQ(r->reason.rfind("degenerate clusters: worker 3", 0), 0u) << r->reason;
  EXPECT_EQ(r->min_cluster_size, 0u);
}

TEST(ValidateRefit, RejectsBrokenBalance) {
  // Block 0 holds 75% of the sample: under argmax its worker gets exactly 3x its share.
  // 10 per block, and 80 more in block 0.
  const std::vector<float> points = block_points_heavy_first(4, 10, 1, 80, 2);
  auto set = block_set(plain_width, {0, 1, 2, 3});
  auto r = validate_refit(*set, nullptr, points, plain_width);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->accepted) << r->reason;  // at the maximum is not above it
  EXPECT_DOUBLE_EQ(r->balance_ratio, 3.0);
  EXPECT_EQ(r->max_cluster_size, 90u);

  refit_validation_options o;
  o.max_balance_ratio = 2.5;
  r = validate_refit(*set, nullptr, points, plain_width, o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->accepted);
  EXPECT_EQ(r->reason.rfind("balance broken: worker 0", 0), 0u) << r->reason;
}

TEST(ValidateRefit, BalanceIsMeasuredAgainstEachWorkersWeightedShare) {
  // Two blocks, 60 and 20 points: lopsided for equal workers, exact for weights 3:1.
  const std::vector<float> points = block_points_heavy_first(2, 20, 4, 40, 5);  // 20 per block
  auto set = block_set(2 * block_dims, {0, 1});
  refit_validation_options o;
  o.max_balance_ratio = 1.2;
  auto r = validate_refit(*set, nullptr, points, 2 * block_dims, o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->accepted);
  EXPECT_DOUBLE_EQ(r->balance_ratio, 1.5);
  EXPECT_EQ(r->reason.rfind("balance broken: worker 0", 0), 0u) << r->reason;

  o.worker_weights = {3.0, 1.0};
  r = validate_refit(*set, nullptr, points, 2 * block_dims, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->accepted) << r->reason;
  EXPECT_DOUBLE_EQ(r->balance_ratio, 1.0);

  o.worker_weights = {1.0, 1.0, 1.0};
  EXPECT_FALSE(validate_refit(*set, nullptr, points, 2 * block_dims, o).ok());
  o.worker_weights = {1.0, 0.0};
  EXPECT_FALSE(validate_refit(*set, nullptr, points, 2 * block_dims, o).ok());
}

TEST(ValidateRefit, RejectsAWorseOrEqualDistinctExpertScoreAndAcceptsABetterOne) {
  const uint32_t width = plain_width + 8;
  const auto points = block_points(4, 64, 3, 4);
  auto by_block = block_set(width, {0, 1, 2, 3});
  auto by_style = region_set(width, {{32, 2}, {34, 2}, {36, 2}, {38, 2}});

  auto worse = validate_refit(*by_style, by_block.get(), points, width);
  ASSERT_TRUE(worse.ok());
  EXPECT_FALSE(worse->accepted);
  EXPECT_TRUE(worse->score_checked);
  EXPECT_EQ(worse->reason.rfind("distinct-expert score worse", 0), 0u) << worse->reason;
  EXPECT_GT(worse->candidate_score, worse->current_score);

  auto better = validate_refit(*by_block, by_style.get(), points, width);
  ASSERT_TRUE(better.ok());
  EXPECT_TRUE(better->accepted) << better->reason;
  EXPECT_LT(better->candidate_score, better->current_score);

  // The same score is no improvement: a new epoch would change nothing but the history.
  auto equal = validate_refit(*by_block, by_block.get(), points, width);
  ASSERT_TRUE(equal.ok());
  EXPECT_FALSE(equal->accepted);
  EXPECT_TRUE(equal->score_checked);
  EXPECT_DOUBLE_EQ(equal->candidate_score, equal->current_score);
  EXPECT_EQ(equal->reason.rfind("distinct-expert score not better", 0), 0u) << equal->reason;

  // The tolerance is the improvement required beyond equality: just below the better set's gain
  // it passes, at the gain it does not.
  const double gain = better->current_score / better->candidate_score - 1.0;
  ASSERT_GT(gain, 0.0);
  refit_validation_options o;
  o.score_tolerance = gain * 0.99;
  auto enough = validate_refit(*by_block, by_style.get(), points, width, o);
  ASSERT_TRUE(enough.ok());
  EXPECT_TRUE(enough->accepted) << enough->reason;
  o.score_tolerance = gain * 1.01;
  auto too_little = validate_refit(*by_block, by_style.get(), points, width, o);
  ASSERT_TRUE(too_little.ok());
  EXPECT_FALSE(too_little->accepted);
  EXPECT_EQ(too_little->reason.rfind("distinct-expert score not better", 0), 0u)
      << too_little->reason;
  // No tolerance lets a worse set through.
  o.score_tolerance = 10.0;
  auto tolerated = validate_refit(*by_style, by_block.get(), points, width, o);
  ASSERT_TRUE(tolerated.ok());
  EXPECT_FALSE(tolerated->accepted);
}

TEST(ValidateRefit, SkipsTheScoreAgainstASetOfAnotherWidth) {
  const auto points = block_points(4, 20, 1);
  auto candidate = block_set(plain_width, {0, 1, 2, 3});
  auto old = block_set(plain_width + 8, {0, 1, 2, 3});
  auto r = validate_refit(*candidate, old.get(), points, plain_width);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->accepted) << r->reason;
  EXPECT_FALSE(r->score_checked);
  EXPECT_NE(r->score_note.find("width 40"), std::string::npos) << r->score_note;
}

TEST(ValidateRefit, RejectsBadArguments) {
  const auto points = block_points(4, 20, 1);
  auto set = block_set(plain_width, {0, 1, 2, 3});
  EXPECT_FALSE(validate_refit(*set, nullptr, points, 0).ok());
  EXPECT_FALSE(validate_refit(*set, nullptr, points, plain_width + 1).ok());
  EXPECT_FALSE(validate_refit(*set, nullptr, std::span(points).first(40), 40).ok());  // width
  refit_validation_options o;
  o.max_balance_ratio = 0.5;
  EXPECT_FALSE(validate_refit(*set, nullptr, points, plain_width, o).ok());
  o = {};
  o.score_tolerance = -0.1;
  EXPECT_FALSE(validate_refit(*set, nullptr, points, plain_width, o).ok());
  o = {};
  o.batch_size = 0;
  EXPECT_FALSE(validate_refit(*set, nullptr, points, plain_width, o).ok());
}

// ---- refit_candidate ----------------------------------------------------------------------------

TEST(RefitCandidate, FitsAlignsToWorkerIdentitiesAndBumpsTheEpoch) {
  const auto points = block_points(4, 100, 5);
  // The current set owns the blocks in a shuffled order: worker w serves block order[w].
  const std::vector<uint32_t> order = {2, 0, 3, 1};
  auto current = block_set(plain_width, order, /*epoch=*/7);
  refit_options o;
  o.kmeans.seed = 3;
  // Start the fit elsewhere, so that alignment (not the seeding) has to restore the identities.
  o.kmeans.initial_centroids = rows_of(*block_set(plain_width, {0, 1, 2, 3}));
  auto out = refit_candidate(points, plain_width, current.get(), o);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  ASSERT_NE(out->candidate, nullptr);
  EXPECT_TRUE(out->aligned);
  EXPECT_TRUE(out->report.score_checked);
  // The fit found the current grouping again: the same score, so no new epoch is worth it.
  EXPECT_FALSE(out->report.accepted);
  EXPECT_EQ(out->report.reason.rfind("distinct-expert score not better", 0), 0u)
      << out->report.reason;
  EXPECT_EQ(out->candidate->epoch(), 8u);
  EXPECT_EQ(out->candidate->k(), 4u);
  for (uint32_t w = 0; w < 4; ++w)
    EXPECT_GT(cosine_rows(out->candidate->row(w), current->row(w)), 0.95) << "worker " << w;
  EXPECT_EQ(out->fit_cluster_sizes, (std::vector<uint32_t>{100, 100, 100, 100}));
  EXPECT_DOUBLE_EQ(out->report.candidate_score, out->report.current_score);
}

TEST(RefitCandidate, FirstFitNeedsKAndStartsAtEpochOne) {
  signature_sample sample = std::move(signature_sample::make(1000, plain_width, 1)).value();
  const auto points = block_points(4, 50, 9);
  for (std::size_t r = 0; r < 200; ++r) {
    signature s;
    s.width = plain_width;
    for (uint32_t d = 0; d < plain_width; ++d) {
      const float v = points[r * plain_width + d];
      if (v != 0.0f) {
        s.index.push_back(d);
        s.value.push_back(v);
      }
    }
    ASSERT_TRUE(sample.add(s).ok());
  }
  refit_options o;
  EXPECT_FALSE(refit_candidate(sample, nullptr, o).ok());  // K unknown
  o.k = 4;
  auto out = refit_candidate(sample, nullptr, o);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  ASSERT_NE(out->candidate, nullptr);
  EXPECT_TRUE(out->report.accepted) << out->report.reason;
  EXPECT_FALSE(out->aligned);
  EXPECT_EQ(out->candidate->epoch(), 1u);
  EXPECT_EQ(out->report.score_note, "no current set");
  EXPECT_EQ(out->report.min_cluster_size, 50u);  // one block per worker
  o.epoch = 42;
  auto again = refit_candidate(sample, nullptr, o);
  ASSERT_TRUE(again.ok());
  ASSERT_NE(again->candidate, nullptr);
  EXPECT_EQ(again->candidate->epoch(), 42u);
}

TEST(RefitCandidate, ValidatesBalanceAgainstTheFitsWorkerWeights) {
  // Blocks of 60 and 20 points fitted for workers weighted 3:1: balanced for those workers.
  const std::vector<float> points = block_points_heavy_first(2, 20, 4, 40, 5);
  // A first fit (no current set: the blocks as a current set would score the same, and be no
  // improvement), started at the blocks.
  refit_options o;
  o.k = 2;
  o.kmeans.initial_centroids = rows_of(*block_set(2 * block_dims, {0, 1}));
  o.validation.max_balance_ratio = 1.2;
  o.kmeans.worker_weights = {3.0, 1.0};
  auto out = refit_candidate(points, 2 * block_dims, nullptr, o);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_TRUE(out->report.accepted) << out->report.reason;
  EXPECT_DOUBLE_EQ(out->report.balance_ratio, 1.0);
  EXPECT_EQ(out->fit_cluster_sizes, (std::vector<uint32_t>{60, 20}));
}

TEST(RefitCandidate, RejectsASampleTooSmallWithoutFitting) {
  auto current = block_set(plain_width, {0, 1, 2, 3});
  const auto points = block_points(1, 3, 1);  // 3 points of width 8
  std::vector<float> wide(3 * plain_width, 0.0f);
  for (std::size_t r = 0; r < 3; ++r)
    std::copy_n(points.begin() + static_cast<std::ptrdiff_t>(r * block_dims), block_dims,
                wide.begin() + static_cast<std::ptrdiff_t>(r * plain_width));
  auto out = refit_candidate(wide, plain_width, current.get(), {});
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_EQ(out->candidate, nullptr);
  EXPECT_FALSE(out->report.accepted);
  EXPECT_EQ(out->report.reason.rfind("sample too small", 0), 0u) << out->report.reason;
  EXPECT_EQ(out->iterations, 0u);
}

TEST(RefitCandidate, AFitThatLosesLocalityIsRejectedAndReported) {
  // With style dimensions, clustering by style is a better K-means objective than clustering by
  // domain, yet it mixes domains in every batch. Starting the fit at the style centroids finds
  // that optimum; validation must refuse it against the current domain-aligned set.
  const uint32_t width = plain_width + 8;
  const auto points = block_points(4, 64, 3, 4);
  auto current = block_set(width, {0, 1, 2, 3}, 3);
  refit_options o;
  o.kmeans.initial_centroids = rows_of(*region_set(width, {{32, 2}, {34, 2}, {36, 2}, {38, 2}}));
  auto out = refit_candidate(points, width, current.get(), o);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  ASSERT_NE(out->candidate, nullptr);
  EXPECT_FALSE(out->report.accepted);
  EXPECT_EQ(out->report.reason.rfind("distinct-expert score worse", 0), 0u) << out->report.reason;
  EXPECT_EQ(out->candidate->epoch(), 4u);
}

// ---- refit_rule (the node's refit actor and the simulator's online refit) -----------------------

TEST(RefitRule, RefusesASampleBelowMinSampleWithTheNodesReason) {
  refit_rule rule;
  rule.min_sample = 100;
  EXPECT_EQ(rule.sample_shortfall(99),
            "sample too small: 99 live signatures, 100 needed (models.min_sample)");
  EXPECT_EQ(rule.sample_shortfall(100), "");
}

TEST(RefitRule, OptionsCarryTheKnobsTheRunSeedAndTheWeights) {
  auto current = block_set(plain_width, {0, 1, 2, 3}, 5);
  refit_rule rule;
  rule.max_balance_ratio = 2.5;
  rule.score_tolerance = 0.05;
  rule.batch_size = 8;
  rule.seed = 40;
  const std::vector<float> weights = {1, 2, 1, 1};
  const refit_options o = rule.options(*current, weights, 3);
  EXPECT_EQ(o.k, 4u);
  EXPECT_EQ(o.epoch, 0u);  // the candidate takes current's epoch + 1
  EXPECT_EQ(o.kmeans.seed, 43u);
  EXPECT_EQ(o.kmeans.threads, 1u);
  EXPECT_EQ(o.kmeans.worker_weights, (std::vector<double>{1, 2, 1, 1}));
  EXPECT_DOUBLE_EQ(o.validation.max_balance_ratio, 2.5);
  EXPECT_DOUBLE_EQ(o.validation.score_tolerance, 0.05);
  EXPECT_EQ(o.validation.batch_size, 8u);
  EXPECT_EQ(o.validation.seed, 40u);
  EXPECT_TRUE(rule.options(*current, {}, 0).kmeans.worker_weights.empty());
}

TEST(RefitCandidate, PassesKMeansErrorsThrough) {
  auto current = block_set(plain_width, {0, 1, 2, 3});
  std::vector<float> zeros(40 * plain_width, 0.0f);  // zero rows: refused by the fit
  auto out = refit_candidate(zeros, plain_width, current.get(), {});
  EXPECT_FALSE(out.ok());
  EXPECT_FALSE(refit_candidate(zeros, 0, current.get(), {}).ok());
  EXPECT_FALSE(refit_candidate(std::span(zeros).first(7), plain_width, current.get(), {}).ok());
}

}  // namespace
}  // namespace eldr
