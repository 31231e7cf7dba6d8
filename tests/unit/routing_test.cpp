// routing: each policy's defining behaviour, the locality band against a reference, the centroid
// swap, input validation, and the allocation-free fast path.
#include "core/routing.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <vector>

#include "tests/support/allocation_counter.hpp"  // once per test binary

namespace eldr {
namespace {

// K centroids that are the first K unit axes of a (K + 1)-wide space, so a signature's first K
// values ARE the scores; the extra dimension absorbs the rest of its unit norm.
std::shared_ptr<const centroid_set> axis_set(uint32_t k, uint64_t epoch = 1) {
  std::vector<float> rows(static_cast<std::size_t>(k) * (k + 1), 0.0f);
  for (uint32_t r = 0; r < k; ++r)
    rows[static_cast<std::size_t>(r) * (k + 1) + r] = 1.0f;
  auto made = centroid_set::make(k, k + 1, std::move(rows), epoch);
  EXPECT_TRUE(made.ok());
  return std::make_shared<const centroid_set>(std::move(made).value());
}

// A signature whose scores against axis_set(scores.size()) are exactly `scores`.
signature with_scores(const std::vector<float>& scores) {
  signature s;
  s.width = static_cast<uint32_t>(scores.size() + 1);
  double squared = 0.0;
  for (uint32_t i = 0; i < scores.size(); ++i) {
    s.index.push_back(i);
    s.value.push_back(scores[i]);
    squared += static_cast<double>(scores[i]) * scores[i];
  }
  EXPECT_LT(squared, 1.0);
  s.index.push_back(static_cast<uint32_t>(scores.size()));
  s.value.push_back(static_cast<float>(std::sqrt(1.0 - squared)));
  return s;
}

std::unique_ptr<routing_policy> make_or_die(std::string_view name, const policy_config& c) {
  auto made = make_policy(name, c);
  EXPECT_TRUE(made.ok()) << made.error().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

policy_config workers(uint32_t k, uint64_t seed = 0) {
  policy_config c;
  c.workers = k;
  c.seed = seed;
  return c;
}

policy_config eldr_config(std::shared_ptr<const centroid_set> set, float tau, bool widen) {
  policy_config c;
  c.centroids = std::move(set);
  c.tau = tau;
  c.widen_single = widen;
  return c;
}

uint32_t route_or_die(routing_policy& p, const route_input& in, route_trace* trace = nullptr) {
  auto d = p.route(in, trace);
  EXPECT_TRUE(d.ok()) << d.error().to_string();
  return d.ok() ? d->worker : std::numeric_limits<uint32_t>::max();
}

// ---- factory and shared validation ------------------------------------------------------------

TEST(MakePolicy, KnowsEveryNameAndListsThemForUnknownOnes) {
  policy_config c = workers(4);
  c.domain_counts = {1, 1};
  c.centroids = axis_set(4);
  for (std::string_view name : policy_names()) {
    auto p = make_policy(name, c);
    ASSERT_TRUE(p.ok()) << name << ": " << p.error().to_string();
    EXPECT_EQ((*p)->name(), name);
    EXPECT_EQ((*p)->workers(), 4u);
  }
  auto bad = make_policy("least-loaded", c);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), status_code::invalid_argument);
  EXPECT_NE(
      bad.error().message().find("\"least-loaded\"; valid: rr, random, jsq, p2c, domain, eldr"),
      std::string::npos)
      << bad.error().message();
}

TEST(MakePolicy, RejectsInvalidConfigurations) {
  for (std::string_view name : {"rr", "random", "jsq", "p2c", "domain"})
    EXPECT_FALSE(make_policy(name, workers(0)).ok()) << name;

  EXPECT_FALSE(make_policy("eldr", policy_config{}).ok());  // no centroids
  policy_config c = eldr_config(axis_set(4), 0.1f, true);
  c.workers = 5;
  auto mismatch = make_policy("eldr", c);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message().find("K = 4"), std::string::npos);
  for (float tau :
       {-0.1f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto p = make_policy("eldr", eldr_config(axis_set(4), tau, true));
    ASSERT_FALSE(p.ok()) << tau;
    EXPECT_NE(p.error().message().find("tau"), std::string::npos);
  }
  EXPECT_FALSE(locality_band_policy::make(nullptr).ok());

  policy_config d = workers(4);
  EXPECT_FALSE(make_policy("domain", d).ok());  // no domains
  d.domain_counts = {0, 0};
  EXPECT_FALSE(make_policy("domain", d).ok());  // all zero
}

TEST(RoutingPolicy, EveryPolicyRejectsMalformedInputAndNoEligibleWorker) {
  policy_config c = workers(4, 7);
  c.domain_counts = {3, 1};
  c.centroids = axis_set(4);
  const std::vector<uint32_t> load4 = {0, 0, 0, 0};
  const std::vector<uint32_t> load3 = {0, 0, 0};
  const std::vector<uint8_t> mask3 = {1, 1, 1};
  const std::vector<uint8_t> none = {0, 0, 0, 0};
  for (std::string_view name : policy_names()) {
    auto p = make_or_die(name, c);
    ASSERT_NE(p, nullptr);
    auto r = p->route({nullptr, load3, {}, -1});
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    EXPECT_NE(r.error().message().find("load vector has 3 entries"), std::string::npos);

    r = p->route({nullptr, load4, mask3, -1});
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.error().message().find("eligibility mask has 3 entries"), std::string::npos);

    r = p->route({nullptr, load4, none, -1});
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code(), status_code::failed_precondition);
    EXPECT_NE(r.error().message().find("no eligible decode worker"), std::string::npos);
  }
}

