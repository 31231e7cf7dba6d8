// decode_engine: admission order, batch and KV limits, step cost from the batch's real expert ids,
// completions and the TPOT/TTFT accounting, driven by hand with the caller's clock.
#include "core/sim/decode_engine.hpp"

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/formats/trace.hpp"
#include "core/sim/workload.hpp"

namespace eldr {
namespace {

// Two MoE layers of 8 experts, top-1: a decode token is its two expert ids (layer 0, layer 1).
constexpr model_geometry geometry{2, 8, 1};

struct request_spec {
  uint32_t prompt_tokens = 10;
  std::vector<std::array<expert_id, 2>> decode;  // one (layer 0, layer 1) pair per output token
  double arrival_s = 0.0;
};

// A workload whose requests are exactly `specs`, in order, from a trace built for them.
workload workload_of(const std::vector<request_spec>& specs) {
  auto t = std::make_shared<trace>();
  t->model_name = "tiny";
  t->geometry = geometry;
  workload w;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    trace_request r;
    r.id = "r" + std::to_string(i);
    r.prompt_tokens = specs[i].prompt_tokens;
    r.output_tokens = static_cast<uint32_t>(specs[i].decode.size());
    r.experts.assign(std::size_t{r.prompt_tokens} * 2, 0);
    for (const auto& token : specs[i].decode)
      r.experts.insert(r.experts.end(), token.begin(), token.end());
    sim_request s;
    s.source = i;
    s.arrival_s = specs[i].arrival_s;
    s.prompt_tokens = r.prompt_tokens;
    s.output_tokens = r.output_tokens;
    w.requests.push_back(s);
    t->requests.push_back(std::move(r));
  }
  w.source = make_trace_source(t);
  return w;
}

// Step = 1 ms + 1 ms per distinct (layer, expert): the step times spell out the distinct counts.
decode_engine_config per_expert_config(uint32_t workers = 1) {
  decode_engine_config c;
  c.workers = workers;
  c.cost = {1.0, 1.0, 0.0, 0.0};
  return c;
}

TEST(DecodeEngine, RefusesNoWorkersNoBatchAndABadCostModel) {
  const workload w = workload_of({{10, {{1, 2}}}});
  decode_engine_config c = per_expert_config();
  c.workers = 0;
  EXPECT_FALSE(decode_engine::make(w, c).ok());
  c = per_expert_config();
  c.max_batch = 0;
  EXPECT_FALSE(decode_engine::make(w, c).ok());
  c = per_expert_config();
  c.cost.base_ms = -1.0;
  EXPECT_FALSE(decode_engine::make(w, c).ok());
}

TEST(DecodeEngine, StepCostCountsTheBatchsRealDistinctExperts) {
  // Request 0: tokens (1,2) then (1,3); request 1: (1,5) then (4,3).
  const workload w = workload_of({{10, {{1, 2}, {1, 3}}}, {10, {{1, 5}, {4, 3}}}});
  decode_engine e = decode_engine::make(w, per_expert_config()).value();
  std::vector<decode_finish> done;
  // Request 0 alone: 2 distinct experts -> 3 ms.
  EXPECT_EQ(e.arrive(0, 0, 0.0, done), std::optional<double>(0.003));
  // The worker is stepping: request 1 waits for the step's end, no new step.
  EXPECT_EQ(e.arrive(1, 0, 0.001, done), std::nullopt);
  EXPECT_EQ(e.running(0), 1u);
  EXPECT_EQ(e.waiting(0), 1u);
  EXPECT_DOUBLE_EQ(e.last_step_ms(0), 3.0);
  // Step 2: (1,3) and (1,5): layer 0 {1}, layer 1 {3,5} -> 3 distinct -> 4 ms.
  auto end = e.end_step(0, 0.003, done);
  ASSERT_TRUE(end.has_value());
  EXPECT_DOUBLE_EQ(*end, 0.003 + 0.004);
  EXPECT_EQ(e.running(0), 2u);
  EXPECT_TRUE(done.empty());
  EXPECT_DOUBLE_EQ(e.times(0).first_token, 0.003);
  // Request 0 finishes; step 3 runs request 1's (4,3) alone: 2 distinct -> 3 ms.
  end = e.end_step(0, *end, done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].request, 0u);
  EXPECT_EQ(done[0].worker, 0u);
  EXPECT_DOUBLE_EQ(done[0].t, 0.007);
  EXPECT_DOUBLE_EQ(e.times(1).first_token, 0.007);
  ASSERT_TRUE(end.has_value());
  EXPECT_DOUBLE_EQ(*end, 0.010);
  EXPECT_EQ(e.end_step(0, *end, done), std::nullopt);  // nothing left: idle
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1].request, 1u);
  EXPECT_DOUBLE_EQ(e.times(1).finish, 0.010);
  EXPECT_EQ(e.decode_steps(), 3u);
  // Distinct per layer: (1 + 1) / 2, (1 + 2) / 2, (1 + 1) / 2 over three steps.
  EXPECT_DOUBLE_EQ(e.distinct_experts_per_layer(), (1.0 + 1.5 + 1.0) / 3);
  EXPECT_DOUBLE_EQ(e.batch_size_mean(), (1.0 + 2.0 + 1.0) / 3);
}

