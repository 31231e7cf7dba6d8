// The router's plain modules (actors/router/), driven without an actor system: the state files
// (round trip, bad entries left out, a corrupt file ignored), the policy and install checks (a
// refused install changes nothing), the decision (answered through the node's edge, remembered
// for a retry, queued for the peers, signed again after a spec change, errors counted), the
// status JSON, the shard plan and merge of a clustered signature, the shards' sums kept, and the
// replica stores batched per owner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "actors/router/model_policy.hpp"
#include "actors/router/route_decision.hpp"
#include "actors/router/router_actor_internal.hpp"
#include "actors/router/router_files.hpp"
#include "actors/router/router_status.hpp"
#include "actors/router/seen_blocks.hpp"
#include "actors/router/shard_gather.hpp"
#include "actors/router/shard_sum_cache.hpp"
#include "actors/router/store_batch.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "core/signature.hpp"

namespace eldr::router {
namespace {

// Keeps every answer the router sends.
class captured_sink final : public reply_sink {
 public:
  void reply(const reply_address&, std::vector<uint8_t> payload) override {
    replies.push_back(std::move(payload));
  }
  void subscribe(subscription_request) override {}
  void unsubscribe(uint32_t) override {}
  void request_replay(uint32_t, uint64_t, uint64_t) override {}

  std::vector<std::vector<uint8_t>> replies;

  route_reply last_reply() const {
    auto r = decode_route_reply(replies.back(), route_protocol_limits{});
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : route_reply{};
  }
  error_reply last_error() const {
    auto r = decode_error_reply(replies.back(), route_protocol_limits{});
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : error_reply{};
  }
};

const model_geometry toy_geometry{2, 4, 1};

// A set of k centroids over the toy geometry (count transform, both layers), centroid w peaked
// on expert w of layer 0.
centroid_file toy_set(uint32_t k, const std::string& model = "toy") {
  centroid_file f;
  f.model_name = model;
  f.spec = *signature_spec::make(toy_geometry, signature_transform::count, {}, {});
  f.workers = k;
  f.centroids.assign(size_t{k} * f.spec.width(), 0.0f);
  for (uint32_t w = 0; w < k; ++w)
    f.centroids[size_t{w} * f.spec.width() + w % toy_geometry.experts] = 1.0f;
  return f;
}

// One router with one model "toy" of `k` workers (config policy "eldr"), its data directory a
// fresh temporary one, time injected.
struct router_fixture {
  captured_sink sink;
  std::shared_ptr<node_context> ctx = std::make_shared<node_context>();
  router_state st;
  int64_t now = 1000;
  std::filesystem::path dir;

  explicit router_fixture(uint32_t k = 2) {
    dir = std::filesystem::temp_directory_path() /
          ("eldr-router-modules-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    model_config mc;
    mc.name = "toy";
    mc.workers = k;
    mc.policy = "eldr";
    ctx->config.models.push_back(mc);
    ctx->config.data_dir = dir.string();
    ctx->config.explain_history = 8;
    ctx->edge = &sink;
    ctx->metrics = std::make_shared<node_metrics>();
    ctx->now_ms = [this] { return now; };
    st.ctx = ctx;
    auto decisions = bounded_lru<std::string, remembered>::make(64, 60'000);
    st.decisions.emplace(std::move(*decisions));
    load_view_options lo;
    lo.report_timeout_ms = 0;
    auto pool = load_view::make(k, lo);
    auto m = std::make_unique<model_state>(std::move(*pool));
    m->cfg = &ctx->config.models[0];
    m->policy_name = "eldr";
    m->tau = 0.1f;
    EXPECT_TRUE(rebuild_policy(*m).ok());
    st.models.push_back(std::move(m));
  }
  ~router_fixture() { std::filesystem::remove_all(dir); }

  model_state& model() { return *st.models[0]; }

  void register_all() {
    for (uint32_t w = 0; w < model().pool.k(); ++w)
      ASSERT_TRUE(model().pool.register_worker(w, "tcp://w" + std::to_string(w), 100, now).ok());
  }

  route_job job(const std::string& id) const {
    route_job j;
    j.request.id = id;
    j.request.model = "toy";
    j.request.block_hashes = {11, 12};
    return j;
  }
};

// --- router_files ---

TEST(RouterFiles, AdminPoliciesRoundTripAndTheConfigsAreNotWritten) {
  router_fixture f;
  auto& m = f.model();
  ASSERT_TRUE(persist_policies(f.st).ok());
  EXPECT_TRUE(read_persisted_policies(f.ctx->config).empty());  // "config": nothing persisted
  m.policy_name = "jsq";
  m.tau = 0.25f;
  m.widen_single = false;
  m.policy_source = "admin";
  ASSERT_TRUE(persist_policies(f.st).ok());
  const auto back = read_persisted_policies(f.ctx->config);
  ASSERT_EQ(back.size(), 1u);
  const auto& p = back.at("toy");
  EXPECT_EQ(p.policy, "jsq");
  EXPECT_FLOAT_EQ(p.tau, 0.25f);
  ASSERT_TRUE(p.widen_single.has_value());
  EXPECT_FALSE(*p.widen_single);
}

TEST(RouterFiles, AnEntryWithoutAUsableTauAndACorruptFileAreLeftOut) {
  router_fixture f;
  std::filesystem::create_directories(f.dir);
  {
    std::ofstream out(policy_file_path(f.ctx->config));
    out << R"({"format": "eldr-router-policy", "version": 1, "models": {
      "a": {"policy": "jsq", "tau": -1},
      "b": {"policy": "rr"},
      "c": {"policy": "p2c", "tau": 0.5}}})";
  }
  const auto back = read_persisted_policies(f.ctx->config);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back.at("c").policy, "p2c");
  EXPECT_FALSE(back.at("c").widen_single.has_value());  // a file from before it could be set
  {
    std::ofstream out(policy_file_path(f.ctx->config));
    out << "{ not json";
  }
  EXPECT_TRUE(read_persisted_policies(f.ctx->config).empty());
}

