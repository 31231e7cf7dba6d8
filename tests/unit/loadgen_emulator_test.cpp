// loadgen emulators (tools/eldr-loadgen): block hashing, the prefill worker's prefix cache and the
// vLLM KV events it publishes, the decode emulator against core/sim/simulator on one workload, and
// the weighted rotation that spreads route requests over several routers (--router-weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cluster/wire/kv_events.hpp"
#include "core/routing.hpp"
#include "core/sim/simulator.hpp"
#include "core/sim/synthetic.hpp"
#include "core/sim/workload.hpp"
#include "tools/eldr-loadgen/decode_emulator.hpp"
#include "tools/eldr-loadgen/prefill_emulator.hpp"
#include "tools/eldr-loadgen/route_socket.hpp"
#include "tools/eldr-loadgen/setup.hpp"

namespace eldr::loadgen {
namespace {

std::vector<uint32_t> tokens_of(uint64_t source, uint32_t n) {
  std::vector<uint32_t> t;
  prompt_tokens(source, n, t);
  return t;
}

TEST(BlockHashes, DeterministicAndChained) {
  const std::vector<uint32_t> a = tokens_of(7, 40);
  EXPECT_EQ(a, tokens_of(7, 40));
  EXPECT_NE(a, tokens_of(8, 40));
  const std::vector<uint64_t> h = block_hashes(a, 16);
  ASSERT_EQ(h.size(), 3u);  // two full blocks and a partial one of 8 tokens
  EXPECT_EQ(h, block_hashes(a, 16));
  EXPECT_EQ(h[0], chain_block_hash(std::nullopt, std::span(a).subspan(0, 16)));
  EXPECT_EQ(h[1], chain_block_hash(h[0], std::span(a).subspan(16, 16)));
  EXPECT_EQ(h[2], chain_block_hash(h[1], std::span(a).subspan(32, 8)));
  // A block's hash depends on its parent: the same tokens under another parent differ.
  EXPECT_NE(chain_block_hash(std::nullopt, std::span(a).subspan(16, 16)), h[1]);
}

TEST(BlockHashes, PrefixSharingRequestsShareLeadingHashes) {
  std::vector<uint32_t> a = tokens_of(1, 64);
  std::vector<uint32_t> b = a;
  b[40] ^= 1;  // differs inside the third block
  const auto ha = block_hashes(a, 16), hb = block_hashes(b, 16);
  ASSERT_EQ(ha.size(), 4u);
  ASSERT_EQ(hb.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_NE(ha[3], hb[3]);  // chained: everything after the first difference differs
  // A prompt that stops mid-block shares the full blocks, not the partial one.
  const auto hc = block_hashes(std::span(a).subspan(0, 40), 16);
  ASSERT_EQ(hc.size(), 3u);
  EXPECT_EQ(hc[1], ha[1]);
  EXPECT_NE(hc[2], ha[2]);
}

kv_batch decode_payload(const std::vector<uint8_t>& payload) {
  std::vector<kv_decode_issue> issues;
  kv_decode_limits limits;
  limits.keep_details = true;
  auto b = decode_kv_batch(payload, limits, issues);
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().to_string());
  EXPECT_TRUE(issues.empty());
  return b.ok() ? *b : kv_batch{};
}

TEST(PrefixCache, HitStoreAndEvictProduceVllmEvents) {
  prefix_cache cache(/*capacity_blocks=*/4, /*block_size=*/4);
  const auto ta = tokens_of(1, 10), tb = tokens_of(2, 12);
  const auto ha = block_hashes(ta, 4), hb = block_hashes(tb, 4);
  ASSERT_EQ(ha.size(), 3u);  // 2 full + 1 partial
  ASSERT_EQ(hb.size(), 3u);  // 3 full

  // First prefill of a: nothing hit; its two full blocks are stored, the partial one is not.
  prefill_outcome first = cache.prefill(ha, ta);
  EXPECT_EQ(first.hit_blocks, 0u);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(first.events[0].type, kv_event_type::block_stored);
  EXPECT_EQ(first.events[0].block_hashes, (std::vector<uint64_t>{ha[0], ha[1]}));
  EXPECT_FALSE(first.events[0].parent_block_hash.has_value());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_FALSE(cache.contains(ha[2]));

  // Again: both full blocks hit, the cache does not change.
  prefill_outcome second = cache.prefill(ha, ta);
  EXPECT_EQ(second.hit_blocks, 2u);
  EXPECT_TRUE(second.events.empty());

  // b needs 3 blocks in a cache of 4 holding 2: the least recently used block of a (its first,
  // touched before its second) is evicted first.
  prefill_outcome third = cache.prefill(hb, tb);
  EXPECT_EQ(third.hit_blocks, 0u);
  ASSERT_EQ(third.events.size(), 2u);
  EXPECT_EQ(third.events[0].type, kv_event_type::block_removed);
  EXPECT_EQ(third.events[0].block_hashes, (std::vector<uint64_t>{ha[0]}));
  EXPECT_EQ(third.events[1].type, kv_event_type::block_stored);
  EXPECT_EQ(third.events[1].block_hashes, (std::vector<uint64_t>{hb[0], hb[1], hb[2]}));
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_TRUE(cache.contains(ha[1]));
  EXPECT_FALSE(cache.contains(ha[0]));

  // a's first block is gone, so a prefills from scratch: its first block is stored again under
  // no parent, its second (still cached, but past the first miss) is recomputed, not re-stored.
  prefill_outcome fourth = cache.prefill(ha, ta);
  EXPECT_EQ(fourth.hit_blocks, 0u);
  ASSERT_EQ(fourth.events.size(), 2u);
  EXPECT_EQ(fourth.events[0].type, kv_event_type::block_removed);
  EXPECT_EQ(fourth.events[0].block_hashes, (std::vector<uint64_t>{hb[0]}));
  EXPECT_EQ(fourth.events[1].block_hashes, (std::vector<uint64_t>{ha[0]}));

  // The wire form: the project's own decoder (tested on vLLM's golden payloads) reads it back.
  kv_batch batch;
  batch.ts = 12.5;
  batch.data_parallel_rank = 0;
  batch.events = third.events;
  kv_event cleared;
  cleared.type = kv_event_type::all_blocks_cleared;
  batch.events.push_back(cleared);
  const kv_batch back = decode_payload(encode_kv_batch(batch));
  EXPECT_DOUBLE_EQ(back.ts, 12.5);
  EXPECT_EQ(back.data_parallel_rank, std::optional<int64_t>(0));
  ASSERT_EQ(back.events.size(), 3u);
  EXPECT_EQ(back.events[0].type, kv_event_type::block_removed);
  EXPECT_EQ(back.events[0].block_hashes, third.events[0].block_hashes);
  EXPECT_EQ(back.events[0].medium, std::optional<std::string>("GPU"));
  EXPECT_EQ(back.events[1].type, kv_event_type::block_stored);
  EXPECT_EQ(back.events[1].block_hashes, third.events[1].block_hashes);
  EXPECT_FALSE(back.events[1].parent_block_hash.has_value());
  EXPECT_EQ(back.events[1].block_size, std::optional<int64_t>(4));
  ASSERT_EQ(back.events[1].token_ids.size(), 12u);
  for (std::size_t t = 0; t < 12; ++t)
    EXPECT_EQ(back.events[1].token_ids[t], tb[t]);
  EXPECT_EQ(back.events[2].type, kv_event_type::all_blocks_cleared);
  // Hashes above INT64_MAX survive as uint64.
  kv_batch big;
  kv_event e;
  e.type = kv_event_type::block_stored;
  e.block_hashes = {std::numeric_limits<uint64_t>::max() - 3};
  e.parent_block_hash = std::numeric_limits<uint64_t>::max();
  e.block_size = 16;
  big.events.push_back(e);
  const kv_batch big_back = decode_payload(encode_kv_batch(big));
  ASSERT_EQ(big_back.events.size(), 1u);
  EXPECT_EQ(big_back.events[0].block_hashes, e.block_hashes);
  EXPECT_EQ(big_back.events[0].parent_block_hash, e.parent_block_hash);
}

TEST(PrefixCache, LaterStoredBlocksNameTheirParent) {
  prefix_cache cache(16, 4);
  const auto ta = tokens_of(3, 8);
  const auto ha = block_hashes(ta, 4);
  cache.prefill(std::span(ha).subspan(0, 1), std::span(ta).subspan(0, 4));
  prefill_outcome o = cache.prefill(ha, ta);
  EXPECT_EQ(o.hit_blocks, 1u);
  ASSERT_EQ(o.events.size(), 1u);
  EXPECT_EQ(o.events[0].block_hashes, (std::vector<uint64_t>{ha[1]}));
  EXPECT_EQ(o.events[0].parent_block_hash, std::optional<uint64_t>(ha[0]));
}

TEST(PrefillClock, FirstComeFirstServedOverWorkers) {
  prefill_clock c(2, 10.0, 1.0);  // 10 ms + 1 ms per token
  EXPECT_DOUBLE_EQ(c.handoff(0.0, 10), 0.020);
  EXPECT_DOUBLE_EQ(c.handoff(0.0, 0), 0.010);
  EXPECT_DOUBLE_EQ(c.handoff(0.001, 0), 0.020);  // waits for the second worker
  EXPECT_DOUBLE_EQ(c.handoff(1.0, 5), 1.015);
  EXPECT_EQ(encode_sequence(0x0102030405060708ULL),
            (std::array<uint8_t, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// A tiny synthetic workload: 3 requests on a small geometry.
workload tiny_workload(uint32_t requests, double rate) {
  synthetic_params p = synthetic_preset("qwen-task").value();
  p.geometry = {4, 16, 2};
  p.prompt_min = 8;
  p.prompt_max = 40;
  p.output_min = 4;
  p.output_max = 9;
  p.requests = requests + 8;
  p.seed = 11;
  workload_options o;
  o.requests = requests;
  o.calibration = 8;
  o.rate_rps = rate;
  o.seed = 5;
  auto m = std::make_shared<const synthetic_model>(synthetic_model::make(p).value());
  return make_workload(make_synthetic_source(m, 0), 0, o).value();
}

// An emulator of `workers` decode workers over `w`, the default batch limit and cost model.
auto make_emulator(const workload& w, uint32_t workers) {
  decode_emulator_config c;
  c.workers = workers;
  return decode_emulator::make(w, c).value();
}

TEST(DecodeEmulator, StepTimesComeFromTheCostModel) {
  const workload w = tiny_workload(3, 10.0);
  decode_emulator_config c;
  c.workers = 1;
  auto d = decode_emulator::make(w, c);
  ASSERT_TRUE(d.ok());
  decode_emulator& e = **d;
  std::vector<decode_finish> done;
  e.arrive(0, 0, 1.0);
  EXPECT_EQ(e.load(0).in_flight(), 1u);  // in transfer counts as waiting
  EXPECT_EQ(e.load(0).running, 0u);
  EXPECT_DOUBLE_EQ(e.next_event_time(), 1.0);
  e.advance_to(1.0, done);
  EXPECT_EQ(e.load(0).running, 1u);
  // One sequence: its token picks top_k distinct experts in each layer.
  const model_geometry& g = w.geometry();
  const decode_cost_model cost = decode_cost_model::make(c.cost).value();
  batch_stats b;
  b.sequences = 1;
  b.distinct_experts = uint64_t{g.layers} * g.top_k;
  b.context_tokens = w.requests[0].prompt_tokens;
  EXPECT_DOUBLE_EQ(e.last_step_ms(0), cost.step_latency_ms(b));
  EXPECT_DOUBLE_EQ(e.next_event_time(), 1.0 + cost.step_latency_ms(b) / 1000.0);
  e.advance_to(e.next_event_time(), done);
  EXPECT_DOUBLE_EQ(e.times(0).first_token, 1.0 + cost.step_latency_ms(b) / 1000.0);
  // The second step's context has grown by the first output token.
  b.context_tokens += 1;
  EXPECT_DOUBLE_EQ(e.last_step_ms(0), cost.step_latency_ms(b));
  e.advance_to(std::numeric_limits<double>::infinity(), done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].request, 0u);
  EXPECT_EQ(e.decode_steps(), w.requests[0].output_tokens);
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(e.load(0).in_flight(), 0u);
}

TEST(DecodeEmulator, AgreesWithTheSimulatorOnThreeRequests) {
  // Close arrivals, so that the requests share batches on both workers.
  const workload w = tiny_workload(3, 200.0);
  ASSERT_EQ(w.requests.size(), 3u);
  sim_config sc;
  sc.prefill_workers = 1;
  sc.decode_workers = 2;
  sc.prefill_base_ms = 2.0;
  sc.prefill_per_token_ms = 0.05;
  sc.kv_transfer_ms = 1.0;
  policy_config pc;
  pc.workers = 2;
  sim_policy sp;
  sp.name = "rr";
  sp.policy = make_policy("rr", pc).value();
  const sim_metrics m = simulate(w, sc, sp).value();

  // The same requests through the loadgen's prefill clock and decode emulator, routed round-robin
  // (worker 0, 1, 0) with no route round trip.
  decode_emulator_config c;
  c.workers = 2;
  c.max_batch = sc.max_batch;
  c.cost = sc.cost;
  auto d = decode_emulator::make(w, c);
  ASSERT_TRUE(d.ok());
  prefill_clock prefill(sc.prefill_workers, sc.prefill_base_ms, sc.prefill_per_token_ms);
  for (uint32_t i = 0; i < 3; ++i) {
    const double handoff = prefill.handoff(w.requests[i].arrival_s, w.requests[i].prompt_tokens);
    (*d)->arrive(i, i % 2, handoff + sc.kv_transfer_ms / 1000.0);
  }
  std::vector<decode_finish> done;
  (*d)->advance_to(std::numeric_limits<double>::infinity(), done);
  EXPECT_EQ(done.size(), 3u);
  const latency_summary s = summarize_latency(w, **d, {0, 1, 2});
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.incomplete, 0u);
  EXPECT_NEAR(s.tpot_p50_ms, m.tpot_p50_ms, 1e-9);
  EXPECT_NEAR(s.tpot_p99_ms, m.tpot_p99_ms, 1e-9);
  EXPECT_NEAR(s.ttft_p50_ms, m.ttft_p50_ms, 1e-9);
  EXPECT_NEAR(s.ttft_p99_ms, m.ttft_p99_ms, 1e-9);
  EXPECT_EQ((*d)->decode_steps(), m.decode_steps);
  EXPECT_NEAR((*d)->distinct_experts_per_layer(), m.distinct_experts_per_layer, 1e-9);
  EXPECT_NEAR((*d)->batch_size_mean(), m.batch_size_mean, 1e-9);
  EXPECT_NEAR((*d)->load_imbalance(), m.load_imbalance, 1e-9);
  // Requests 0 and 2 shared worker 0, so at least one step ran two sequences.
  EXPECT_GT(m.batch_size_mean, 1.0);
}

TEST(DecodeEmulator, LateArrivalsAreTakenAtTheCurrentTime) {
  const workload w = tiny_workload(3, 10.0);
  auto d = make_emulator(w, 2);
  std::vector<decode_finish> done;
  d->advance_to(5.0, done);
  d->arrive(1, 1, 4.0);  // the live loop saw the handoff late
  EXPECT_DOUBLE_EQ(d->next_event_time(), 5.0);
  d->advance_to(5.0, done);
  EXPECT_DOUBLE_EQ(d->times(1).arrival, 5.0);
  EXPECT_EQ(d->load(1).running, 1u);
  EXPECT_EQ(d->load(0).in_flight(), 0u);
}

TEST(DecodeEmulator, InflightImbalanceIsTimeAveragedMaxOverMean) {
  const workload w = tiny_workload(3, 10.0);
  auto d = make_emulator(w, 2);
  std::vector<decode_finish> done;
  EXPECT_DOUBLE_EQ(d->inflight_imbalance(), 1.0);  // nothing in flight yet
  EXPECT_DOUBLE_EQ(d->inflight_mean(), 0.0);
  // Idle until 1 s: counts in neither integral's ratio.
  d->advance_to(1.0, done);
  // Everything on worker 0: max = n, mean = n / 2 at every instant, so the ratio is 2.
  d->arrive(0, 0, 1.0);
  d->arrive(1, 0, 1.0);
  d->advance_to(std::numeric_limits<double>::infinity(), done);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_NEAR(d->inflight_imbalance(), 2.0, 1e-9);
  const double end = std::max(done[0].t, done[1].t);
  // Two requests in flight from 1 s to the first finish, one until the last.
  const double first = std::min(done[0].t, done[1].t);
  const double mean_integral = (first - 1.0) * 2.0 / 2.0 + (end - first) * 1.0 / 2.0;
  EXPECT_NEAR(d->inflight_mean(), mean_integral / end, 1e-9);

  // One request per worker at the same instants: even.
  auto e = make_emulator(w, 2);
  done.clear();
  e->arrive(0, 0, 0.5);
  e->arrive(1, 1, 0.5);
  e->advance_to(0.5, done);
  const double before = e->inflight_imbalance();
  EXPECT_DOUBLE_EQ(before, 1.0);
}

TEST(WeightedRotation, EachWindowHoldsEveryIndexItsWeightTimes) {
  weighted_rotation r({1, 3, 3});
  for (int window = 0; window < 5; ++window) {
    std::vector<int> seen(3, 0);
    for (int k = 0; k < 7; ++k)
      ++seen[r.next()];
    EXPECT_EQ(seen, (std::vector<int>{1, 3, 3}));
  }
}

TEST(WeightedRotation, SpreadsPicksInsteadOfRuns) {
  // 1 of 4 to index 0: never two in a row, and exactly one in each window of 4.
  weighted_rotation r({1, 3});
  std::vector<std::size_t> picks;
  for (int k = 0; k < 40; ++k)
    picks.push_back(r.next());
  for (std::size_t k = 0; k + 4 <= picks.size(); k += 4)
    EXPECT_EQ(std::count(picks.begin() + k, picks.begin() + k + 4, 0u), 1);
  for (std::size_t k = 1; k < picks.size(); ++k)
    EXPECT_FALSE(picks[k] == 0 && picks[k - 1] == 0);
}

TEST(WeightedRotation, EqualWeightsArePlainRoundRobinAndZeroIsNeverPicked) {
  weighted_rotation eq({1, 1, 1});
  for (int k = 0; k < 9; ++k)
    EXPECT_EQ(eq.next(), static_cast<std::size_t>(k % 3));
  weighted_rotation z({0, 2, 1});
  for (int k = 0; k < 30; ++k)
    EXPECT_NE(z.next(), 0u);
}

// --routers-by-prefill: a request given an endpoint goes there (index modulo the endpoints), the
// others follow the rotation; the flag and --router-weights do not go together.
TEST(RouteSocket, ARequestGivenAnEndpointGoesThereAndTheRestRotate) {
  zmq::context_t ctx;
  std::vector<zmq::socket_t> routers;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 3; ++i) {
    routers.emplace_back(ctx, zmq::socket_type::router);
    routers.back().set(zmq::sockopt::rcvtimeo, 2000);
    endpoints.push_back("inproc://route-socket-" + std::to_string(i));
    routers.back().bind(endpoints.back());
  }
  auto rs = route_socket::connect(ctx, endpoints, {}, 2000);
  ASSERT_TRUE(rs.ok()) << rs.error().to_string();
  auto received = [&](size_t i) {
    zmq::message_t id, body;
    if (!routers[i].recv(id) || !routers[i].recv(body)) return std::string("(nothing)");
    return body.to_string();
  };
  const std::vector<uint8_t> a = {'a'}, b = {'b'}, c = {'c'};
  ASSERT_TRUE((*rs)->send(a, 4));  // 4 mod 3: the second endpoint
  EXPECT_EQ(received(1), "a");
  ASSERT_TRUE((*rs)->send(b));  // the rotation starts at the first
  EXPECT_EQ(received(0), "b");
  ASSERT_TRUE((*rs)->send(c, 2));
  EXPECT_EQ(received(2), "c");

  loadgen_options o;
  o.workload.synthetic = "qwen-task";
  ASSERT_TRUE(check_options(o).ok()) << check_options(o).message();
  o.routers = {"tcp://a:1", "tcp://b:1"};
  o.router_weights = {1, 2};
  o.routers_by_prefill = true;
  const status s = check_options(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--routers-by-prefill"), std::string::npos) << s.message();
  o.router_weights.clear();
  EXPECT_TRUE(check_options(o).ok()) << check_options(o).message();
}

}  // namespace
}  // namespace eldr::loadgen