// ---- baselines ----------------------------------------------------------------------------

TEST(RoundRobin, CyclesAndSkipsIneligibleWorkers) {
  auto p = make_or_die("rr", workers(4));
  std::vector<uint32_t> load = {9, 0, 0, 0};  // load is ignored
  std::vector<uint32_t> got;
  for (int i = 0; i < 6; ++i)
    got.push_back(route_or_die(*p, {nullptr, load, {}, -1}));
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2, 3, 0, 1}));

  const std::vector<uint8_t> mask = {1, 0, 1, 1};
  got.clear();
  for (int i = 0; i < 5; ++i)
    got.push_back(route_or_die(*p, {nullptr, load, mask, -1}));
  EXPECT_EQ(got, (std::vector<uint32_t>{2, 3, 0, 2, 3}));
}

TEST(RandomPolicy, IsSeededAndChoosesOnlyEligibleWorkersUniformly) {
  auto a = make_or_die("random", workers(5, 42));
  auto b = make_or_die("random", workers(5, 42));
  auto other = make_or_die("random", workers(5, 43));
  const std::vector<uint32_t> load(5, 0);
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 1};
  std::vector<int> hits(5, 0);
  int differs = 0;
  for (int i = 0; i < 4000; ++i) {
    const uint32_t w = route_or_die(*a, {nullptr, load, mask, -1});
    EXPECT_EQ(w, route_or_die(*b, {nullptr, load, mask, -1}));
    differs += w != route_or_die(*other, {nullptr, load, mask, -1}) ? 1 : 0;
    ++hits[w];
  }
  EXPECT_EQ(hits[2], 0);
  for (int w : {0, 1, 3, 4}) {
    EXPECT_GT(hits[w], 900);  // expected 1000 each
    EXPECT_LT(hits[w], 1100);
  }
  EXPECT_GT(differs, 2000);  // another seed, another sequence
}

TEST(Jsq, PicksTheLeastLoadedEligibleWorkerLowestIndexOnTies) {
  auto p = make_or_die("jsq", workers(5));
  std::vector<uint32_t> load = {4, 2, 7, 2, 3};
  route_trace trace;
  auto d = p->route({nullptr, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);
  EXPECT_EQ(d->band_size, 5u);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{0, 1, 2, 3, 4}));

  const std::vector<uint8_t> mask = {1, 0, 1, 1, 1};
  EXPECT_EQ(route_or_die(*p, {nullptr, load, mask, -1}), 3u);
  load = {0, 5, 5, 5, 5};
  const std::vector<uint8_t> not_first = {0, 1, 1, 1, 1};
  EXPECT_EQ(route_or_die(*p, {nullptr, load, not_first, -1}), 1u);
}

TEST(PowerOfTwo, NeverPicksTheMoreLoadedOfItsPairAndIsSeeded) {
  auto p = make_or_die("p2c", workers(6, 5));
  auto twin = make_or_die("p2c", workers(6, 5));
  const std::vector<uint32_t> load = {3, 1, 4, 1, 5, 9};  // worker 5 is the most loaded
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 0, 1};
  route_trace trace;
  std::vector<int> hits(6, 0);
  for (int i = 0; i < 2000; ++i) {
    auto d = p->route({nullptr, load, mask, -1}, &trace);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->worker, route_or_die(*twin, {nullptr, load, mask, -1}));
    ASSERT_EQ(trace.candidates.size(), 2u);
    const uint32_t lo = trace.candidates[0], hi = trace.candidates[1];
    EXPECT_LT(lo, hi);  // distinct, ascending
    EXPECT_NE(mask[lo], 0);
    EXPECT_NE(mask[hi], 0);
    const uint32_t expected = load[hi] < load[lo] ? hi : lo;  // ties to the lower index
    EXPECT_EQ(d->worker, expected);
    EXPECT_EQ(d->band_size, 2u);
    ++hits[d->worker];
  }
  EXPECT_EQ(hits[5], 0);  // loses every pair it is drawn into
  EXPECT_EQ(hits[4], 0);  // ineligible
  EXPECT_GT(hits[1], hits[0]);
  EXPECT_GT(hits[3], 0);

  const std::vector<uint8_t> only_two = {0, 0, 1, 0, 0, 0};
  auto d = p->route({nullptr, load, only_two, -1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 2u);
  EXPECT_EQ(d->band_size, 1u);
}

// ---- the domain oracle --------------------------------------------------------------------