TEST(RouterFiles, RollbackHistoriesRoundTrip) {
  router_fixture f;
  f.model().history.record({3, content_digest(toy_set(2)), "import", 5});
  f.model().history.record({4, content_digest(toy_set(2, "other")), "refit", 6});
  persist_histories(f.st);
  const auto back = read_histories(f.ctx->config);
  ASSERT_EQ(back.count("toy"), 1u);
  ASSERT_EQ(back.at("toy").changes().size(), 2u);
  EXPECT_EQ(back.at("toy").changes()[1].epoch, 4u);
  EXPECT_EQ(back.at("toy").changes()[1].cause, "refit");
  ASSERT_TRUE(back.at("toy").previous().ok());
  EXPECT_EQ(back.at("toy").previous()->epoch, 3u);
}

// --- model_policy ---

TEST(ModelPolicy, TauMustBeFiniteNonNegativeAndAFloat) {
  EXPECT_TRUE(check_tau(0.0).ok());
  EXPECT_TRUE(check_tau(0.3).ok());
  for (double bad : {-0.1, std::nan(""), std::numeric_limits<double>::infinity(), 1e300}) {
    const auto s = check_tau(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("tau must be finite"), std::string::npos) << s.message();
  }
}

TEST(ModelPolicy, DomainAndUnknownPoliciesAreRefusedNamingTheServedOnes) {
  router_fixture f;
  for (const char* name : {"domain", "nope"}) {
    auto b = build_policy(f.model(), name, 0.1f, true, nullptr, 2);
    ASSERT_FALSE(b.ok()) << name;
    EXPECT_NE(b.error().message().find("the node serves: "), std::string::npos);
    EXPECT_NE(b.error().message().find("jsq"), std::string::npos);
    EXPECT_EQ(b.error().message().find(", domain"), std::string::npos);
  }
  // A locality policy without a set routes by load until one is installed.
  auto jsq = build_policy(f.model(), "eldr", 0.1f, true, nullptr, 2);
  ASSERT_TRUE(jsq.ok());
  EXPECT_FALSE(jsq->eldr_active);
  EXPECT_EQ(std::string(jsq->policy->name()), "jsq");
}

TEST(ModelPolicy, AnInstallOfTheWrongKChangesNothing) {
  router_fixture f(2);
  auto& m = f.model();
  const routing_policy* before = m.policy.get();
  const auto s = install(f.st, m, toy_set(3), 7, "import");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("3 centroids"), std::string::npos) << s.message();
  EXPECT_EQ(m.epoch, 0u);
  EXPECT_EQ(m.set, nullptr);
  EXPECT_EQ(m.policy.get(), before);
  EXPECT_FALSE(m.eldr_active);
  EXPECT_TRUE(m.history.changes().empty());
  EXPECT_FALSE(check_installable(m, toy_set(3)).ok());
}

TEST(ModelPolicy, AnInstallMakesTheSetCurrentAndRecordsItsCause) {
  router_fixture f(2);
  auto& m = f.model();
  ASSERT_TRUE(check_installable(m, toy_set(2)).ok());
  ASSERT_TRUE(check_policy_accepts(m, toy_set(2)).ok());
  ASSERT_TRUE(install(f.st, m, toy_set(2), 7, "import").ok());
  EXPECT_EQ(m.epoch, 7u);
  EXPECT_TRUE(m.eldr_active);
  ASSERT_NE(m.set, nullptr);
  EXPECT_EQ(m.set->k(), 2u);
  EXPECT_EQ(m.last_cause, "import");
  ASSERT_EQ(m.history.changes().size(), 1u);
  EXPECT_EQ(m.history.changes()[0].epoch, 7u);
  // Persisted, as the model is among the router's.
  EXPECT_EQ(read_histories(f.ctx->config).at("toy").changes().size(), 1u);
  // The same spec again (a refit) keeps the spec object: requests signed under it stay valid.
  const spec_ptr spec = m.spec;
  ASSERT_TRUE(install(f.st, m, toy_set(2), 8, "refit").ok());
  EXPECT_EQ(m.spec, spec);
}

TEST(ModelPolicy, AnImportForAnotherModelIsRefusedWithTheReason) {
  router_fixture f(2);
  const auto s = check_import_fits(f.model(), toy_set(2, "other"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fitted for model \"other\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--force"), std::string::npos);
  EXPECT_TRUE(check_import_fits(f.model(), toy_set(2)).ok());
}

// --- route_decision ---

TEST(RouteDecision, NoRegisteredWorkerIsAnErrorNamingTheModel) {
  router_fixture f;
  const auto j = f.job("r1");
  EXPECT_EQ(decide(f.st, f.model(), j, nullptr, 0), decided::answered);
  ASSERT_EQ(f.sink.replies.size(), 1u);
  const auto e = f.sink.last_error();
  EXPECT_EQ(e.code, wire_error_code::no_eligible_worker);
  EXPECT_NE(e.message.find("'toy'"), std::string::npos);
  EXPECT_EQ(f.model().failed, 1u);
  EXPECT_EQ(f.st.ctx->metrics->route_totals_of("toy").routes, 0u);
}

