// router_state: what the router holds, per model (model_state) and for the node (router_state).
// Plain data shared by the router's modules in actors/router/: the plain ones (router_files,
// model_policy, route_decision, router_status, shard_gather) take it without an actor system, so
// unit tests drive them; the actor's own files (router_actor.cpp, router_admin.cpp,
// router_load.cpp, router_peers.cpp) wire it to CAF messages.
#pragma once

#include <caf/all.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/messages.hpp"
#include "actors/node_context.hpp"
#include "actors/router/seen_blocks.hpp"
#include "actors/router/shard_sum_cache.hpp"
#include "actors/router/store_batch.hpp"
#include "cluster/http/http_url.hpp"
#include "cluster/http/metrics_scraper.hpp"
#include "core/base/bounded_lru.hpp"
#include "core/base/wake_timer.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/formats/centroid_history.hpp"
#include "core/load_view.hpp"
#include "core/membership/authority_map.hpp"
#include "core/membership/failover_budget.hpp"
#include "core/membership/handoff_progress.hpp"
#include "core/membership/hash_ring.hpp"
#include "core/membership/leadership.hpp"
#include "core/membership/load_exchange.hpp"
#include "core/membership/router_activity.hpp"
#include "core/refit.hpp"
#include "core/route_fallback.hpp"
#include "core/routing.hpp"

namespace eldr::router {

inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One past decision, for `eldrctl explain`.
struct explained {
  std::string request;
  uint32_t worker = 0;
  uint64_t epoch = 0;
  std::string policy;
  float tau = 0.0f;
  uint32_t covered = 0, total = 0;
  float best_score = 0.0f, worker_score = 0.0f;
  bool widened = false;
  std::string fallback;  // why the decision was by load only ("" when it was not)
  std::vector<uint32_t> candidates;
  std::vector<float> scores;   // s_k of every worker ("eldr", "eldr-adaptive"), else empty
  std::vector<uint32_t> load;  // in-flight per worker at the decision
};

struct model_state {
  uint32_t index = 0;
  const model_config* cfg = nullptr;
  load_view pool;
  std::string policy_name;  // as configured or set by `eldrctl policy`
  float tau = 0.1f;
  bool widen_single = true;  // the band's widening of a one-worker band (core/routing.hpp)
  // "config", or "admin" when `eldrctl policy` set policy_name/tau/widen_single: an admin change
  // is persisted (data_dir/router-policy.json) and wins over the config at the next start.
  std::string policy_source = "config";
  std::unique_ptr<routing_policy> policy;  // what routes now
  bool eldr_active = false;                // policy is the locality band over `set`
  std::optional<centroid_file> file;
  centroid_set_ptr set;
  spec_ptr spec;
  uint64_t epoch = 0;
  std::optional<signature_sample> sample;  // width of spec; reset when the width changes
  // Cluster: which published epochs this router accepts (a refit leader's term fences a stale
  // leader's publishes; docs/cluster.md).
  epoch_fence fence;
  uint64_t fenced = 0;  // announcements refused (stale term or old epoch)
  // The installs that made sets current, for `centroids rollback` (persisted in data_dir), and
  // the cause of the newest install, which an announcement to the peers carries.
  centroid_history history;
  std::string last_cause;
  // The shards' sums this router asked for, by exact block list (cluster only;
  // shard_sum_cache.hpp).
  shard_sum_cache shard_sums;
  // The masked counts of blocks requests brought this router, for later prefix hits on them
  // (cluster only; seen_blocks.hpp).
  seen_blocks seen;
  std::deque<explained> recent;
  route_trace trace;
  // Decisions, their blocks, fallbacks by reason, counts_geometry warnings and swaps are counted
  // once, in the node's metrics (node_metrics.hpp), and status reads them back from there.
  uint64_t failed = 0, resigned = 0, unsigned_routes = 0;
  // Loud fallbacks (core/route_fallback.hpp): one log limiter per reason so that a misconfigured
  // client cannot flood the log.
  std::array<log_limiter, fallback_reason_count> fallback_log;

  // Per worker slot: the metrics URL it registered (scraped every scrape_interval_ms), or none
  // (it pushes load_reports). Grows with the pool; cleared when a worker registers without one.
  std::vector<std::optional<http_url>> metrics_urls;
  std::vector<std::string> metrics_url_text;  // as registered, for the workers listing
  std::vector<std::string> scrape_error;  // the last failed scrape's reason ("" after a good one)
  std::vector<std::optional<vllm_load>> scraped;  // the last good scrape (workers listing)
  // Per worker slot: the running/waiting/KV usage of the newest pushed load_report (informational:
  // the load view counts its in_flight), and that report's seq; for the listing and the page.
  struct reported_load {
    vllm_load load;
    uint64_t seq = 0;
  };
  std::vector<std::optional<reported_load>> reported;