TEST(DomainPools, AreContiguousProportionalAndNeverEmpty) {
  auto pools = split_into_pools(10, std::vector<uint64_t>{50, 30, 20});
  ASSERT_TRUE(pools.ok());
  ASSERT_EQ(pools->size(), 3u);
  EXPECT_EQ((*pools)[0].first, 0u);
  EXPECT_EQ((*pools)[0].count, 5u);
  EXPECT_EQ((*pools)[1].first, 5u);
  EXPECT_EQ((*pools)[1].count, 3u);
  EXPECT_EQ((*pools)[2].first, 8u);
  EXPECT_EQ((*pools)[2].count, 2u);

  // Largest remainder: equal remainders go to the lowest label.
  pools = split_into_pools(4, std::vector<uint64_t>{1, 1, 1});
  ASSERT_TRUE(pools.ok());
  EXPECT_EQ((*pools)[0].count, 2u);
  EXPECT_EQ((*pools)[1].count, 1u);
  EXPECT_EQ((*pools)[2].count, 1u);

  // A tiny or empty domain still gets one worker, taken from the largest pool.
  pools = split_into_pools(4, std::vector<uint64_t>{1, 1000, 0});
  ASSERT_TRUE(pools.ok());
  EXPECT_EQ((*pools)[0].count, 1u);
  EXPECT_EQ((*pools)[1].count, 2u);
  EXPECT_EQ((*pools)[2].count, 1u);
  EXPECT_EQ((*pools)[2].first, 3u);

  // Fewer workers than domains: single-worker pools at the middle of each share.
  pools = split_into_pools(2, std::vector<uint64_t>{1, 1, 1, 1});
  ASSERT_TRUE(pools.ok());
  const uint32_t expected_first[] = {0, 0, 1, 1};
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ((*pools)[d].first, expected_first[d]);
    EXPECT_EQ((*pools)[d].count, 1u);
  }

  EXPECT_FALSE(split_into_pools(0, std::vector<uint64_t>{1}).ok());
  EXPECT_FALSE(split_into_pools(4, std::vector<uint64_t>{}).ok());
  EXPECT_FALSE(split_into_pools(4, std::vector<uint64_t>{0, 0}).ok());
  EXPECT_FALSE(split_into_pools(4, std::vector<uint64_t>{uint64_t{1} << 32, 1}).ok());
}