TEST(RouteDecision, ARetryGetsTheFirstDecisionAndCountsOnce) {
  router_fixture f;
  f.register_all();
  const auto j = f.job("r1");
  EXPECT_EQ(decide(f.st, f.model(), j, nullptr, 0), decided::answered);
  const auto first = f.sink.last_reply();
  EXPECT_EQ(first.id, "r1");
  EXPECT_EQ(first.endpoint, "tcp://w" + std::to_string(first.worker));
  EXPECT_EQ(first.total_blocks, 2u);
  // No centroid set: by load only, and said so.
  EXPECT_EQ(first.fallback, "no_centroid_set");
  EXPECT_EQ(f.model().pool.load()[first.worker], 1u);
  EXPECT_TRUE(answer_retry(f.st, f.model(), j));
  const auto again = f.sink.last_reply();
  EXPECT_EQ(again.worker, first.worker);
  EXPECT_EQ(again.epoch, first.epoch);
  EXPECT_EQ(f.model().pool.load()[first.worker], 1u);  // counted once
  EXPECT_EQ(f.st.retried, 1u);
  EXPECT_FALSE(answer_retry(f.st, f.model(), f.job("r2")));
  // The decision is kept for `eldrctl explain`.
  ASSERT_EQ(f.model().recent.size(), 1u);
  const auto ex = explain_json(f.model(), f.model().recent.back());
  EXPECT_EQ(ex["request"], "r1");
  EXPECT_EQ(ex["worker"], first.worker);
  EXPECT_EQ(ex["fallback"], "no_centroid_set");
}

// A client's failover resend is marked (route_request.retry): counted, and counted as remembered
// only when this router knew the id; unmarked requests count in neither.
TEST(RouteDecision, MarkedRetriesAreCountedAndWhetherTheyWereRemembered) {
  router_fixture f;
  f.register_all();
  ASSERT_EQ(decide(f.st, f.model(), f.job("r1"), nullptr, 0), decided::answered);
  auto known = f.job("r1");
  known.request.retry = true;
  EXPECT_TRUE(answer_retry(f.st, f.model(), known));
  auto unknown = f.job("r9");
  unknown.request.retry = true;
  EXPECT_FALSE(answer_retry(f.st, f.model(), unknown));
  EXPECT_TRUE(answer_retry(f.st, f.model(), f.job("r1")));  // unmarked
  EXPECT_EQ(f.st.marked_retries, 2u);
  EXPECT_EQ(f.st.marked_retries_remembered, 1u);
  EXPECT_EQ(f.st.retried, 2u);
}

// A marked retry answered with a peer's decision (the recall, core/membership/recall_gather.hpp):
// the same worker and epoch, remembered here for the next resend, and counted in this router's
// load view with shared decisions (their copy of it, arriving later, is skipped) but not in the
// authority mode (the deciding router counts it); a worker this model lacks is refused.
TEST(RouteDecision, ARecalledDecisionIsTheAnswerAndIsRememberedAndCountedOnce) {
  for (const bool authority : {false, true}) {
    SCOPED_TRACE(authority ? "authority" : "decisions");
    router_fixture f;
    f.register_all();
    f.st.authority_mode = authority;
    auto resend = f.job("r1");
    resend.request.retry = true;
    EXPECT_FALSE(answer_retry(f.st, f.model(), resend));
    ASSERT_TRUE(answer_recalled(f.st, f.model(), resend, remembered{1, 5}));
    const auto reply = f.sink.last_reply();
    EXPECT_EQ(reply.id, "r1");
    EXPECT_EQ(reply.worker, 1u);
    EXPECT_EQ(reply.epoch, 5u);
    EXPECT_EQ(f.model().pool.load()[1], authority ? 0u : 1u);
    EXPECT_EQ(f.st.recalled, 1u);
    // The next resend is remembered here, and not counted again.
    EXPECT_TRUE(answer_retry(f.st, f.model(), resend));
    EXPECT_EQ(f.sink.last_reply().worker, 1u);
    EXPECT_EQ(f.model().pool.load()[1], authority ? 0u : 1u);
    // A peer's worker index this model does not have: nothing sent, nothing remembered.
    const size_t replies = f.sink.replies.size();
    auto other = f.job("r2");
    other.request.retry = true;
    EXPECT_FALSE(answer_recalled(f.st, f.model(), other, remembered{f.model().pool.k(), 5}));
    EXPECT_EQ(f.sink.replies.size(), replies);
    EXPECT_FALSE(answer_retry(f.st, f.model(), other));
    EXPECT_EQ(f.st.recalled, 1u);
  }
}

// With load authorities and two live peer routers (cluster.peer_estimate, the default), a decision
// counts three on its worker: its own, in the ledger too, and two for its peers' decisions until
// the next vector; with the estimate off, or one router, or shared decisions, only its own.
// A vector of authority "a" (seq `seq`) that includes the given routers' deltas.
load_vector vector_including(uint64_t seq, std::map<std::string, included_delta> included) {
  load_vector v;
  v.authority = "a";
  v.incarnation = 7;
  v.seq = seq;
  v.included = std::move(included);
  return v;
}