TEST(DecodeEngine, ContextTokensAndSequencesEnterTheStepCost) {
  const workload w = workload_of({{100, {{1, 2}, {1, 2}, {1, 2}}}});
  decode_engine_config c;
  c.workers = 1;
  c.cost = {1.0, 0.0, 0.5, 10.0};  // 0.5 ms per sequence, 10 ms per 1,000 context tokens
  decode_engine e = decode_engine::make(w, c).value();
  std::vector<decode_finish> done;
  // The first step reads the 100 prompt tokens, the next 101: the context grows by each token.
  EXPECT_NEAR(e.arrive(0, 0, 0.0, done).value(), (1.0 + 0.5 + 1.0) / 1000, 1e-12);
  EXPECT_NEAR(e.end_step(0, 0.0025, done).value(), 0.0025 + (1.0 + 0.5 + 1.01) / 1000, 1e-12);
}

TEST(DecodeEngine, AdmitsFirstComeFirstServedUpToTheBatchLimit) {
  // Request 0 is one token long, the others three.
  const workload w = workload_of({{10, {{1, 1}}},
                                  {10, {{1, 1}, {1, 1}, {1, 1}}},
                                  {10, {{1, 1}, {1, 1}, {1, 1}}},
                                  {10, {{1, 1}, {1, 1}, {1, 1}}}});
  decode_engine_config c = per_expert_config();
  c.max_batch = 2;
  decode_engine e = decode_engine::make(w, c).value();
  std::vector<decode_finish> done;
  double t = e.arrive(0, 0, 0.0, done).value();
  for (uint32_t i : {1u, 2u, 3u})
    EXPECT_EQ(e.arrive(i, 0, 0.0, done), std::nullopt);
  EXPECT_EQ(e.running(0), 1u);  // admitted between steps only
  t = e.end_step(0, t, done).value();
  // Request 0 done; 1 and 2 admitted in arrival order, 3 waits for a free slot.
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(e.running(0), 2u);
  EXPECT_EQ(e.waiting(0), 1u);
  EXPECT_LT(e.times(1).first_token, 0.0);  // admitted; its first token is the next step's
  std::optional<double> next = t;
  while (next)
    next = e.end_step(0, *next, done);
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[1].request, 1u);
  EXPECT_EQ(done[2].request, 2u);
  EXPECT_EQ(done[3].request, 3u);
  EXPECT_DOUBLE_EQ(e.times(1).finish, e.times(2).finish);  // the same three steps
  EXPECT_GT(e.times(3).first_token, e.times(2).first_token);
  EXPECT_EQ(e.decode_steps(), 1u + 3u + 3u);  // 3 is admitted when 1 and 2 finish
}

TEST(DecodeEngine, KvCapacityReservesPromptAndOutputAndLetsAGiantRunAlone) {
  // 10 + 2 tokens each; a 30-token request exceeds the whole capacity.
  const workload w =
      workload_of({{10, {{1, 1}, {1, 1}}}, {10, {{1, 1}, {1, 1}}}, {28, {{1, 1}, {1, 1}}}});
  decode_engine_config c = per_expert_config();
  c.kv_capacity_tokens = 20;
  decode_engine e = decode_engine::make(w, c).value();
  std::vector<decode_finish> done;
  std::optional<double> t = e.arrive(0, 0, 0.0, done);
  e.arrive(1, 0, 0.0, done);
  e.arrive(2, 0, 0.0, done);
  t = e.end_step(0, *t, done);
  EXPECT_EQ(e.running(0), 1u);  // 12 + 12 > 20: request 1 waits
  t = e.end_step(0, *t, done);  // request 0 frees its 12 tokens; 1 is admitted
  EXPECT_EQ(e.running(0), 1u);
  EXPECT_EQ(e.waiting(0), 1u);
  while (t)
    t = e.end_step(0, *t, done);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[2].request, 2u);  // larger than the capacity, yet served, alone
  EXPECT_DOUBLE_EQ(e.batch_size_mean(), 1.0);
}