TEST(DomainPolicy, KeepsEachLabelInItsPoolWithJsqInside) {
  policy_config c = workers(8);
  c.domain_counts = {500, 250, 250};  // pools [0,4), [4,6), [6,8)
  auto p = make_or_die("domain", c);
  std::vector<uint32_t> load(8, 0);
  std::mt19937 gen(3);
  for (int i = 0; i < 300; ++i) {
    const int32_t label = static_cast<int32_t>(gen() % 3);
    const uint32_t w = route_or_die(*p, {nullptr, load, {}, label});
    const uint32_t first = label == 0 ? 0 : label == 1 ? 4 : 6;
    const uint32_t end = label == 0 ? 4 : label == 1 ? 6 : 8;
    ASSERT_GE(w, first);
    ASSERT_LT(w, end);
    // JSQ inside the pool: nobody in the pool had a smaller load.
    for (uint32_t o = first; o < end; ++o)
      EXPECT_GE(load[o], load[w]);
    ++load[w];
  }
  // Unknown label: JSQ over everyone.
  load = {5, 5, 5, 5, 5, 5, 5, 0};
  EXPECT_EQ(route_or_die(*p, {nullptr, load, {}, -1}), 7u);
  // A drained pool falls back to JSQ over the eligible workers.
  const std::vector<uint8_t> pool1_drained = {1, 1, 1, 1, 0, 0, 1, 1};
  EXPECT_EQ(route_or_die(*p, {nullptr, load, pool1_drained, 1}), 7u);
  // Ineligible workers inside the pool are skipped.
  load.assign(8, 0);
  const std::vector<uint8_t> first_drained = {0, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(route_or_die(*p, {nullptr, load, first_drained, 0}), 1u);
}

TEST(DomainPolicy, RejectsUnknownLabels) {
  policy_config c = workers(4);
  c.domain_counts = {1, 1};
  auto p = make_or_die("domain", c);
  const std::vector<uint32_t> load(4, 0);
  for (int32_t label : {2, 17, -2}) {
    auto r = p->route({nullptr, load, {}, label});
    ASSERT_FALSE(r.ok()) << label;
    EXPECT_NE(r.error().message().find("unknown domain label " + std::to_string(label)),
              std::string::npos)
        << r.error().message();
  }
}

// ---- the locality band ------------------------------------------------------------------------

TEST(LocalityBand, BandFollowsTau) {
  // Scores 0.60, 0.55, 0.45, 0.20; the least-loaded band member wins.
  const signature v = with_scores({0.60f, 0.55f, 0.45f, 0.20f});
  const std::vector<uint32_t> load = {5, 3, 1, 0};
  struct expectation {
    float tau;
    uint32_t worker;
    std::vector<uint32_t> band;
  };
  const std::vector<expectation> cases = {
      {0.0f, 0, {0}}, {0.1f, 1, {0, 1}}, {0.3f, 2, {0, 1, 2}}, {0.5f, 3, {0, 1, 2, 3}}};
  for (const expectation& e : cases) {
    for (bool widen : {true, false}) {  // bands of >= 2 (or tau = 0) are never widened
      auto p = make_or_die("eldr", eldr_config(axis_set(4, 9), e.tau, widen));
      route_trace trace;
      auto d = p->route({&v, load, {}, -1}, &trace);
      ASSERT_TRUE(d.ok()) << d.error().to_string();
      EXPECT_EQ(d->worker, e.worker) << "tau " << e.tau;
      EXPECT_EQ(d->band_size, e.band.size());
      EXPECT_EQ(trace.candidates, e.band);
      EXPECT_FALSE(trace.widened);
      EXPECT_NEAR(d->best_score, 0.60f, 1e-6);
      EXPECT_NEAR(d->worker_score, trace.score[e.worker], 1e-6);
      EXPECT_NEAR(trace.threshold, 0.60f - e.tau, 1e-6);
      EXPECT_EQ(d->epoch, 9u);
      ASSERT_EQ(trace.score.size(), 4u);
      EXPECT_NEAR(trace.score[2], 0.45f, 1e-6);
    }
  }
}

TEST(LocalityBand, WidenSingleAddsTheRunnerUpOnlyWhenTauIsPositive) {
  const signature v = with_scores({0.70f, 0.45f, 0.45f, 0.10f});  // runner-up tie: index 1
  const std::vector<uint32_t> load = {5, 3, 0, 0};
  route_trace trace;

  auto on = make_or_die("eldr", eldr_config(axis_set(4), 0.1f, true));
  auto d = on->route({&v, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);
  EXPECT_EQ(d->band_size, 2u);
  EXPECT_TRUE(trace.widened);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{0, 1}));

  auto off = make_or_die("eldr", eldr_config(axis_set(4), 0.1f, false));
  d = off->route({&v, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_EQ(d->band_size, 1u);
  EXPECT_FALSE(trace.widened);

  auto tau0 = make_or_die("eldr", eldr_config(axis_set(4), 0.0f, true));
  d = tau0->route({&v, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_EQ(d->band_size, 1u);

  // Widening looks at eligible workers only: with 1 drained, the runner-up is 2.
  const std::vector<uint8_t> mask = {1, 0, 1, 1};
  d = on->route({&v, load, mask, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 2u);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{0, 2}));
  // A single eligible worker cannot be widened.
  const std::vector<uint8_t> only0 = {1, 0, 0, 0};
  d = on->route({&v, load, only0, -1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_EQ(d->band_size, 1u);
}

TEST(LocalityBand, TiesGoToTheLowestIndex) {
  auto p = make_or_die("eldr", eldr_config(axis_set(4), 0.3f, true));
  const signature v = with_scores({0.50f, 0.60f, 0.40f, 0.0f});  // band {0, 1, 2}
  std::vector<uint32_t> load = {2, 2, 2, 0};
  EXPECT_EQ(route_or_die(*p, {&v, load, {}, -1}), 0u);
  load = {3, 1, 1, 0};
  EXPECT_EQ(route_or_die(*p, {&v, load, {}, -1}), 1u);
  // Equal top scores: both are "best"; tau 0 keeps exactly the tied pair.
  auto tau0 = make_or_die("eldr", eldr_config(axis_set(4), 0.0f, true));
  const signature tie = with_scores({0.10f, 0.60f, 0.60f, 0.0f});
  load = {0, 4, 4, 0};
  route_trace trace;
  auto d = tau0->route({&tie, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{1, 2}));
}

TEST(LocalityBand, AllZeroSignatureIsPlainJsq) {
  auto p = make_or_die("eldr", eldr_config(axis_set(5), 0.0f, true));
  auto jsq = make_or_die("jsq", workers(5));
  std::mt19937 gen(8);
  signature none;           // width 0: "no signature"
  signature zero_of_width;  // the right width, no nonzeros
  zero_of_width.width = 6;
  for (int i = 0; i < 50; ++i) {
    std::vector<uint32_t> load(5);
    for (uint32_t& l : load)
      l = gen() % 4;
    std::vector<uint8_t> mask(5);
    for (uint8_t& m : mask)
      m = gen() % 3 != 0 ? 1 : 0;
    mask[i % 5] = 1;
    const uint32_t expected = route_or_die(*jsq, {nullptr, load, mask, -1});
    const signature* const inputs[] = {nullptr, &none, &zero_of_width};
    for (const signature* s : inputs) {
      auto d = p->route({s, load, mask, -1});
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d->worker, expected);
      EXPECT_EQ(d->best_score, 0.0f);
    }
  }
  signature wrong_width;
  wrong_width.width = 9;
  EXPECT_FALSE(p->route({&wrong_width, std::vector<uint32_t>(5, 0), {}, -1}).ok());
}

TEST(LocalityBand, RejectsSignaturesThatDoNotFitTheSet) {
  auto p = make_or_die("eldr", eldr_config(axis_set(4, 3), 0.1f, true));
  const std::vector<uint32_t> load(4, 0);
  signature v = with_scores({0.5f, 0.1f, 0.1f, 0.1f});
  v.width = 6;
  auto r = p->route({&v, load, {}, -1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::invalid_argument);
  EXPECT_NE(r.error().message().find("width 6 does not match the centroid set's width 5 (epoch 3)"),
            std::string::npos)
      << r.error().message();
  v = with_scores({0.5f, 0.1f, 0.1f, 0.1f});
  std::swap(v.index[0], v.index[1]);
  EXPECT_FALSE(p->route({&v, load, {}, -1}).ok());
}

// The decision must equal a direct reading of the rule on the scores the trace reports (which
// CentroidSet tests check against a naive dot product), over many random situations.
uint32_t reference_band_pick(const std::vector<float>& s, const std::vector<uint32_t>& load,
                             const std::vector<uint8_t>& mask, float tau, bool widen,
                             uint32_t* band_size) {
  const uint32_t k = static_cast<uint32_t>(s.size());
  float best = -std::numeric_limits<float>::infinity();
  for (uint32_t w = 0; w < k; ++w)
    if (mask[w]) best = std::max(best, s[w]);
  std::vector<uint32_t> band;
  for (uint32_t w = 0; w < k; ++w)
    if (mask[w] && s[w] >= best - tau) band.push_back(w);
  if (widen && tau > 0.0f && band.size() == 1) {
    uint32_t runner_up = k;
    for (uint32_t w = 0; w < k; ++w) {
      if (!mask[w] || w == band[0]) continue;
      if (runner_up == k || s[w] > s[runner_up]) runner_up = w;
    }
    if (runner_up != k) band = {std::min(band[0], runner_up), std::max(band[0], runner_up)};
  }
  *band_size = static_cast<uint32_t>(band.size());
  uint32_t pick = band[0];
  for (uint32_t w : band)
    if (load[w] < load[pick]) pick = w;
  return pick;
}

using uniform01 = std::uniform_real_distribution<float>;

// K random centroids `width` wide for the reference checks: each entry nonzero with probability
// one half, plus 0.1 on one axis per row so that no row is all zero.
result<centroid_set> random_centroids(std::mt19937& gen, uniform01& u, uint32_t k, uint32_t width,
                                      uint64_t epoch) {
  std::vector<float> rows(static_cast<std::size_t>(k) * width);
  for (float& x : rows)
    x = u(gen) < 0.5f ? u(gen) : 0.0f;
  for (uint32_t r = 0; r < k; ++r)
    rows[static_cast<std::size_t>(r) * width + r % width] += 0.1f;
  return centroid_set::make(k, width, std::move(rows), epoch);
}

// A random unit-norm signature `width` wide, each dimension present with probability 0.3 (so it
// may have none).
signature random_unit_signature(std::mt19937& gen, uniform01& u, uint32_t width) {
  signature v;
  v.width = width;
  for (uint32_t d = 0; d < width; ++d)
    if (u(gen) < 0.3f) {
      v.index.push_back(d);
      v.value.push_back(u(gen));
    }
  double norm = 0.0;
  for (float x : v.value)
    norm += static_cast<double>(x) * x;
  for (float& x : v.value)
    x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

// An eligibility mask of K workers, each eligible with probability `p`, and one more always.
std::vector<uint8_t> random_mask(std::mt19937& gen, uniform01& u, uint32_t k, float p) {
  std::vector<uint8_t> mask(k);
  for (uint8_t& m : mask)
    m = u(gen) < p ? 1 : 0;
  mask[gen() % k] = 1;
  return mask;
}

// What each randomized band trial draws first: K = 2 + gen() % k_spread, K random centroids
// band_trial_width wide at epoch `trial`, and tau and widen cycling with the trial number.
constexpr uint32_t band_trial_width = 24;
struct band_trial {
  uint32_t k = 0;
  std::shared_ptr<const centroid_set> centroids;
  float tau = 0.0f;
  bool widen = false;
};
result<band_trial> draw_band_trial(std::mt19937& gen, uniform01& u, int trial, uint32_t k_spread) {
  static constexpr float taus[] = {0.0f, 0.05f, 0.1f, 0.3f};
  band_trial t;
  t.k = 2 + gen() % k_spread;
  auto set = random_centroids(gen, u, t.k, band_trial_width, static_cast<uint64_t>(trial));
  if (!set.ok()) return set.error();
  t.centroids = std::make_shared<const centroid_set>(std::move(set).value());
  t.tau = taus[trial % 4];
  t.widen = (trial / 4) % 2 == 0;
  return t;
}

TEST(LocalityBand, MatchesTheRuleOnRandomSituationsAndNeverPicksIneligible) {
  std::mt19937 gen(2024);
  uniform01 u(0.0f, 1.0f);
  for (int trial = 0; trial < 400; ++trial) {
    const auto drawn = draw_band_trial(gen, u, trial, 19);
    ASSERT_TRUE(drawn.ok());
    const auto& [k, centroids, tau, widen] = *drawn;
    auto p = make_or_die("eldr", eldr_config(centroids, tau, widen));
    const signature v = random_unit_signature(gen, u, band_trial_width);
    std::vector<uint32_t> load(k);
    for (uint32_t& l : load)
      l = gen() % 4;
    const std::vector<uint8_t> mask = random_mask(gen, u, k, 0.7f);

    route_trace trace;
    auto d = p->route({&v, load, mask, -1}, &trace);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(trace.score.size(), k);
    uint32_t band_size = 0;
    EXPECT_EQ(d->worker, reference_band_pick(trace.score, load, mask, tau, widen, &band_size))
        << "trial " << trial;
    EXPECT_EQ(d->band_size, band_size) << "trial " << trial;
    EXPECT_NE(mask[d->worker], 0) << "trial " << trial;
    EXPECT_EQ(d->epoch, static_cast<uint64_t>(trial));
  }
}

// `p`, made over axis_set(3, 1), sends `v` (scores {0.8, 0.1, 0.1}) to worker 0; installing epoch
// 2, which swaps the first two centroids, sends the same signature to worker 1. Each decision
// names the epoch it used.
void expect_installed_swap_moves_the_decision(centroid_policy& p, const signature& v,
                                              const std::vector<uint32_t>& load) {
  auto d = p.route({&v, load, {}, -1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_EQ(d->epoch, 1u);
  auto swapped = centroid_set::make(3, 4, {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0}, 2);
  ASSERT_TRUE(swapped.ok());
  ASSERT_TRUE(p.install(std::make_shared<const centroid_set>(std::move(swapped).value())).ok());
  EXPECT_EQ(p.centroids()->epoch(), 2u);
  d = p.route({&v, load, {}, -1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);
  EXPECT_EQ(d->epoch, 2u);
}

TEST(LocalityBand, InstalledSetIsUsedByTheNextDecision) {
  auto made = locality_band_policy::make(axis_set(3, 1), 0.0f, true);
  ASSERT_TRUE(made.ok());
  locality_band_policy& p = **made;
  const signature v = with_scores({0.8f, 0.1f, 0.1f});
  const std::vector<uint32_t> load(3, 0);
  // Epoch 2 swaps the first two centroids: the same signature now belongs to worker 1.
  ASSERT_NO_FATAL_FAILURE(expect_installed_swap_moves_the_decision(p, v, load));

  // K is fixed; the width may change, and then old-width signatures are rejected.
  EXPECT_FALSE(p.install(nullptr).ok());
  const status wrong_k = p.install(axis_set(4, 3));
  ASSERT_FALSE(wrong_k.ok());
  EXPECT_NE(wrong_k.message().find("K = 4"), std::string::npos);
  EXPECT_EQ(p.centroids()->epoch(), 2u);
  auto wider = centroid_set::make(3, 8, std::vector<float>(24, 1.0f), 4);
  ASSERT_TRUE(wider.ok());
  ASSERT_TRUE(p.install(std::make_shared<const centroid_set>(std::move(wider).value())).ok());
  EXPECT_FALSE(p.route({&v, load, {}, -1}).ok());
  auto d = p.route({nullptr, load, {}, -1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->epoch, 4u);
}

// ---- eldr-adaptive ------------------------------------------------------------------------------

policy_config adaptive_config(std::shared_ptr<const centroid_set> set, float tau, bool widen,
                              float slack, uint32_t group_min_load = default_group_min_load) {
  policy_config c = eldr_config(std::move(set), tau, widen);
  c.load_slack = slack;
  c.group_min_load = group_min_load;
  return c;
}

TEST(AdaptiveBand, NeedsACentroidSetAndAValidSlack) {
  auto none = make_policy("eldr-adaptive", policy_config{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), status_code::invalid_argument);
  EXPECT_EQ(none.error().message(), "eldr-adaptive policy: no centroid set given");
  EXPECT_FALSE(adaptive_band_policy::make(nullptr).ok());
  policy_config c = adaptive_config(axis_set(4), 0.1f, true, 0.5f);
  c.workers = 5;
  auto mismatch = make_policy("eldr-adaptive", c);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message().find("K = 4"), std::string::npos);
  for (float bad :
       {-0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto p = make_policy("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, true, bad));
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.error().message().find("load_slack"), std::string::npos);
    auto t = make_policy("eldr-adaptive", adaptive_config(axis_set(4), bad, true, 0.5f));
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.error().message().find("tau"), std::string::npos);
  }
  EXPECT_TRUE(needs_centroids("eldr"));
  EXPECT_TRUE(needs_centroids("eldr-adaptive"));
  EXPECT_FALSE(needs_centroids("jsq"));
}

TEST(AdaptiveBand, LightLoadGoesToAnIdleWorkerWhereTheBandWouldQueue) {
  // Scores 0.6 and 0.55 put workers 0 and 1 in the paper's band (tau 0.1), and the band picks
  // worker 1 although it is busy. With an idle worker (m = 0, allowance 0) the adaptive band is
  // the idle workers: 2 and 3 tie on load, recency and score, so the lower index wins.
  const signature v = with_scores({0.6f, 0.55f, 0.1f, 0.1f});
  const std::vector<uint32_t> load = {2, 1, 0, 0};
  auto eldr = make_or_die("eldr", eldr_config(axis_set(4), 0.1f, true));
  auto adaptive = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, true, 0.5f));
  EXPECT_EQ(route_or_die(*eldr, {&v, load, {}, -1}), 1u);
  route_trace trace;
  auto d = adaptive->route({&v, load, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 2u);
  EXPECT_EQ(d->band_size, 2u);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(trace.load_limit, 0u);
  EXPECT_FLOAT_EQ(d->best_score, 0.1f);  // the best score among the admissible workers
  // Among idle workers of different scores the better match wins.
  const signature w = with_scores({0.6f, 0.55f, 0.2f, 0.3f});
  EXPECT_EQ(route_or_die(*adaptive, {&w, load, {}, -1}), 3u);
}

TEST(AdaptiveBand, HeavyLoadGroupsByLocalityWithinTheSlack) {
  // m = 10, allowance floor(0.5 * 10) = 5: loads up to 15 are admissible. The band (tau 0.1) is
  // workers 2 and 3, the request's region; the less loaded of them wins although JSQ would take
  // worker 0.
  const signature v = with_scores({0.1f, 0.1f, 0.6f, 0.55f});
  auto adaptive = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, false, 0.5f));
  route_trace trace;
  auto d = adaptive->route({&v, std::vector<uint32_t>{10, 10, 12, 14}, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 2u);
  EXPECT_EQ(d->band_size, 2u);
  EXPECT_EQ(trace.load_limit, 15u);
  EXPECT_FLOAT_EQ(trace.threshold, 0.6f - 0.1f);
  // Worker 2 at 16 is beyond the slack: the band is what remains of the region, worker 3.
  d = adaptive->route({&v, std::vector<uint32_t>{10, 10, 16, 14}, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 3u);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{3}));
  // With widen_single the single-worker band takes the runner-up among the admissible workers
  // (worker 0, lowest index of the 0.1 ties), and the less loaded of the two wins.
  auto widened = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, true, 0.5f));
  d = widened->route({&v, std::vector<uint32_t>{10, 10, 16, 14}, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_TRUE(trace.widened);
  EXPECT_EQ(trace.candidates, (std::vector<uint32_t>{0, 3}));
  // Slack 0 is JSQ whatever the scores (ties aside).
  auto no_slack = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, true, 0.0f));
  EXPECT_EQ(route_or_die(*no_slack, {&v, std::vector<uint32_t>{11, 10, 12, 14}, {}, -1}), 1u);
}

TEST(AdaptiveBand, GroupingStartsAtTheGroupMinLoad) {
  // Worker 2 is the request's region but one request busier than the lightest. With m = 2 the
  // slack would admit it (floor(0.5 * 2) = 1), but grouping starts at m = 3 by default: a
  // least-loaded worker is picked. At m = 3 the slack (1) admits worker 2 and the band picks it.
  const signature v = with_scores({0.1f, 0.1f, 0.6f, 0.1f});
  auto p = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, false, 0.5f));
  EXPECT_EQ(p->name(), "eldr-adaptive");
  route_trace trace;
  auto d = p->route({&v, std::vector<uint32_t>{2, 2, 3, 2}, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->worker, 2u);
  EXPECT_EQ(trace.load_limit, 2u);
  d = p->route({&v, std::vector<uint32_t>{3, 3, 4, 3}, {}, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 2u);
  EXPECT_EQ(trace.load_limit, 4u);
  // group_min_load 0 groups from m = 2 (the rule before the threshold); a large one never groups.
  auto early = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, false, 0.5f, 0));
  EXPECT_EQ(route_or_die(*early, {&v, std::vector<uint32_t>{2, 2, 3, 2}, {}, -1}), 2u);
  auto never = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, false, 0.5f, 1000));
  EXPECT_NE(route_or_die(*never, {&v, std::vector<uint32_t>{30, 30, 31, 30}, {}, -1}), 2u);
}