TEST(RouteDecision, WithLoadAuthoritiesADecisionCountsItsPeersEstimate) {
  struct mode {
    bool authority;
    size_t deciding;  // peer routers whose deltas the vectors show advancing
    bool estimate;
    uint32_t counted;
  };
  for (const mode c : {mode{true, 2, true, 3}, mode{true, 2, false, 1}, mode{true, 0, true, 1},
                       mode{false, 2, true, 1}}) {
    SCOPED_TRACE(std::to_string(c.authority) + " " + std::to_string(c.deciding) + " " +
                 std::to_string(c.estimate));
    router_fixture f;
    f.register_all();
    f.st.authority_mode = c.authority;
    f.ctx->config.name = "self";
    f.ctx->config.cluster.peer_estimate = c.estimate;
    // Three peers are members; `deciding` of them route (their deltas advance between the two
    // vectors), the others and this router's own entry stay where they were.
    std::map<std::string, included_delta> first, second;
    for (size_t r = 0; r < 3; ++r) {
      const std::string name = "n" + std::to_string(r);
      f.st.routers_by_name[name] = caf::actor();
      first[name] = {1, 5};
      second[name] = {1, r < c.deciding ? 6u : 5u};
    }
    first["self"] = second["self"] = {1, 3};
    (void)apply_vector(f.st, f.model(), vector_including(1, first));
    (void)apply_vector(f.st, f.model(), vector_including(2, second));
    EXPECT_NE(decide(f.st, f.model(), f.job("a"), nullptr, 0), decided::sign_again);
    const uint32_t w = f.sink.last_reply().worker;
    EXPECT_EQ(f.model().pool.load()[w], c.counted);
    EXPECT_EQ(f.model().pool.counters().estimated, c.counted - 1u);
    EXPECT_EQ(f.model().ledger.total(w), c.authority ? 1u : 0u);
    EXPECT_EQ(f.st.estimate_routers(f.model(), f.now), c.counted);
    // Once no vector has shown them deciding for a window, the peers count no more.
    f.now += peer_activity_window_ms;
    EXPECT_EQ(f.st.estimate_routers(f.model(), f.now), 1u);
  }
}

TEST(RouteDecision, ARestartedAuthoritysFirstVectorShowsNobodyDeciding) {
  router_fixture f;
  f.register_all();
  f.st.authority_mode = true;
  f.ctx->config.name = "self";
  (void)apply_vector(f.st, f.model(), vector_including(5, {{"n0", {1, 9}}}));
  // A new process of the authority (another incarnation) numbers from 1 and has applied only
  // what was sent to it: its seqs do not compare with the old one's.
  load_vector again = vector_including(1, {{"n0", {1, 1}}});
  again.incarnation = 8;
  (void)apply_vector(f.st, f.model(), again);
  EXPECT_EQ(f.st.estimate_routers(f.model(), f.now), 1u);
  // Its next vector compares with its first.
  load_vector next = vector_including(2, {{"n0", {1, 2}}});
  next.incarnation = 8;
  (void)apply_vector(f.st, f.model(), next);
  EXPECT_EQ(f.st.estimate_routers(f.model(), f.now), 2u);
}

TEST(RouteDecision, WithPeersTheFirstDecisionArmsOneFlush) {
  router_fixture f;
  f.register_all();
  f.st.peers.emplace_back();  // one peer router (a null handle: nothing is sent here)
  EXPECT_EQ(decide(f.st, f.model(), f.job("a"), nullptr, 0), decided::arm_flush);
  EXPECT_EQ(decide(f.st, f.model(), f.job("b"), nullptr, 0), decided::answered);
  ASSERT_EQ(f.st.outbox[0].size(), 2u);
  EXPECT_EQ(f.st.outbox[0][0].request, "a");
  EXPECT_EQ(f.st.outbox[0][1].request, "b");
  EXPECT_EQ(f.sink.replies.size(), 2u);
}

TEST(RouteDecision, ASignatureUnderAReplacedSpecIsSignedAgainOnce) {
  router_fixture f;
  f.register_all();
  ASSERT_TRUE(install(f.st, f.model(), toy_set(2), 1, "import").ok());
  sign_result old;
  old.spec = std::make_shared<const signature_spec>(toy_set(2).spec);  // not the model's object
  old.covered = 2;
  EXPECT_EQ(decide(f.st, f.model(), f.job("a"), &old, 0), decided::sign_again);
  EXPECT_TRUE(f.sink.replies.empty());
  EXPECT_EQ(f.model().resigned, 1u);
  // The second attempt is decided as it is (no signature under the model's spec: load only).
  EXPECT_EQ(decide(f.st, f.model(), f.job("a"), &old, 1), decided::answered);
  const auto r = f.sink.last_reply();
  EXPECT_EQ(r.epoch, 1u);
  EXPECT_FALSE(r.fallback.empty());
  EXPECT_EQ(f.model().unsigned_routes, 1u);
}

TEST(RouteDecision, TheSignatureChoosesTheWorkerWhoseCentroidMatches) {
  router_fixture f;
  f.register_all();
  ASSERT_TRUE(install(f.st, f.model(), toy_set(2), 1, "import").ok());
  // Every token of the prompt picks expert 1 at both layers: centroid 1's peak.
  sign_result s;
  s.spec = f.model().spec;
  s.covered = 2;
  signature_builder b(s.spec);
  std::vector<uint32_t> dense(toy_geometry.layers * toy_geometry.experts, 0);
  dense[1] = 16;
  dense[toy_geometry.experts + 1] = 16;
  ASSERT_TRUE(b.add_dense(dense).ok());
  b.finish(s.sig);
  // Worker 1 is busier, but the band holds it alone (without the widening of a one-worker band,
  // which would add worker 0).
  f.model().widen_single = false;
  ASSERT_TRUE(rebuild_policy(f.model()).ok());
  ASSERT_TRUE(f.model().pool.on_route("earlier", 1, f.now).ok());
  EXPECT_EQ(decide(f.st, f.model(), f.job("a"), &s, 0), decided::answered);
  const auto r = f.sink.last_reply();
  EXPECT_EQ(r.worker, 1u);
  EXPECT_EQ(r.fallback, "");
  EXPECT_EQ(r.covered_blocks, 2u);
  EXPECT_EQ(f.st.ctx->metrics->covered_blocks_of("toy"), 2u);
}

// --- router_status ---

