// sigcache_state: what the signature-cache actor holds, per model (model_cache) and for the node
// (sigcache_state), and the limits of its work per turn. Plain data shared by the actor's modules
// in actors/sigcache/: the plain ones (signing, handoff, sigcache_status, model_caches) take it
// without an actor system, so unit tests can drive them; the actor's own files
// (actors/sigcache/sigcache_actor.cpp, publishers.cpp, sigcache_cluster.cpp) wire it to CAF
// messages.
#pragma once

#include <caf/all.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"
#include "actors/sigcache/handoff_planner.hpp"
#include "actors/sigcache/sigcache_metrics.hpp"
#include "cluster/ingest/ingest.hpp"
#include "cluster/ingest/publisher_registry.hpp"
#include "core/base/wake_timer.hpp"
#include "core/membership/hash_ring.hpp"
#include "core/signature.hpp"
#include "storage/signature_cache.hpp"

namespace eldr::sigcache {

// Hashes applied per turn: a few milliseconds of work (BENCHMARKS.md), so a route request waits
// at most one decode and one slice behind a publisher's largest batch.
constexpr size_t ingest_hashes_per_turn = 2048;
// Grace deadlines examined per commit tick: a backlog of expired blocks is spread over ticks.
constexpr size_t expire_per_commit = 4096;

struct model_cache {
  std::unique_ptr<signature_cache> cache;
  std::unique_ptr<ingest> events;
  std::map<spec_ptr, std::unique_ptr<signature_builder>> builders;  // one per spec in use
  std::vector<uint32_t> scratch;  // masked sum when no spec is given (coverage only), shard sums
  std::vector<uint32_t> reply;    // cluster: a shard's sum over the requested layers
  uint64_t counts_refused = 0;
  bool dirty = false;          // staged changes since the last commit
  bool resume_posted = false;  // an ingest_more_atom for this model is in the mailbox
  int64_t last_expire_ms = 0;  // grace periods are checked once a second, not every tick
  uint64_t signed_requests = 0;
  uint64_t handed_off = 0, taken_over = 0, handoff_refused = 0;  // cluster: blocks moved
  // The store's health as last logged: a degraded store is logged once when it degrades and once
  // when it recovers; read errors at most every read_error_log_ms.
  bool logged_degraded = false;
  uint64_t logged_read_errors = 0;
  int64_t read_errors_logged_ms = 0;
};

// A subscription the frontend delivers frames for.
struct subscription {
  uint32_t model = 0;
  bool counts = false;  // eldr counts publisher, else vLLM KV events
  uint32_t publisher = 0;
  // A bound SUB socket (models[].kv_events.bind) that several vLLM instances connect to: ZeroMQ
  // does not tell them apart, so each must publish under its own topic (KVEventsConfig.topic),
  // and each topic is one ingest publisher with its own sequence. `publisher` serves frames
  // without a topic frame.
  bool by_topic = false;
  std::string endpoint;
  std::map<std::string, uint32_t, std::less<>> topics;
};

// Topics one bound socket tells apart, and the longest one; beyond, frames go to the socket's
// default publisher (and their sequences look like gaps there).
constexpr size_t max_bound_topics = 1024;
constexpr size_t max_topic_bytes = 256;

struct sigcache_state {
  node_context_ptr ctx;
  std::vector<model_cache> models;
  // Cluster: the ring of signature-cache nodes as of the last membership change (this node's
  // blocks are handed to the owners that are new since), and the counters of the moves.
  std::optional<hash_ring> ring;
  // The hand-off under way (sigcache_cluster.cpp): one batch in flight at a time, acknowledged by
  // its receiver before the next is read, so a large cache moves without filling the connection
  // (CAF's heartbeats share it) or holding this actor for more than a slice.
  struct handoff_job {
    uint64_t id = 0;  // answers of a superseded job are ignored
    // Owners on `base` hold every block: the ring of the last hand-off that finished (a job that a
    // new ring change interrupts is started again from its base, so nothing it had not sent yet
    // is lost).
    std::optional<hash_ring> base;
    hash_ring next;
    std::map<std::string, caf::actor> to;
    size_t model = 0;  // the model being handed (its planner below)
    std::optional<handoff_planner> planner;
    int64_t started_ns = 0;
    uint64_t sent = 0, failed = 0;
    std::set<std::string> receivers;
  };
  std::optional<handoff_job> handoff;
  // The routers told when a hand-off finishes: this node's (it asked, handoff_watch_atom) and the
  // other members'.
  caf::actor local_router;
  std::vector<caf::actor> peer_routers;
  uint64_t handoff_ids = 0;
  uint64_t handoffs_finished = 0, handoffs_superseded = 0;
  int64_t handoff_last_ms = -1;  // the last finished hand-off's duration (-1: none yet)
  std::map<uint32_t, subscription> subscriptions;
  std::vector<std::span<const uint8_t>> frames;  // scratch
  uint64_t unknown_subscription = 0;
  uint64_t commit_errors = 0;
  // The commit tick (sigcache_actor.cpp): at most every commit_interval_ms while something is
  // staged, every metrics_refresh_ms otherwise. Replaced at start with the configured interval.
  wake_timer commit_timer{1, 1};
  uint64_t commit_ticks = 0;    // ticks that ran
  uint64_t staged_commits = 0;  // ... and found changes staged
  // Publishers (publisher_registry.hpp): registrations waiting for their SUB socket, and each
  // (model, counts, endpoint)'s ingest index, kept so that a publisher that comes back after
  // being forgotten reuses its index.
  publisher_registry publishers{1, 0};
  std::map<std::string, std::vector<caf::response_promise>> waiting;
  std::map<std::tuple<uint32_t, bool, std::string>, uint32_t> ingest_index;
  int64_t refusal_logged_ms = INT64_MIN;
  // The cache's families in the node's registry (made with ctx), and when the ingest and store
  // series were last copied into them (metrics_refresh_ms).
  std::unique_ptr<sigcache_metrics> metrics;
  int64_t metrics_rendered_ms = INT64_MIN;
};

// The ingest and store series are copied into the registry on the commit tick, but at most this
// often: the work grows with the publishers followed, and rendering their text on every 10 ms tick
// kept an idle node that follows 256 publishers ~15% of a core busy (fuzz.live_node,
// publisher_flood). Prometheus scrapes every few seconds; 250 ms is fresh enough for any reader.
constexpr int64_t metrics_refresh_ms = 250;

}  // namespace eldr::sigcache