TEST(AdaptiveBand, TiesGoToTheLeastRecentlyRoutedThenTheBetterScoreThenTheLowestIndex) {
  auto p = make_or_die("eldr-adaptive", adaptive_config(axis_set(3), 0.1f, true, 0.5f));
  const std::vector<uint32_t> load(3, 0);
  // Equal loads and scores (no signature): never routed -> lowest index, then round-robin order,
  // since each pick becomes the most recently routed.
  std::vector<uint32_t> picks;
  for (int i = 0; i < 5; ++i)
    picks.push_back(route_or_die(*p, {nullptr, load, {}, -1}));
  EXPECT_EQ(picks, (std::vector<uint32_t>{0, 1, 2, 0, 1}));
  // Fresh policy: equal loads and recency, scores differ -> the better score.
  auto q = make_or_die("eldr-adaptive", adaptive_config(axis_set(3), 0.1f, true, 0.5f));
  const signature v = with_scores({0.2f, 0.5f, 0.3f});
  EXPECT_EQ(route_or_die(*q, {&v, load, {}, -1}), 1u);
  // Recency beats score: worker 1 was just routed to, so worker 2 (0.3) is next, then 0.
  EXPECT_EQ(route_or_die(*q, {&v, load, {}, -1}), 2u);
  EXPECT_EQ(route_or_die(*q, {&v, load, {}, -1}), 0u);
}