TEST(RouterStatus, ModelAndRouterJsonCountWhatHappened) {
  router_fixture f;
  f.register_all();
  (void)decide(f.st, f.model(), f.job("a"), nullptr, 0);
  ASSERT_TRUE(f.model().pool.drain(1).ok());
  const auto mj = model_json(f.st, f.model());
  EXPECT_EQ(mj["name"], "toy");
  EXPECT_EQ(mj["k"], 2);
  EXPECT_EQ(mj["routed"], 1);
  EXPECT_EQ(mj["workers"]["registered"], 2);
  EXPECT_EQ(mj["workers"]["draining"], 1);
  EXPECT_EQ(mj["fallbacks"]["no_centroid_set"], 1);
  EXPECT_EQ(mj["routing_with"], "jsq");
  const auto rows = workers_json(f.st, f.model());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["draining"], true);
  const auto rj = router_json(f.st);
  ASSERT_EQ(rj["models"].size(), 1u);
  EXPECT_EQ(rj["load_sharing"], "decisions");
  EXPECT_EQ(policy_json(f.model())["policy"], "eldr");
}

// --- shard_gather ---

TEST(ShardGather, EveryBlockGoesToOneOfItsOwnersAndNeverToAnExcludedOne) {
  auto ring = hash_ring::make({"a", "b", "c"}, 16);
  ASSERT_TRUE(ring.ok());
  std::vector<uint64_t> blocks;
  for (uint64_t h = 1; h <= 200; ++h)
    blocks.push_back(h * 0x9E3779B97F4A7C15ull);
  const auto plan = plan_parts(*ring, 2, blocks, std::nullopt, {"b"});
  EXPECT_EQ(plan.lost, 0u);
  const uint32_t b = *ring->index_of("b");
  size_t placed = 0;
  for (const auto& [owner, part] : plan.parts) {
    EXPECT_NE(owner, b);
    for (uint64_t h : part) {
      const auto owners = ring->owners(h, 2);
      EXPECT_NE(std::find(owners.begin(), owners.end(), owner), owners.end());
    }
    placed += part.size();
  }
  EXPECT_EQ(placed, blocks.size());
  // With every owner excluded, a block is lost (and counted).
  const auto none = plan_parts(*ring, 2, blocks, std::nullopt, {"a", "b", "c"});
  EXPECT_TRUE(none.parts.empty());
  EXPECT_EQ(none.lost, blocks.size());
}

TEST(ShardGather, CarriedCountsAreStoredAtEveryOwner) {
  auto ring = hash_ring::make({"a", "b", "c"}, 16);
  ASSERT_TRUE(ring.ok());
  route_request req;
  req.counts.emplace();
  req.counts->geometry = toy_geometry;
  for (uint64_t h = 1; h <= 50; ++h)
    req.counts->blocks.push_back(counts_block{h * 0x9E3779B97F4A7C15ull, std::nullopt, {}});
  const auto plan = store_plan(*ring, 2, req);
  size_t stored = 0;
  for (const auto& [owner, blocks] : plan.by_owner)
    for (const auto* blk : blocks) {
      EXPECT_TRUE(ring->owns(ring->members()[owner], blk->hash, 2));
      ++stored;
    }
  EXPECT_EQ(stored, 2 * req.counts->blocks.size());
  EXPECT_EQ(plan.skipped, 0u);
}

// While a joined node is handed its blocks, lookups read the ring before the join: carried counts
// go to their owners on both rings (as the new ring's member indices), each owner once per block.
TEST(ShardGather, DuringAHandoffCarriedCountsGoToTheOwnersOnBothRings) {
  auto before = hash_ring::make({"a", "b"}, 16);
  auto after = hash_ring::make({"a", "b", "c"}, 16);
  ASSERT_TRUE(before.ok() && after.ok());
  route_request req;
  req.counts.emplace();
  req.counts->geometry = toy_geometry;
  for (uint64_t h = 1; h <= 200; ++h)
    req.counts->blocks.push_back(counts_block{h * 0x9E3779B97F4A7C15ull, std::nullopt, {}});
  const auto plan = store_plan(*after, 2, req, &*before);
  std::map<uint64_t, std::set<std::string>> at;
  size_t stored = 0;
  for (const auto& [owner, blocks] : plan.by_owner)
    for (const auto* blk : blocks) {
      EXPECT_TRUE(at[blk->hash].insert(after->members()[owner]).second) << "stored twice";
      ++stored;
    }
  size_t moved = 0;  // blocks c owns on the new ring: three copies, else two
  for (const auto& blk : req.counts->blocks) {
    std::set<std::string> want;
    for (uint32_t o : after->owners(blk.hash, 2))
      want.insert(after->members()[o]);
    for (uint32_t o : before->owners(blk.hash, 2))
      want.insert(before->members()[o]);
    EXPECT_EQ(at[blk.hash], want);
    moved += want.size() == 3;
  }
  EXPECT_GT(moved, 0u);
  EXPECT_EQ(stored, 2 * req.counts->blocks.size() + moved);
  // Without the ring before, the new ring's R = 2 owners only.
  size_t plain = 0;
  for (const auto& [owner, blocks] : store_plan(*after, 2, req).by_owner)
    plain += blocks.size();
  EXPECT_EQ(plain, 2 * req.counts->blocks.size());
}