  // cluster.load_sharing = "authority" (core/membership/load_exchange.hpp): this router's decisions
  // per worker; the authorities' vectors over them; the load authority for the workers that talk to
  // this node (made at the first local registration or takeover) and the finished ids it applied;
  // which node is each worker's authority and its claim (core/membership/authority_map.hpp:
  // learned from registrations and vectors, moved to a successor when an authority leaves); the
  // totals not yet applied by their authority (delta_outbox), and the claims' nodes_version they
  // were last all sent for; this node's last published vector and when.
  decision_ledger ledger;
  load_overlay overlay;
  // The routers the vectors show deciding for this model lately: the peer estimate's R.
  router_activity activity{peer_activity_window_ms};
  std::optional<load_authority> authority;
  std::optional<bounded_lru<std::string, bool>> finished_seen;
  authority_map claims;
  delta_outbox outbox;
  uint64_t outbox_claims_version = 0;
  bool outbox_resend_all = false;  // an authority restarted: every total goes out again
  std::vector<load_vector_entry> last_published;
  std::map<std::string, included_delta> last_published_included;
  int64_t published_ms = 0;

  explicit model_state(load_view p) : pool(std::move(p)) {}
};

// A decision remembered for retries: the same request id gets the same worker and epoch.
struct remembered {
  uint32_t worker = 0;
  uint64_t epoch = 0;
};

struct router_state {
  node_context_ptr ctx;
  caf::actor sigcache;
  std::vector<std::unique_ptr<model_state>> models;
  uint64_t unknown_model = 0;
  // Decisions by "<model index>/<request id>", this router's and its peers': a client that
  // retries a route (after a timeout, possibly at another router) gets the first decision again,
  // and the load is counted once.
  std::optional<bounded_lru<std::string, remembered>> decisions;
  uint64_t retried = 0;
  // Requests a client marked as a failover resend (route_request.retry), and of them the ones
  // this router remembered (answered with the first decision); the others were decided afresh.
  uint64_t marked_retries = 0, marked_retries_remembered = 0;
  // A marked retry this router did not remember is asked of the peers (recall_gather.hpp):
  // asks made, answered with a peer's decision, decided afresh because no peer had one, and peers
  // that did not answer within timeouts.recall_ms (their decisions, if any, were missed); the
  // questions this router answered for its peers, and of them the ones it knew. The log line
  // for asks that peers failed to answer is rate-limited.
  uint64_t recalls = 0, recalled = 0, recall_misses = 0, recall_peer_failures = 0;
  uint64_t recalls_answered = 0, recalls_answered_known = 0;
  log_limiter recall_log;
  // Marked requests are asked of the peers only while they stay a small share of the requests
  // (core/membership/failover_budget.hpp, as gRPC throttles retries: each unmarked request adds
  // 0.1 token, each ask takes one, asks go on while more than half of 100 tokens are left), so
  // a client that marks every request cannot make its router ask every peer for each. A refused
  // ask is decided afresh, counted and logged.
  std::optional<failover_budget> recall_budget;
  uint64_t recalls_refused = 0;
  // With peers: the requests this router is deciding now (signing them), by
  // "<model index>/<request id>", each with the peers' recalls waiting for its decision. A resend
  // that reaches a peer before the first router decided (it overtook the decision) is then
  // answered the moment the decision is made, instead of missing it. Entries live from a
  // request's arrival to its decision (at most cluster.max_decisions; past that a request is not
  // entered, and a recall for it is answered from the remembered decisions alone); the recalls
  // that waited are counted.
  using recall_promise = caf::typed_response_promise<std::vector<shared_decision>>;
  std::unordered_map<std::string, std::vector<recall_promise>> deciding;
  uint64_t recalls_answered_waited = 0;
  // Cluster: the other routers, this router's decisions not yet sent to them (by model), and
  // what came from them.
  std::vector<caf::actor> peers;
  std::map<uint32_t, std::vector<shared_decision>> outbox;
  bool flush_armed = false;
  uint64_t peer_decisions = 0, peer_worker_messages = 0, peer_epochs = 0, untrusted = 0;
  // cluster.load_sharing = "authority": on, this incarnation (its decision totals restart from 0
  // when the node restarts), and what went through it.
  bool authority_mode = false;
  uint64_t incarnation = 0;
  // When the load tick runs next: within load_sync_ms of a decision or an authority's input,
  // every vector heartbeat while idle (wake_load_tick).
  std::optional<wake_timer> load_timer;
  uint64_t deltas_sent = 0, deltas_applied = 0, vectors_sent = 0, vectors_applied = 0;
  uint64_t load_messages_refused = 0;  // malformed or for a model/worker this node lacks
  // Authority failover (authority_map.hpp): workers this node took over from a departed
  // authority, workers it saw handed to another survivor, claims it gave up to a better one,
  // and vectors ignored because their authority is not a live member here (late, from a departed
  // node, or sent before this router learned of a new member).
  uint64_t authority_takeovers = 0, authority_handovers = 0, authority_yields = 0;
  uint64_t vectors_from_non_members = 0;
  uint64_t authority_restarts = 0;  // vectors of a new incarnation of an authority
  uint64_t authority_reclaims = 0;  // workers a peer's snapshot named this node the authority of
  // Workers this node claimed because their load reports reached it while another node held
  // their claim (their authority left, or their client failed over to this node).
  uint64_t authority_claims_by_report = 0;
  // Cluster: the signature cache is sharded by block hash over the live signature-cache nodes
  // (this one included when it holds the role), R copies of each block's counts.
  std::optional<hash_ring> ring;
  std::vector<caf::actor> shards;       // by ring member index
  std::optional<uint32_t> local_shard;  // this node's ring member index, when it holds a cache
  // After signature-cache nodes joined (only_joined): the ring before, which shard lookups read
  // until ring_before_until_ms (cluster.handoff_grace_ms) while its owners hand the newcomers
  // their blocks; carried counts are stored at the owners on both rings meanwhile, so the old
  // ring misses nothing. Counted: the joins bridged so, and the lookups sent through the old ring.
  struct previous_ring {
    hash_ring ring;
    std::vector<caf::actor> shards;
    std::optional<uint32_t> local;
  };
  std::optional<previous_ring> ring_before;
  int64_t started_ms = 0;  // when this router started (a node that has just started is the
                           // newcomer when it first meets the ring's other nodes)
  int64_t ring_before_until_ms = 0;
  uint64_t ring_joins_bridged = 0, shard_requests_ring_before = 0;
  // The bridge ends as soon as every node of the ring before said it finished handing its blocks
  // for the current ring (handoff_progress.hpp; cluster.handoff_grace_ms is the upper bound): when
  // it started, and the bridges ended so (confirmed) or by the bound (unconfirmed, logged).
  handoff_progress handoff_wait;
  int64_t ring_before_since_ms = 0;
  uint64_t handoffs_confirmed = 0, handoffs_unconfirmed = 0;
  uint64_t shard_requests = 0, shard_failovers = 0, shard_failures = 0, shard_store_messages = 0;
  uint64_t shard_local_requests = 0;  // of shard_requests, to this node's own shard
  // Which timed-out shard parts may be asked of their blocks' other owners
  // (core/membership/failover_budget.hpp); the parts given up because it was spent, and their
  // log line's limiter.
  std::optional<failover_budget> shard_failover;
  uint64_t shard_failovers_refused = 0;
  log_limiter shard_failover_log;
  // Replica stores for other nodes waiting for the next flush (cluster.store_batch_ms), and the
  // blocks dropped because their owner left the ring before the flush.
  store_batcher store_out;
  bool store_flush_armed = false;
  // With a load tick (authority mode) the batches go out with the first tick at least
  // store_batch_ms after the oldest of them was queued (then: -1 when none waits); without one
  // they have a timer of their own (store_flush_armed).
  int64_t store_waiting_since_ms = -1;
  uint64_t shard_stores_dropped = 0;
  // Carried blocks not stored because the request said its prefill served them from its prefix
  // cache (route_request.cached_blocks): stored when they were computed.
  uint64_t shard_stores_cached = 0;
  std::vector<uint32_t> shard_scratch;  // a shard's reply, unpacked
  // Cluster: the refit leader as last announced ("" until one is), and the live routers by node
  // name. Only the leader numbers epochs (core/membership/leadership.hpp), so imports go through
  // it.
  std::string leader;
  uint64_t leader_term = 0;
  std::map<std::string, caf::actor> routers_by_name;
  uint64_t changes_forwarded = 0;  // imports, swaps, rollbacks sent to the refit leader
  // The decode workers' vLLM /metrics, fetched off the actor's thread; made at the first
  // registration with a metrics_url. Results come back as scraped_atom messages.
  std::unique_ptr<metrics_scraper> scraper;

  model_state* find(const std::string& name) {
    for (auto& m : models)
      if (m->cfg->name == name) return m.get();
    return nullptr;
  }
  // The routers the peer estimate assumes share a model's traffic at now_ms
  // (core/membership/load_exchange.hpp, peer_estimate): this one and those the vectors show
  // deciding for the model within peer_activity_window_ms (core/membership/router_activity.hpp),
  // with load authorities and cluster.peer_estimate on; else 1 (no estimate).
  uint32_t estimate_routers(const model_state& m, int64_t now_ms) const {
    if (!authority_mode || !ctx->config.cluster.peer_estimate) return 1;
    return m.activity.active(ctx->config.name, now_ms);
  }
};

}  // namespace eldr::router