TEST(AdaptiveBand, DrainedAndDeadWorkersAreNeitherPickedNorTheLightestLoad) {
  // Worker 0 is idle but ineligible: the lightest eligible load is 8 (allowance 4, limit 12), so
  // every eligible worker is admissible and the band is worker 3's region.
  const signature v = with_scores({0.6f, 0.1f, 0.1f, 0.5f});
  auto p = make_or_die("eldr-adaptive", adaptive_config(axis_set(4), 0.1f, false, 0.5f));
  const std::vector<uint32_t> load = {0, 8, 8, 9};
  const std::vector<uint8_t> mask = {0, 1, 1, 1};
  route_trace trace;
  auto d = p->route({&v, load, mask, -1}, &trace);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 3u);
  EXPECT_EQ(trace.load_limit, 12u);
  // Only worker 2 eligible: it is chosen whatever the scores.
  const std::vector<uint8_t> only2 = {0, 0, 1, 0};
  EXPECT_EQ(route_or_die(*p, {&v, load, only2, -1}), 2u);
  auto none = p->route({&v, load, std::vector<uint8_t>(4, 0), -1});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), status_code::failed_precondition);
}

// A direct reading of the adaptive rule, with the recency state kept by the reference itself.
uint32_t reference_adaptive_pick(const std::vector<float>& s, const std::vector<uint32_t>& load,
                                 const std::vector<uint8_t>& mask, float tau, bool widen,
                                 float slack, uint32_t min_load, const std::vector<uint64_t>& last,
                                 uint32_t* band_size) {
  const uint32_t k = static_cast<uint32_t>(s.size());
  uint32_t m = std::numeric_limits<uint32_t>::max();
  for (uint32_t w = 0; w < k; ++w)
    if (mask[w]) m = std::min(m, load[w]);
  const double a = m < min_load ? 0.0 : std::floor(static_cast<double>(slack) * m);
  std::vector<uint32_t> admissible;
  for (uint32_t w = 0; w < k; ++w)
    if (mask[w] && load[w] <= m + a) admissible.push_back(w);
  float best = -std::numeric_limits<float>::infinity();
  for (uint32_t w : admissible)
    best = std::max(best, s[w]);
  std::vector<uint32_t> band;
  for (uint32_t w : admissible)
    if (a < 1.0 || s[w] >= best - tau) band.push_back(w);
  if (a >= 1.0 && widen && tau > 0.0f && band.size() == 1 && admissible.size() > 1) {
    uint32_t runner_up = k;
    for (uint32_t w : admissible) {
      if (w == band[0]) continue;
      if (runner_up == k || s[w] > s[runner_up]) runner_up = w;
    }
    band = {std::min(band[0], runner_up), std::max(band[0], runner_up)};
  }
  *band_size = static_cast<uint32_t>(band.size());
  uint32_t pick = band[0];
  for (uint32_t w : band) {
    const bool better = load[w] != load[pick]   ? load[w] < load[pick]
                        : last[w] != last[pick] ? last[w] < last[pick]
                        : s[w] != s[pick]       ? s[w] > s[pick]
                                                : w < pick;
    if (better) pick = w;
  }
  return pick;
}