// The hashes of the blocks a plan stores, once each, in the order first met.
std::vector<uint64_t> stored_hashes(const stores& plan) {
  std::vector<uint64_t> out;
  for (const auto& [owner, blocks] : plan.by_owner)
    for (const auto* blk : blocks)
      if (std::find(out.begin(), out.end(), blk->hash) == out.end()) out.push_back(blk->hash);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ShardGather, BlocksThePrefillServedFromItsCacheAreNotStoredAgain) {
  auto ring = hash_ring::make({"a", "b", "c"}, 16);
  ASSERT_TRUE(ring.ok());
  route_request req;
  req.block_hashes = {11, 12, 13, 14, 15};
  req.counts.emplace();
  req.counts->geometry = toy_geometry;
  for (uint64_t h : req.block_hashes)  // every block's counts, in prompt order (eldr-proxy)
    req.counts->blocks.push_back(counts_block{h, std::nullopt, {}});
  req.cached_blocks = 3;
  auto plan = store_plan(*ring, 2, req);
  EXPECT_EQ(stored_hashes(plan), (std::vector<uint64_t>{14, 15}));
  EXPECT_EQ(plan.skipped, 3u);
  // Out of prompt order, the cached prefix is still recognised by hash.
  std::reverse(req.counts->blocks.begin(), req.counts->blocks.end());
  plan = store_plan(*ring, 2, req);
  EXPECT_EQ(stored_hashes(plan), (std::vector<uint64_t>{14, 15}));
  EXPECT_EQ(plan.skipped, 3u);
  // Counts of the computed blocks only (the usual client) with cached_blocks: all stored.
  req.counts->blocks.clear();
  for (uint64_t h : {14, 15})
    req.counts->blocks.push_back(counts_block{h, std::nullopt, {}});
  plan = store_plan(*ring, 2, req);
  EXPECT_EQ(stored_hashes(plan), (std::vector<uint64_t>{14, 15}));
  EXPECT_EQ(plan.skipped, 0u);
  // Without cached_blocks every carried block is stored.
  req.cached_blocks.reset();
  req.counts->blocks.push_back(counts_block{11, std::nullopt, {}});
  plan = store_plan(*ring, 2, req);
  EXPECT_EQ(stored_hashes(plan), (std::vector<uint64_t>{11, 14, 15}));
}

TEST(ShardGather, CarriedBlocksAreSummedHereAndTheRestAskedInPromptOrder) {
  router_fixture f;
  ASSERT_TRUE(install(f.st, f.model(), toy_set(2), 1, "import").ok());
  auto& m = f.model();
  const std::vector<expert_id> ids = {1, 1};  // one token, expert 1 at both layers
  auto counts = block_counts::from_tokens(toy_geometry, ids, 0, 1);
  ASSERT_TRUE(counts.ok());
  auto j = std::make_shared<route_job>(f.job("a"));
  j->request.block_hashes = {5, 6, 7};
  j->request.counts.emplace();
  j->request.counts->geometry = toy_geometry;
  j->request.counts->blocks.push_back(counts_block{6, std::nullopt, *counts});
  auto g = start_gather(m, j, 0, true);
  EXPECT_EQ(g->asked, (std::vector<uint64_t>{5, 7}));
  EXPECT_EQ(g->covered, 1u);
  // A shard answers for one of the two; the signature is built over what is known, and the
  // shards' answer is not complete enough to keep.
  shard_sign_reply r;
  r.covered = 1;
  std::vector<uint32_t> scratch;
  merge_shard(*g, r, scratch);
  EXPECT_FALSE(gather_complete(*g));
  const sign_result out = finish_gather(*g);
  EXPECT_EQ(out.covered, 2u);
  EXPECT_EQ(out.spec, m.spec);
  EXPECT_FALSE(out.sig.index.empty());
  EXPECT_TRUE(out.problem.empty());
  // Counts not to be used (another geometry) are asked like the rest.
  auto unused = start_gather(m, j, 0, false);
  EXPECT_EQ(unused->asked, (std::vector<uint64_t>{5, 6, 7}));
  EXPECT_EQ(unused->covered, 0u);
  unused->asked_covered = 3;
  EXPECT_TRUE(gather_complete(*unused));
}

// --- shard_sum_cache ---

spec_ptr toy_spec() {
  return std::make_shared<const signature_spec>(toy_set(2).spec);
}

std::vector<uint32_t> sum_of(const spec_ptr& spec, uint32_t seed) {
  std::vector<uint32_t> s(spec->width(), 0);
  for (uint32_t i = 0; i < s.size(); i += 3)
    s[i] = seed + i;
  return s;
}

TEST(ShardSumCache, AKeptSumIsAddedForExactlyTheSameBlockList) {
  shard_sum_cache c(1 << 20);
  const auto spec = toy_spec();
  const std::vector<uint64_t> blocks = {7, 8, 9};
  const auto sum = sum_of(spec, 1);
  std::vector<uint32_t> acc(spec->width(), 1);
  EXPECT_FALSE(c.add_to(spec, blocks, acc));
  c.put(spec, blocks, sum);
  EXPECT_EQ(c.entries(), 1u);
  ASSERT_TRUE(c.add_to(spec, blocks, acc));
  for (size_t i = 0; i < acc.size(); ++i)
    EXPECT_EQ(acc[i], 1 + sum[i]) << i;
  // Another order, a prefix, a longer list: not the same blocks.
  std::vector<uint32_t> other(spec->width(), 0);
  EXPECT_FALSE(c.add_to(spec, std::vector<uint64_t>{9, 8, 7}, other));
  EXPECT_FALSE(c.add_to(spec, std::vector<uint64_t>{7, 8}, other));
  EXPECT_FALSE(c.add_to(spec, std::vector<uint64_t>{7, 8, 9, 10}, other));
  EXPECT_EQ(other, std::vector<uint32_t>(spec->width(), 0));
  EXPECT_EQ(c.hits(), 1u);
  EXPECT_EQ(c.misses(), 4u);
}

TEST(ShardSumCache, ANewSpecEmptiesIt) {
  shard_sum_cache c(1 << 20);
  const auto spec = toy_spec();
  c.put(spec, std::vector<uint64_t>{1}, sum_of(spec, 1));
  const auto next = toy_spec();  // another object: a set with another spec was installed
  std::vector<uint32_t> acc(next->width(), 0);
  EXPECT_FALSE(c.add_to(next, std::vector<uint64_t>{1}, acc));
  EXPECT_EQ(c.entries(), 0u);
  EXPECT_EQ(c.bytes(), 0u);
}