TEST(DecodeEngine, ARequestWithoutOutputFinishesOnArrival) {
  const workload w = workload_of({{10, {}}});
  decode_engine e = decode_engine::make(w, per_expert_config()).value();
  std::vector<decode_finish> done;
  EXPECT_EQ(e.arrive(0, 0, 2.5, done), std::nullopt);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_DOUBLE_EQ(done[0].t, 2.5);
  EXPECT_DOUBLE_EQ(e.times(0).first_token, 2.5);
  EXPECT_EQ(e.decode_steps(), 0u);
  EXPECT_DOUBLE_EQ(e.load_imbalance(), 1.0);  // no token yet
}

TEST(DecodeEngine, WorkersBatchIndependentlyAndImbalanceCountsTokens) {
  const workload w = workload_of({{10, {{1, 1}, {1, 1}, {1, 1}}}, {10, {{2, 2}}}});
  decode_engine e = decode_engine::make(w, per_expert_config(2)).value();
  std::vector<decode_finish> done;
  std::optional<double> a = e.arrive(0, 0, 0.0, done);
  std::optional<double> b = e.arrive(1, 1, 0.0, done);
  ASSERT_TRUE(a && b);  // both idle: each starts its own step
  while (a)
    a = e.end_step(0, *a, done);
  while (b)
    b = e.end_step(1, *b, done);
  EXPECT_EQ(done.size(), 2u);
  // 3 tokens on worker 0, 1 on worker 1: max / mean = 3 / 2.
  EXPECT_DOUBLE_EQ(e.load_imbalance(), 1.5);
}

TEST(DecodeEngine, InflightImbalanceIsTheTimeAveragedMaxOverTheMean) {
  // Steps of 3 ms (two distinct experts). Worker 0 holds one request for 9 ms, worker 1 one for
  // 3 ms: max 1 throughout; mean 1 for 3 ms, then 0.5 for 6 ms. 9 / (3 + 3) = 1.5.
  const workload w = workload_of({{10, {{1, 1}, {1, 1}, {1, 1}}}, {10, {{2, 2}}}});
  decode_engine e = decode_engine::make(w, per_expert_config(2)).value();
  EXPECT_DOUBLE_EQ(e.inflight_imbalance(), 1.0);  // nothing in flight yet
  std::vector<decode_finish> done;
  std::optional<double> a = e.arrive(0, 0, 0.0, done);
  std::optional<double> b = e.arrive(1, 1, 0.0, done);
  ASSERT_TRUE(a && b);
  ASSERT_DOUBLE_EQ(*a, 0.003);
  ASSERT_DOUBLE_EQ(*b, 0.003);
  a = e.end_step(0, *a, done);  // in time order over both workers
  b = e.end_step(1, *b, done);
  EXPECT_FALSE(b);
  while (a)
    a = e.end_step(0, *a, done);
  EXPECT_NEAR(e.inflight_imbalance(), 1.5, 1e-12);
}

TEST(DecodeEngine, LatencySummaryFollowsTheDefinitions) {
  // Arrivals 0 and 1 s; request 0 three tokens, request 1 one token (no TPOT), request 2 unserved.
  const workload w = workload_of(
      {{10, {{1, 2}, {1, 2}, {1, 2}}, 0.0}, {10, {{1, 2}}, 1.0}, {10, {{1, 2}, {1, 2}}, 1.5}});
  decode_engine e = decode_engine::make(w, per_expert_config(2)).value();
  std::vector<decode_finish> done;
  std::optional<double> t = e.arrive(0, 0, 0.5, done);  // steps of 3 ms
  while (t)
    t = e.end_step(0, *t, done);
  t = e.arrive(1, 1, 2.0, done);
  while (t)
    t = e.end_step(1, *t, done);
  const std::vector<uint32_t> all = {0, 1, 2};
  const latency_summary s = summarize_latency(w, e, all);
  EXPECT_EQ(s.completed, 2u);
  EXPECT_EQ(s.incomplete, 1u);
  // TPOT: request 0 only, (0.509 - 0.503) / 2 = 3 ms.
  EXPECT_NEAR(s.tpot_p50_ms, 3.0, 1e-9);
  EXPECT_NEAR(s.tpot_p99_ms, 3.0, 1e-9);
  // TTFT from the workload's arrival: 503 ms and 1003 ms.
  EXPECT_NEAR(s.ttft_p50_ms, (503.0 + 1003.0) / 2, 1e-9);
  EXPECT_NEAR(s.ttft_p99_ms, 503.0 + 0.99 * 500.0, 1e-9);
}

TEST(Percentile, InterpolatesLinearly) {
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 4.0);
  std::vector<double> none;
  EXPECT_DOUBLE_EQ(percentile(none, 0.5), 0.0);
}

}  // namespace
}  // namespace eldr