TEST(AdaptiveBand, MatchesTheRuleOnRandomSituations) {
  std::mt19937 gen(77);
  uniform01 u(0.0f, 1.0f);
  const float slacks[] = {0.0f, 0.25f, 0.5f, 1.0f, 1e9f};
  const uint32_t min_loads[] = {0, 1, 3, 5};
  for (int trial = 0; trial < 200; ++trial) {
    const auto drawn = draw_band_trial(gen, u, trial, 15);
    ASSERT_TRUE(drawn.ok());
    const auto& [k, centroids, tau, widen] = *drawn;
    const float slack = slacks[trial % 5];
    const uint32_t min_load = min_loads[(trial / 3) % 4];
    auto p = make_or_die("eldr-adaptive", adaptive_config(centroids, tau, widen, slack, min_load));
    std::vector<uint64_t> last(k, 0);
    // Several decisions per policy, so the recency state matters.
    for (uint64_t step = 1; step <= 6; ++step) {
      const signature v = random_unit_signature(gen, u, band_trial_width);
      std::vector<uint32_t> load(k);
      for (uint32_t& l : load)
        l = gen() % 3 == 0 ? gen() % 6 : 4 + gen() % 12;
      const std::vector<uint8_t> mask = random_mask(gen, u, k, 0.8f);
      route_trace trace;
      auto d = p->route({v.index.empty() ? nullptr : &v, load, mask, -1}, &trace);
      ASSERT_TRUE(d.ok()) << d.error().to_string();
      uint32_t band_size = 0;
      const uint32_t want = reference_adaptive_pick(trace.score, load, mask, tau, widen, slack,
                                                    min_load, last, &band_size);
      EXPECT_EQ(d->worker, want) << "trial " << trial << " step " << step;
      EXPECT_EQ(d->band_size, band_size) << "trial " << trial << " step " << step;
      EXPECT_NE(mask[d->worker], 0);
      last[d->worker] = step;
    }
  }
}