TEST(ShardSumCache, TheLeastRecentlyUsedGoFirstWithinTheBudget) {
  const auto spec = toy_spec();
  shard_sum_cache probe(1 << 20);
  probe.put(spec, std::vector<uint64_t>{1}, sum_of(spec, 1));
  const size_t one = probe.bytes();
  ASSERT_GT(one, 0u);
  shard_sum_cache c(2 * one);  // room for two entries of this size
  std::vector<uint32_t> acc(spec->width(), 0);
  c.put(spec, std::vector<uint64_t>{1}, sum_of(spec, 1));
  c.put(spec, std::vector<uint64_t>{2}, sum_of(spec, 2));
  ASSERT_TRUE(c.add_to(spec, std::vector<uint64_t>{1}, acc));  // 1 is now the most recent
  c.put(spec, std::vector<uint64_t>{3}, sum_of(spec, 3));      // 2 goes
  EXPECT_EQ(c.entries(), 2u);
  EXPECT_LE(c.bytes(), c.budget_bytes());
  EXPECT_TRUE(c.add_to(spec, std::vector<uint64_t>{1}, acc));
  EXPECT_FALSE(c.add_to(spec, std::vector<uint64_t>{2}, acc));
  EXPECT_TRUE(c.add_to(spec, std::vector<uint64_t>{3}, acc));
  // An entry larger than the whole budget is not kept; budget 0 keeps nothing.
  shard_sum_cache tiny(one - 1);
  tiny.put(spec, std::vector<uint64_t>{1}, sum_of(spec, 1));
  EXPECT_EQ(tiny.entries(), 0u);
  shard_sum_cache off(0);
  off.put(spec, std::vector<uint64_t>{1}, sum_of(spec, 1));
  EXPECT_FALSE(off.add_to(spec, std::vector<uint64_t>{1}, acc));
  EXPECT_EQ(off.entries(), 0u);
}

// --- seen_blocks ---

// A spec over 4 layers x 16 experts, top-2, masking layers 1 and 3; and a block of `tokens`
// tokens whose ids are drawn from `seed` (distinct within a token's top-2 row).
const model_geometry seen_geometry{4, 16, 2};

spec_ptr seen_spec() {
  return std::make_shared<const signature_spec>(
      *signature_spec::make(seen_geometry, signature_transform::count, {1, 3}, {}));
}

block_counts seen_block(uint32_t seed, uint32_t tokens = 16) {
  std::vector<expert_id> ids;
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t l = 0; l < seen_geometry.layers; ++l) {
      const auto a = static_cast<expert_id>((seed * 7 + t * 3 + l * 5) % 16);
      ids.push_back(a);
      ids.push_back(static_cast<expert_id>((a + 1 + (seed + t) % 15) % 16));
    }
  return *block_counts::from_tokens(seen_geometry, ids, 0, tokens);
}

TEST(SeenBlocks, AKeptBlockAddsWhatAddMaskedCountsAdds) {
  seen_blocks c(1 << 20);
  const auto spec = seen_spec();
  for (uint32_t seed = 1; seed <= 4; ++seed)
    c.keep(spec, 100 + seed, seen_block(seed));
  EXPECT_EQ(c.entries(), 4u);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::vector<uint32_t> want(spec->width(), 2), got(spec->width(), 2);
    ASSERT_TRUE(add_masked_counts(*spec, seen_block(seed), want).ok());
    ASSERT_TRUE(c.add_to(spec, 100 + seed, got)) << seed;
    EXPECT_EQ(got, want) << seed;
  }
  std::vector<uint32_t> acc(spec->width(), 0);
  EXPECT_FALSE(c.add_to(spec, 99, acc));  // never kept: nothing added
  EXPECT_EQ(acc, std::vector<uint32_t>(spec->width(), 0));
  EXPECT_EQ(c.hits(), 4u);
  EXPECT_EQ(c.misses(), 1u);
  // A block of another geometry is not kept; a sum of another width is not added to.
  c.keep(spec, 7, *block_counts::from_tokens(toy_geometry, std::vector<expert_id>{1, 1}, 0, 1));
  EXPECT_EQ(c.entries(), 4u);
  std::vector<uint32_t> narrow(spec->width() - 1, 0);
  EXPECT_FALSE(c.add_to(spec, 101, narrow));
}

TEST(SeenBlocks, ANewSpecEmptiesItAndTheBudgetBoundsIt) {
  const auto spec = seen_spec();
  seen_blocks probe(1 << 20);
  probe.keep(spec, 1, seen_block(1));
  const size_t one = probe.bytes();
  ASSERT_GT(one, 0u);
  // At most tokens x k entries of 4 bytes per masked layer, and the entry's bookkeeping.
  EXPECT_GT(one, seen_blocks::entry_overhead);
  EXPECT_LE(one, seen_blocks::entry_overhead + size_t{16} * 2 * 2 * 4);
  // Room for two blocks of this size: the least recently used goes first.
  seen_blocks c(2 * one);
  c.keep(spec, 1, seen_block(1));
  c.keep(spec, 2, seen_block(1));  // same counts, another block
  std::vector<uint32_t> acc(spec->width(), 0);
  ASSERT_TRUE(c.add_to(spec, 1, acc));  // 1 is now the most recent
  c.keep(spec, 3, seen_block(1));       // 2 goes
  EXPECT_EQ(c.entries(), 2u);
  EXPECT_LE(c.bytes(), c.budget_bytes());
  EXPECT_TRUE(c.add_to(spec, 1, acc));
  EXPECT_FALSE(c.add_to(spec, 2, acc));
  EXPECT_TRUE(c.add_to(spec, 3, acc));
  // Another spec object (a set with another mask was installed): nothing kept under the old one
  // is added.
  const auto next = seen_spec();
  EXPECT_FALSE(c.add_to(next, 1, acc));
  EXPECT_EQ(c.entries(), 0u);
  // Budget 0 keeps nothing.
  seen_blocks off(0);
  off.keep(spec, 1, seen_block(1));
  EXPECT_EQ(off.entries(), 0u);
  EXPECT_FALSE(off.add_to(spec, 1, acc));
}

TEST(ShardGather, BlocksTheRouterWasSentBeforeAreSummedHereAndNotAsked) {
  router_fixture f;
  ASSERT_TRUE(install(f.st, f.model(), toy_set(2), 1, "import").ok());
  auto& m = f.model();
  seen_blocks seen(1 << 20);
  auto counts_of = [](expert_id e) {
    return *block_counts::from_tokens(toy_geometry, std::vector<expert_id>{e, e}, 0, 1);
  };
  // A first request carries blocks 5 and 6: the router keeps them.
  auto first = std::make_shared<route_job>(f.job("a"));
  first->request.block_hashes = {5, 6};
  first->request.counts.emplace();
  first->request.counts->geometry = toy_geometry;
  first->request.counts->blocks.push_back(counts_block{5, std::nullopt, counts_of(1)});
  first->request.counts->blocks.push_back(counts_block{6, 5, counts_of(2)});
  // From a client that sends every block's counts and says so (cached_blocks), nothing is kept:
  // its later hits carry their counts too.
  first->request.cached_blocks = 0;
  keep_carried(*start_gather(m, first, 0, true), seen);
  EXPECT_EQ(seen.entries(), 0u);
  first->request.cached_blocks.reset();
  keep_carried(*start_gather(m, first, 0, true), seen);
  EXPECT_EQ(seen.entries(), 2u);
  // A second one hits 5 and 6 in its prefill's cache and carries only block 8: 5 and 6 are
  // summed from what was kept, 7 (never sent here) is left to the shards.
  auto second = std::make_shared<route_job>(f.job("b"));
  second->request.block_hashes = {5, 6, 7, 8};
  second->request.counts.emplace();
  second->request.counts->geometry = toy_geometry;
  second->request.counts->blocks.push_back(counts_block{8, 7, counts_of(3)});
  auto g = start_gather(m, second, 0, true);
  EXPECT_EQ(g->asked, (std::vector<uint64_t>{5, 6, 7}));
  EXPECT_EQ(sum_seen(*g, seen), 2u);
  EXPECT_EQ(g->asked, (std::vector<uint64_t>{7}));
  EXPECT_EQ(g->covered, 3u);
  std::vector<uint32_t> want(m.spec->width(), 0);
  for (expert_id e : {1, 2, 3})
    ASSERT_TRUE(add_masked_counts(*m.spec, counts_of(e), want).ok());
  EXPECT_EQ(g->acc, want);
  EXPECT_EQ(seen.hits(), 2u);
  EXPECT_EQ(seen.misses(), 1u);
}

// --- store_batch ---

TEST(StoreBatch, StoresWaitPerOwnerAndModelAndGeometryUntilTaken) {
  std::vector<counts_block> blocks;
  for (uint64_t h = 1; h <= 5; ++h)
    blocks.push_back(counts_block{h, std::nullopt, {}});
  const std::vector<const counts_block*> first = {&blocks[0], &blocks[1]};
  const std::vector<const counts_block*> second = {&blocks[2]};
  const std::vector<const counts_block*> third = {&blocks[3], &blocks[4]};
  const model_geometry other{3, 4, 1};
  store_batcher b(10);
  EXPECT_FALSE(b.add("n2", "toy", toy_geometry, first));
  EXPECT_FALSE(b.add("n2", "toy", toy_geometry, second));  // joins the batch above
  EXPECT_FALSE(b.add("n2", "toy", other, second));         // another geometry: its own message
  EXPECT_FALSE(b.add("n3", "toy", toy_geometry, third));
  EXPECT_EQ(b.pending_blocks(), 6u);
  EXPECT_TRUE(b.holds_any("n2", std::vector<uint64_t>{9, 3}));
  EXPECT_FALSE(b.holds_any("n2", std::vector<uint64_t>{4, 5}));  // n3's
  EXPECT_TRUE(b.holds_any("n3", std::vector<uint64_t>{4}));
  auto n2 = b.take("n2");
  ASSERT_EQ(n2.size(), 2u);
  EXPECT_EQ(n2[0].owner, "n2");
  EXPECT_EQ(n2[0].counts.geometry, toy_geometry);
  ASSERT_EQ(n2[0].counts.blocks.size(), 3u);
  EXPECT_EQ(n2[0].counts.blocks[2].hash, 3u);  // in the order they came
  EXPECT_EQ(n2[1].counts.geometry, other);
  EXPECT_TRUE(b.take("n2").empty());
  EXPECT_FALSE(b.holds_any("n2", std::vector<uint64_t>{3}));
  EXPECT_EQ(b.pending_blocks(), 2u);
  auto rest = b.take_all();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].owner, "n3");
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.pending_blocks(), 0u);
}

TEST(StoreBatch, AFullOwnerIsToBeSentAtOnce) {
  std::vector<counts_block> blocks(3);
  const std::vector<const counts_block*> two = {&blocks[0], &blocks[1]};
  store_batcher b(3);
  EXPECT_FALSE(b.add("n2", "toy", toy_geometry, two));
  EXPECT_FALSE(b.add("n3", "toy", toy_geometry, two));  // counted per owner
  EXPECT_TRUE(b.add("n2", "toy", toy_geometry, two));
}

}  // namespace
}  // namespace eldr::router