TEST(AdaptiveBand, InstallSwapsTheSetLikeTheBand) {
  auto made = adaptive_band_policy::make(axis_set(3, 1), 0.0f, true, 0.5f);
  ASSERT_TRUE(made.ok());
  adaptive_band_policy& p = **made;
  const signature v = with_scores({0.8f, 0.1f, 0.1f});
  const std::vector<uint32_t> load(3, 4);  // allowance 2: the band decides
  ASSERT_NO_FATAL_FAILURE(expect_installed_swap_moves_the_decision(p, v, load));
  const status wrong_k = p.install(axis_set(4, 3));
  ASSERT_FALSE(wrong_k.ok());
  EXPECT_NE(wrong_k.message().find("eldr-adaptive policy"), std::string::npos);
}

// ---- the fast path --------------------------------------------------------------------------

TEST(RoutingPolicy, DecisionsDoNotAllocate) {
  std::vector<float> rows(64 * 1024);
  std::mt19937 gen(1);
  for (float& x : rows)
    x = static_cast<float>(gen() % 1000) / 1000.0f + 0.001f;
  auto set = centroid_set::make(64, 1024, std::move(rows), 1);
  ASSERT_TRUE(set.ok());
  policy_config c = workers(64, 3);
  c.domain_counts = {2, 1, 1};
  c.centroids = std::make_shared<const centroid_set>(std::move(set).value());
  signature v;
  v.width = 1024;
  for (uint32_t d = 0; d < 1024; d += 3) {
    v.index.push_back(d);
    v.value.push_back(1.0f / std::sqrt(342.0f));
  }
  std::vector<uint32_t> load(64);
  for (uint32_t& l : load)
    l = gen() % 16;
  std::vector<uint8_t> mask(64, 1);
  mask[5] = 0;
  for (std::string_view name : policy_names()) {
    auto p = make_or_die(name, c);
    route_trace trace;  // a trace reuses its capacity once grown
    ASSERT_TRUE(p->route({&v, load, mask, 1}, &trace).ok());
    const uint64_t before = allocations.load();
    auto probe = std::make_unique<std::vector<int>>(8);  // the counter does see allocations
    EXPECT_GE(allocations.load(), before + 2);
    probe.reset();
    const uint64_t start = allocations.load();
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(p->route({&v, load, mask, 1}).ok());
      ASSERT_TRUE(p->route({&v, load, {}, -1}).ok());
    }
    EXPECT_EQ(allocations.load(), start) << name;
  }
}

}  // namespace
}  // namespace eldr
