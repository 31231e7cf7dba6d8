// sigcache_actor: see sigcache_actor.hpp.
#include "actors/sigcache_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "actors/cluster_protocol.hpp"
#include "cluster/counts_message.hpp"
#include "cluster/ingest.hpp"
#include "cluster/publisher_registry.hpp"
#include "core/hash_ring.hpp"
#include "core/metrics.hpp"
#include "core/shard_plan.hpp"

namespace eldr {
namespace {

// The actor to itself: the next slice of a model's ingest backlog (cluster/ingest.hpp). Route
// requests queued meanwhile are answered between two slices.
using ingest_more_atom = caf::atom_constant<caf::atom("ingmore")>;

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
  std::map<uint32_t, subscription> subscriptions;
  std::vector<std::span<const uint8_t>> frames;  // scratch
  uint64_t unknown_subscription = 0;
  uint64_t commit_errors = 0;
  // Publishers (publisher_registry.hpp): registrations waiting for their SUB socket, and each
  // (model, counts, endpoint)'s ingest index, kept so that a publisher that comes back after
  // being forgotten reuses its index.
  publisher_registry publishers{1, 0};
  std::map<std::string, std::vector<caf::response_promise>> waiting;
  std::map<std::tuple<uint32_t, bool, std::string>, uint32_t> ingest_index;
  uint64_t registrations_refused = 0, subscribe_failed = 0, publishers_forgotten = 0;
  int64_t refusal_logged_ms = INT64_MIN;
  // When the ingest and store metrics sections were last rendered (metrics_refresh_ms).
  int64_t metrics_rendered_ms = INT64_MIN;
};

// The ingest and store sections of /metrics are rendered on the commit tick, but at most this
// often: their text grows with the publishers followed, and rendering it on every 10 ms tick kept
// an idle node that follows 256 publishers ~15% of a core busy (fuzz.live_node, publisher_flood).
// Prometheus scrapes every few seconds; 250 ms is fresh enough for any reader.
constexpr int64_t metrics_refresh_ms = 250;

using sigcache_actor_t = caf::stateful_actor<sigcache_state>;

// --- Publishers: subscriptions, replay, persistence, forgetting ----------------------------

// The model's registered publishers, in its database's metadata (durable at the next commit).
constexpr const char* publishers_metadata_key = "publishers";

// A registration's answer: 0 and "" = subscribed, else a route_error_code and why.
using follow_answer = std::pair<uint8_t, std::string>;

void persist_publishers(sigcache_state& st, uint32_t model) {
  auto& mc = st.models[model];
  mc.cache->stage_metadata(publishers_metadata_key, st.publishers.encode_model(model));
  mc.dirty = true;
}

void answer_waiters(sigcache_state& st, const std::string& endpoint, uint8_t code,
                    const std::string& message) {
  auto it = st.waiting.find(endpoint);
  if (it == st.waiting.end()) return;
  for (auto& rp : it->second)
    rp.deliver(code, message);
  st.waiting.erase(it);
}

// Asks the frontend for the publisher's sockets. It reports back on its own thread, as messages
// to this actor (subscribed_atom, replay_atom): the actor never waits for ZeroMQ.
void request_subscription(sigcache_actor_t* self, const publisher_registration& r) {
  auto me = caf::actor_cast<caf::actor>(self);
  subscription_request req;
  req.endpoint = r.endpoint;
  req.replay_endpoint = r.replay_endpoint;
  req.done = [me, endpoint = r.endpoint](result<uint32_t> id) {
    if (id.ok())
      return caf::anon_send(me, subscribed_atom::value, endpoint, *id, uint8_t{0}, std::string());
    const auto code = id.error().code() == status_code::invalid_argument
                          ? route_error_code::malformed
                          : route_error_code::internal;
    caf::anon_send(me, subscribed_atom::value, endpoint, uint32_t{0}, static_cast<uint8_t>(code),
                   id.error().message());
  };
  req.on_replay = [me](replay_message m) {
    caf::anon_send(me, replay_atom::value,
                   replay_message_ptr(std::make_shared<const replay_message>(std::move(m))));
  };
  self->state.ctx->edge->subscribe(std::move(req));
}

// Refused registrations and subscriptions are logged at most once per 10 s (a client may send
// them in a loop); the counters carry the rest.
void log_refusal(sigcache_state& st, const std::string& endpoint, const std::string& why) {
  const int64_t now = st.ctx->now_ms();
  if (st.refusal_logged_ms != INT64_MIN && now - st.refusal_logged_ms < 10'000) return;
  st.refusal_logged_ms = now;
  spdlog::warn("publisher {} not followed ({} refused, {} refused by ZeroMQ so far): {}", endpoint,
               st.registrations_refused, st.subscribe_failed, why);
}

// Takes a publisher in; the answer now, or nullopt when it comes with the socket (then `rp`, if
// any, waits for it).
std::optional<follow_answer> follow(sigcache_actor_t* self, const publisher_registration& r,
                                    bool configured, const caf::response_promise* rp) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const auto a = st.publishers.admit(r, configured, now);
  switch (a.outcome) {
    case admit_outcome::full:
    case admit_outcome::conflict:
      ++st.registrations_refused;
      log_refusal(st, r.endpoint, a.message);
      return follow_answer{
          static_cast<uint8_t>(a.outcome == admit_outcome::full ? route_error_code::overloaded
                                                                : route_error_code::malformed),
          a.message};
    case admit_outcome::existing:
      if (st.publishers.find(r.endpoint)->active) return follow_answer{0, ""};
      break;  // answered with the first registration, when its socket exists
    case admit_outcome::added:
    case admit_outcome::updated:
      request_subscription(self, st.publishers.find(r.endpoint)->reg);
      break;
  }
  if (rp) st.waiting[r.endpoint].push_back(*rp);
  return std::nullopt;
}

// The SUB socket exists: the publisher's frames and replays reach its ingest from now on.
void attach_ingest(sigcache_state& st, const publisher_entry& e) {
  const auto& r = e.reg;
  auto& ev = *st.models[r.model].events;
  const auto key = std::make_tuple(r.model, r.counts, r.endpoint);
  auto it = st.ingest_index.find(key);
  const uint32_t p = it != st.ingest_index.end() ? it->second
                     : r.counts                  ? ev.add_counts_publisher(r.endpoint)
                                                 : ev.add_kv_publisher(r.endpoint);
  st.ingest_index[key] = p;
  if (!r.counts) {
    replay_request_fn request;
    if (!r.replay_endpoint.empty())
      request = [edge = st.ctx->edge, id = e.subscription](uint64_t token, uint64_t start) {
        edge->request_replay(id, token, start);
        return true;
      };
    ev.set_replay_requester(p, std::move(request));
  }
  subscription sub;
  sub.model = r.model;
  sub.counts = r.counts;
  sub.publisher = p;
  sub.by_topic =
      !r.counts && std::string_view(r.endpoint).substr(0, kv_bind_prefix.size()) == kv_bind_prefix;
  sub.endpoint = r.endpoint;
  if (auto old = st.subscriptions.find(e.subscription); old != st.subscriptions.end())
    sub.topics = std::move(old->second.topics);
  st.subscriptions[e.subscription] = std::move(sub);
}

// How much the publisher has sent so far (applied or dropped): it grows with every message.
uint64_t publisher_activity(const sigcache_state& st, const publisher_entry& e) {
  auto it = st.subscriptions.find(e.subscription);
  if (it == st.subscriptions.end()) return 0;
  const auto& ev = *st.models[it->second.model].events;
  const auto& all = it->second.counts ? ev.counts_metrics() : ev.kv_metrics();
  const auto& m = all.at(it->second.publisher);
  uint64_t n = m.messages;
  for (uint64_t d : m.dropped)
    n += d;
  return n;
}

// A registered publisher that went silent: its subscription closes, its blocks go, its
// registration is removed from the store.
void forget_publisher(sigcache_state& st, const std::string& endpoint) {
  const publisher_entry e = *st.publishers.find(endpoint);
  auto& mc = st.models[e.reg.model];
  if (auto it = st.subscriptions.find(e.subscription); it != st.subscriptions.end()) {
    if (!e.reg.counts) {
      mc.events->drop_replay(it->second.publisher);
      mc.cache->clear_worker(mc.cache->worker_id(endpoint), true);
    }
    st.subscriptions.erase(it);
  }
  st.ctx->edge->unsubscribe(e.subscription);
  st.publishers.remove(endpoint);
  persist_publishers(st, e.reg.model);
  ++st.publishers_forgotten;
  spdlog::warn("model {}: publisher {} sent nothing for {} ms: forgotten, its blocks released",
               st.ctx->config.models[e.reg.model].name, endpoint,
               st.ctx->config.publisher_forget_ms);
}

std::string publishers_metrics_text(const sigcache_state& st) {
  uint64_t replayed = 0, unfilled = 0;
  for (const auto& mc : st.models)
    for (const auto& m : mc.events->kv_metrics()) {
      replayed += m.replayed;
      unfilled += m.gaps_unfilled;
    }
  auto line = [](const char* name, const char* type, const char* help, uint64_t v) {
    return std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
  };
  std::string out;
  out += line("eldr_publishers", "gauge",
              "Publishers the signature cache follows (configured and registered).",
              st.publishers.size());
  out += line("eldr_publishers_max", "gauge", "signature_cache.max_publishers.",
              st.publishers.max_publishers());
  out += line("eldr_publisher_registrations_refused_total", "counter",
              "Publisher registrations refused: at max_publishers or a conflicting endpoint.",
              st.registrations_refused);
  out += line("eldr_publisher_subscribe_failed_total", "counter",
              "Publisher subscriptions ZeroMQ refused.", st.subscribe_failed);
  out += line("eldr_publishers_forgotten_total", "counter",
              "Registered publishers dropped after publisher_forget_ms of silence.",
              st.publishers_forgotten);
  out += line("eldr_ingest_replayed_total", "counter",
              "KV-event batches applied from a publisher's replay.", replayed);
  out += line("eldr_ingest_gaps_unfilled_total", "counter",
              "Sequence gaps that resynchronised a worker (replay failed, short or absent).",
              unfilled);
  if (const auto* f = st.ctx->frontend) {
    out += line("eldr_publisher_replays_total", "counter", "Replays asked of publishers.",
                f->counters().replays.load());
    out += line("eldr_publisher_replays_failed_total", "counter",
                "Replays that ended without the publisher's end marker (timeout, bad reply).",
                f->counters().replays_failed.load());
  }
  return out;
}

int64_t publishers_tick_ms(const node_config& c) {
  if (c.publisher_forget_ms <= 0) return 1000;
  return std::clamp<int64_t>(c.publisher_forget_ms / 4, 10, 1000);
}

sign_result_ptr sign(model_cache& mc, const sign_job& job) {
  auto out = std::make_shared<sign_result>();
  out->spec = job.spec;
  const auto& req = job.job->request;
  auto& cache = *mc.cache;
  if (req.counts && !req.counts->blocks.empty()) {
    mc.dirty = true;
    for (const auto& b : req.counts->blocks) {
      if (auto s = cache.put_counts(b.hash, b.parent, req.counts->geometry, b.counts); !s.ok()) {
        ++mc.counts_refused;
        out->problem = s.message();
      }
    }
  }
  ++mc.signed_requests;
  if (req.block_hashes.empty() || cache.geometry().layers == 0) return out;
  if (job.spec && job.spec->geometry() == cache.geometry()) {
    auto& b = mc.builders[job.spec];
    if (!b) b = std::make_unique<signature_builder>(job.spec);
    b->reset();
    auto info = cache.add_prefix(req.block_hashes, *b);
    if (info.ok()) {
      out->covered = info->with_counts;
      if (info->with_counts > 0) b->finish(out->sig);
      // Bad stored data is said, not taken for a cache miss (the store counts and logs it).
      if (info->read_errors > 0)
        out->problem = "signature store: " + std::to_string(info->read_errors) +
                       " blocks' counts could not be read";
    } else {
      out->problem = info.error().message();
    }
    return out;
  }
  const size_t width = cache.layer_mask().empty()
                           ? cache.geometry().width()
                           : cache.layer_mask().size() * cache.geometry().experts;
  mc.scratch.assign(width, 0);
  auto info = cache.sum_prefix(req.block_hashes, mc.scratch);
  if (info.ok()) out->covered = info->with_counts;
  return out;
}

// Stores the counts a shard request carries; returns why some were refused ("" when none).
std::string store_counts(model_cache& mc, const std::vector<uint8_t>& bytes) {
  if (bytes.empty()) return "";
  counts_decode_limits limits;
  limits.max_blocks = 1u << 16;  // a peer router's message: our own encoder, bounded by its limits
  std::vector<kv_decode_issue> issues;
  auto msg = decode_counts_message(bytes, limits, issues);
  if (!msg.ok()) {
    ++mc.counts_refused;
    return msg.error().message();
  }
  std::string problem;
  mc.dirty = true;
  for (const auto& b : msg->blocks)
    if (auto s = mc.cache->put_counts(b.hash, b.parent, msg->geometry, b.counts); !s.ok()) {
      ++mc.counts_refused;
      problem = s.message();
    }
  return problem;
}

// A shard's part of a signature (cluster_protocol.hpp): `blocks` are the blocks of one prompt
// this shard was asked for, in prompt order; the sum covers the requested layers the store keeps.
// Which of its blocks a shard is asked for depends on the router asking (core/shard_plan.hpp):
// the cache's remembered prefix sums serve only the exact list they summed.
shard_sign_reply sum_shard_part(model_cache& mc, std::span<const uint64_t> blocks,
                                const std::vector<uint32_t>& layers, std::string problem) {
  shard_sign_reply out;
  out.problem = std::move(problem);
  ++mc.signed_requests;
  auto& cache = *mc.cache;
  const auto& g = cache.geometry();
  if (blocks.empty() || g.layers == 0) return out;
  const auto& kept = cache.layer_mask();  // known (all layers when unmasked) with the geometry
  mc.scratch.assign(kept.size() * g.experts, 0);
  auto info = cache.sum_prefix(blocks, mc.scratch);
  if (!info.ok()) {
    out.problem = info.error().message();
    return out;
  }
  out.covered = info->with_counts;
  if (out.covered == 0 || layers.empty()) return out;
  out.experts = g.experts;
  out.layer_mask = common_layers(kept, layers);
  if (out.layer_mask == kept) {
    out.value_bytes = pack_sums(mc.scratch, out.sums);
  } else {
    mc.reply.assign(out.layer_mask.size() * g.experts, 0);
    (void)add_common_layers(kept, mc.scratch, out.layer_mask, g.experts, mc.reply);
    out.value_bytes = pack_sums(mc.reply, out.sums);
  }
  return out;
}

// A remote router's request: counts arrive encoded.
shard_sign_reply shard_sign(model_cache& mc, const shard_sign_request& req) {
  auto problem = store_counts(mc, req.counts);
  return sum_shard_part(mc, req.blocks, req.layers, std::move(problem));
}

// Stores the counts of this node's router's request (by pointer); returns why some were refused
// ("" when none).
std::string store_local_counts(model_cache& mc, const shard_job& job) {
  std::string problem;
  if (job.counts.empty()) return problem;
  mc.dirty = true;
  const auto& g = job.job->request.counts->geometry;
  for (const auto* b : job.counts)
    if (auto s = mc.cache->put_counts(b->hash, b->parent, g, b->counts); !s.ok()) {
      ++mc.counts_refused;
      problem = s.message();
    }
  return problem;
}

// This node's router: counts are the request's own, by pointer.
shard_sign_reply shard_sign(model_cache& mc, const shard_job& job) {
  auto problem = store_local_counts(mc, job);
  return sum_shard_part(mc, job.blocks, job.layers, std::move(problem));
}

// Stores all-layer counts given densely (layer-major, L * E entries) as block_counts.
status put_dense_counts(signature_cache& cache, block_hash hash, std::optional<block_hash> parent,
                        const model_geometry& g, const std::vector<uint32_t>& dense) {
  if (g.layers == 0 || g.top_k == 0 || dense.size() != size_t{g.layers} * g.experts)
    return status::invalid_argument("handoff: counts do not cover every layer of the geometry");
  uint32_t first_layer = 0;
  for (uint32_t e = 0; e < g.experts; ++e)
    first_layer += dense[e];
  const uint32_t tokens = first_layer / g.top_k;
  std::vector<uint32_t> offsets{0};
  std::vector<expert_id> ids;
  std::vector<uint8_t> counts;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t e = 0; e < g.experts; ++e)
      if (const uint32_t c = dense[size_t{l} * g.experts + e]; c > 0) {
        if (c > 255) return status::invalid_argument("handoff: a count above 255");
        ids.push_back(static_cast<expert_id>(e));
        counts.push_back(static_cast<uint8_t>(c));
      }
    offsets.push_back(static_cast<uint32_t>(ids.size()));
  }
  auto bc =
      block_counts::from_parts(g, tokens, std::move(offsets), std::move(ids), std::move(counts));
  if (!bc.ok()) return bc.error();
  return cache.put_counts(hash, parent, g, *bc);
}

constexpr size_t handoff_batch = 512;  // blocks per message: bounded messages, bounded memory

// After a ring change, every block this node holds counts for is sent to the owners it has now
// and did not have before (a node that joined or came back takes its share from the nodes that
// hold it, without a full reload); then the new ring is kept.
void hand_off(sigcache_actor_t* self, hash_ring next, const std::map<std::string, caf::actor>& to) {
  auto& st = self->state;
  const size_t r = st.ctx->config.cluster.replication;
  const std::string& me = st.ctx->config.name;
  for (size_t m = 0; m < st.models.size(); ++m) {
    auto& cache = *st.models[m].cache;
    std::map<std::string, std::vector<handoff_block>> out;
    std::vector<std::pair<block_hash, std::optional<block_hash>>> held;
    cache.for_each_block([&](const block_info& b) {
      if (b.has_counts) held.emplace_back(b.hash, b.parent);
    });
    const auto& model = st.ctx->config.models[m].name;
    auto flush = [&](const std::string& name, std::vector<handoff_block>& batch) {
      if (batch.empty()) return;
      st.models[m].handed_off += batch.size();
      const auto& g = cache.geometry();
      self->send(to.at(name), handoff_atom::value, model, g.layers, g.experts, g.top_k,
                 std::move(batch));
      batch.clear();
    };
    for (const auto& [hash, parent] : held) {
      std::vector<uint32_t> before;
      if (st.ring) before = st.ring->owners(hash, r);
      for (uint32_t o : next.owners(hash, r)) {
        const std::string& name = next.members()[o];
        if (name == me || !to.count(name)) continue;
        if (st.ring) {
          auto old = st.ring->index_of(name);
          if (old && std::find(before.begin(), before.end(), *old) != before.end()) continue;
        }
        auto counts = cache.masked_counts(hash);
        if (!counts.ok()) continue;
        auto& batch = out[name];
        batch.push_back(
            handoff_block{hash, parent.has_value(), parent.value_or(0), std::move(*counts)});
        if (batch.size() >= handoff_batch) flush(name, batch);
      }
    }
    for (auto& [name, batch] : out)
      flush(name, batch);
  }
  st.ring.emplace(std::move(next));
}

constexpr int64_t read_error_log_ms = 10'000;

// The store section of status (cache_stats): the store's health (signature_cache::health()).
nlohmann::json store_json(const store_health& h) {
  return {{"degraded", h.degraded},
          {"reason", h.reason},
          {"degraded_since_ms", h.degraded_since_ms},
          {"recovered_at_ms", h.recovered_at_ms},
          {"write_errors", h.write_errors},
          {"recoveries", h.recoveries},
          {"unpersisted_commits", h.unpersisted_commits},
          {"pending_changes", h.pending_changes},
          {"read_errors", h.read_errors},
          {"last_read_error", h.last_read_error},
          {"recovery_events", h.recovery_events},
          {"recovery_notes", h.recovery_notes},
          {"log_write_errors", h.log_write_errors}};
}

std::string store_metrics_text(const sigcache_state& st) {
  struct family {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*value)(const store_health&);
  };
  static const family families[] = {
      {"eldr_store_degraded", "gauge",
       "1 while the signature store cannot write (changes held in memory).",
       [](const store_health& h) -> uint64_t { return h.degraded ? 1 : 0; }},
      {"eldr_store_write_errors_total", "counter", "Failed signature store writes.",
       [](const store_health& h) { return h.write_errors; }},
      {"eldr_store_recoveries_total", "counter", "Signature store recoveries from degraded.",
       [](const store_health& h) { return h.recoveries; }},
      {"eldr_store_unpersisted_commits_total", "counter",
       "Commits whose changes could not be written when made.",
       [](const store_health& h) { return h.unpersisted_commits; }},
      {"eldr_store_pending_changes", "gauge", "Changes in memory not yet written to the store.",
       [](const store_health& h) { return h.pending_changes; }},
      {"eldr_store_read_errors_total", "counter",
       "Stored counts that could not be read (corrupt, I/O error, missing).",
       [](const store_health& h) { return h.read_errors; }},
      {"eldr_store_recovery_events_total", "counter",
       "Data RocksDB reported dropping while recovering the WAL at open.",
       [](const store_health& h) { return h.recovery_events; }},
  };
  std::vector<store_health> healths;
  for (const auto& mc : st.models)
    healths.push_back(mc.cache->health());
  std::string out;
  for (const auto& f : families) {
    out +=
        std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
    for (size_t m = 0; m < st.models.size(); ++m)
      out += std::string(f.name) + "{model=\"" + st.ctx->config.models[m].name + "\"} " +
             std::to_string(f.value(healths[m])) + "\n";
  }
  return out;
}

// Logs what changed in a store's health since the last call: degraded and recovered once each,
// read errors rate-limited.
void log_store_health(model_cache& mc, const std::string& model, int64_t now_ms) {
  const store_health h = mc.cache->health();
  if (h.degraded && !mc.logged_degraded)
    spdlog::error(
        "model {}: the signature store is degraded: {}. Routing goes on from memory; changes are "
        "held and written when the store can write again (retried every second), lost if the "
        "node stops first",
        model, h.reason);
  else if (!h.degraded && mc.logged_degraded)
    spdlog::warn("model {}: the signature store writes again (recovered; {} write errors so far)",
                 model, h.write_errors);
  mc.logged_degraded = h.degraded;
  if (h.read_errors > mc.logged_read_errors &&
      now_ms - mc.read_errors_logged_ms >= read_error_log_ms) {
    spdlog::error("model {}: {} signature store read errors ({} in all); the last: {}", model,
                  h.read_errors - mc.logged_read_errors, h.read_errors, h.last_read_error);
    mc.logged_read_errors = h.read_errors;
    mc.read_errors_logged_ms = now_ms;
  }
}

std::string ingest_metrics_text(const sigcache_state& st) {
  std::string out;
  out += "# HELP eldr_ingest_messages_total Publisher messages applied to the signature cache.\n";
  out += "# TYPE eldr_ingest_messages_total counter\n";
  std::string gaps =
      "# HELP eldr_ingest_gaps_total Sequence gaps seen per publisher.\n"
      "# TYPE eldr_ingest_gaps_total counter\n";
  std::string drops =
      "# HELP eldr_ingest_dropped_total Publisher messages dropped, per cause.\n"
      "# TYPE eldr_ingest_dropped_total counter\n";
  std::string blocks =
      "# HELP eldr_sigcache_blocks Blocks held by the signature cache.\n"
      "# TYPE eldr_sigcache_blocks gauge\n";
  for (size_t m = 0; m < st.models.size(); ++m) {
    const auto& mc = st.models[m];
    const std::string model_label = prometheus_label_value(st.ctx->config.models[m].name);
    auto emit = [&](const std::vector<publisher_metrics>& pubs, const char* kind) {
      for (const auto& p : pubs) {
        // Publisher names are endpoints clients chose: escaped like every label value.
        const std::string publisher = prometheus_label_value(p.name);
        const std::string labels =
            "{model=\"" + model_label + "\",publisher=\"" + publisher + "\",kind=\"" + kind + "\"}";
        out += "eldr_ingest_messages_total" + labels + " " + std::to_string(p.messages) + "\n";
        gaps += "eldr_ingest_gaps_total" + labels + " " + std::to_string(p.gaps) + "\n";
        for (size_t c = 0; c < drop_cause_count; ++c) {
          if (p.dropped[c] == 0) continue;
          drops += "eldr_ingest_dropped_total{model=\"" + model_label + "\",publisher=\"" +
                   publisher + "\",cause=\"" + to_string(static_cast<drop_cause>(c)) + "\"} " +
                   std::to_string(p.dropped[c]) + "\n";
        }
      }
    };
    emit(mc.events->kv_metrics(), "kv");
    emit(mc.events->counts_metrics(), "counts");
    blocks += "eldr_sigcache_blocks{model=\"" + model_label + "\"} " +
              std::to_string(mc.cache->stats().blocks) + "\n";
  }
  return out + gaps + drops + blocks;
}

using cache_list = std::shared_ptr<std::vector<std::unique_ptr<signature_cache>>>;

caf::behavior sigcache_behavior(sigcache_actor_t* self, node_context_ptr ctx, cache_list caches) {
  self->state.ctx = ctx;
  for (auto& c : *caches) {
    model_cache mc;
    ingest_limits work;
    work.hashes_per_turn = ingest_hashes_per_turn;
    work.expire_per_commit = expire_per_commit;
    mc.events = std::make_unique<ingest>(*c, kv_decode_limits{}, clock_fn{}, work);
    mc.cache = std::move(c);
    // What the WAL's recovery dropped at open is said once, at start-up.
    const auto h = mc.cache->health();
    const auto& model = ctx->config.models[self->state.models.size()].name;
    for (const auto& note : h.recovery_notes)
      spdlog::error("model {}: the signature store lost data while recovering its WAL: {}", model,
                    note);
    self->state.models.push_back(std::move(mc));
  }
  // A stopping node commits what is staged: counts acknowledged to nobody yet would otherwise be
  // lost at every clean restart.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    spdlog::debug("signature cache: exit ({})", self->system().render(msg.reason));
    for (auto& mc : self->state.models)
      if (auto s = mc.events->commit(); !s.ok() || !(s = mc.cache->flush()).ok())
        spdlog::error("signature cache commit at exit failed: {} ({} changes not persisted)",
                      s.to_string(), mc.cache->health().pending_changes);
    self->quit(msg.reason);
  });
  self->set_exception_handler([](caf::scheduled_actor*, std::exception_ptr& e) -> caf::error {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      spdlog::error("signature cache: {}", x.what());
    } catch (...) {
      spdlog::error("signature cache: unknown exception");
    }
    return caf::exit_reason::unhandled_exception;
  });
  const auto interval = std::chrono::milliseconds(ctx->config.commit_interval_ms);
  self->delayed_send(self, interval, commit_atom::value);
  // Publishers registered before the last stop come back first (the configured ones follow as
  // messages from the node); those beyond a since lowered max_publishers are dropped, logged.
  self->state.publishers =
      publisher_registry(ctx->config.max_publishers, ctx->config.publisher_forget_ms);
  for (uint32_t m = 0; m < self->state.models.size(); ++m) {
    const auto stored = self->state.models[m].cache->metadata(publishers_metadata_key);
    if (!stored) continue;
    auto regs = publisher_registry::decode(*stored, m);
    if (!regs.ok()) {
      spdlog::error("model {}: registered publishers not restored: {}", ctx->config.models[m].name,
                    regs.error().message());
      continue;
    }
    for (const auto& r : *regs) {
      if (auto refused = follow(self, r, false, nullptr)) {
        spdlog::warn("model {}: registered publisher {} not restored: {}",
                     ctx->config.models[m].name, r.endpoint, refused->second);
        persist_publishers(self->state, m);
      }
    }
    if (!regs->empty())
      spdlog::info("model {}: following {} registered publisher(s) again",
                   ctx->config.models[m].name, regs->size());
  }
  self->delayed_send(self, std::chrono::milliseconds(publishers_tick_ms(ctx->config)),
                     publishers_tick_atom::value);
  auto find_model = [self](const std::string& name) -> model_cache* {
    const auto& models = self->state.ctx->config.models;
    for (size_t m = 0; m < models.size(); ++m)
      if (models[m].name == name) return &self->state.models[m];
    return nullptr;
  };
  return {
      [=](sign_atom, sign_job_ptr job) -> sign_result_ptr {
        return sign(self->state.models.at(job->model), *job);
      },
      // This node's router: its shard's part of a request, by pointer (messages.hpp).
      [=](sign_atom, shard_job_ptr job) -> caf::result<shard_sign_reply> {
        if (job->model >= self->state.models.size()) return caf::sec::invalid_argument;
        return shard_sign(self->state.models[job->model], *job);
      },
      [=](shard_sign_atom, const shard_sign_request& req) -> caf::result<shard_sign_reply> {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return caf::sec::invalid_argument;
        auto* mc = find_model(req.model);
        if (!mc) return caf::sec::invalid_argument;
        return shard_sign(*mc, req);
      },
      [=](members_atom, const std::vector<member_info>& members, uint32_t) {
        auto& st = self->state;
        if (!trusted_sender(self, st.ctx->trust.get())) return;
        std::vector<std::string> names{st.ctx->config.name};
        std::map<std::string, caf::actor> to;
        for (const auto& mi : members)
          if (mi.sigcache && !to.count(mi.name) && mi.name != st.ctx->config.name) {
            names.push_back(mi.name);
            to[mi.name] = mi.sigcache;
          }
        auto next = hash_ring::make(std::move(names), st.ctx->config.cluster.vnodes);
        if (next.ok()) hand_off(self, std::move(*next), to);
      },
      // Blocks this node now owns, from a node that held them.
      [=](handoff_atom, const std::string& model, uint32_t layers, uint32_t experts, uint32_t top_k,
          const std::vector<handoff_block>& blocks) {
        auto& st = self->state;
        if (!trusted_sender(self, st.ctx->trust.get())) return;
        auto* mc = find_model(model);
        if (!mc) return;
        const model_geometry g{layers, experts, top_k};
        for (const auto& b : blocks) {
          auto have = mc->cache->block(b.hash);
          if (have.ok() && have->has_counts) continue;  // already here: never stored twice
          const std::optional<block_hash> parent =
              b.has_parent ? std::optional<block_hash>(b.parent) : std::nullopt;
          // A store that has never seen counts has no geometry yet: its first block goes in as
          // ordinary counts (possible when the sender keeps every layer), which fixes it.
          auto s = mc->cache->geometry().layers == 0
                       ? put_dense_counts(*mc->cache, b.hash, parent, g, b.masked)
                       : mc->cache->put_masked_counts(b.hash, parent, b.masked);
          if (s.ok()) {
            ++mc->taken_over;
            mc->dirty = true;
          } else {
            ++mc->handoff_refused;
          }
        }
      },
      [=](shard_store_atom, const std::string& model, const std::vector<uint8_t>& counts) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return;
        if (auto* mc = find_model(model)) (void)store_counts(*mc, counts);
      },
      // This node's router: the counts of a request for the blocks this shard owns, by pointer.
      [=](shard_store_atom, shard_job_ptr job) {
        if (!local_sender(self) || job->model >= self->state.models.size()) return;
        (void)store_local_counts(self->state.models[job->model], *job);
      },
      // A publisher of the config file (node.cpp): followed, never forgotten nor persisted.
      [=](subscribe_atom, uint32_t model, const std::string& endpoint, bool counts) {
        if (model >= self->state.models.size()) return;
        if (auto refused =
                follow(self, publisher_registration{model, endpoint, "", counts}, true, nullptr))
          spdlog::error("model {}: publisher {} not followed: {}",
                        self->state.ctx->config.models[model].name, endpoint, refused->second);
      },
      // A publisher registered over the worker protocol (the load monitor): answered (code,
      // message; 0 = subscribed) once its SUB socket exists or was refused.
      [=](subscribe_atom, uint32_t model, const std::string& endpoint,
          const std::string& replay_endpoint, bool counts) -> caf::result<uint8_t, std::string> {
        if (model >= self->state.models.size())
          return caf::result<uint8_t, std::string>(
              static_cast<uint8_t>(route_error_code::unknown_model), std::string("no such model"));
        auto rp = self->make_response_promise();
        if (auto now = follow(
                self, publisher_registration{model, endpoint, replay_endpoint, counts}, false, &rp))
          rp.deliver(now->first, now->second);
        return rp;
      },
      [=](subscribed_atom, const std::string& endpoint, uint32_t id, uint8_t code,
          const std::string& message) {
        auto& st = self->state;
        const publisher_entry* e = st.publishers.find(endpoint);
        if (code != 0) {
          ++st.subscribe_failed;
          log_refusal(st, endpoint, message);
          if (e && !e->active) {
            // A restored registration ZeroMQ now refuses is not tried again at the next start.
            const bool persisted = e->registered && !e->configured;
            const uint32_t model = e->reg.model;
            st.publishers.remove(endpoint);
            if (persisted) persist_publishers(st, model);
          }
          answer_waiters(st, endpoint, code, message);
          return;
        }
        if (!e) return;  // gone meanwhile
        if (!e->active)  // once per socket: a client may register the same endpoint in a loop
          spdlog::info(
              "model {}: following {} publisher {}{}", st.ctx->config.models[e->reg.model].name,
              e->reg.counts ? "counts" : "KV-event", endpoint,
              e->reg.replay_endpoint.empty() ? "" : " (replay " + e->reg.replay_endpoint + ")");
        st.publishers.activate(endpoint, id);
        attach_ingest(st, *e);
        if (e->registered && !e->configured) persist_publishers(st, e->reg.model);
        answer_waiters(st, endpoint, 0, "");
      },
      [=](replay_atom, replay_message_ptr m) {
        auto& st = self->state;
        auto it = st.subscriptions.find(m->subscription);
        if (it == st.subscriptions.end() || it->second.counts) return;
        auto& mc = st.models[it->second.model];
        mc.dirty = true;
        if (m->end)
          mc.events->on_replay_end(it->second.publisher, m->token, m->ok);
        else
          mc.events->on_replay_batch(it->second.publisher, m->token, m->seq, m->payload);
        // Replayed batches and the messages the replay held are applied in slices too.
        if (mc.events->pending() && !mc.resume_posted) {
          mc.resume_posted = true;
          self->send(self, ingest_more_atom::value, it->second.model);
        }
      },
      [=](publishers_tick_atom) {
        auto& st = self->state;
        const int64_t now = st.ctx->now_ms();
        for (const auto& [endpoint, e] : st.publishers.entries())
          if (e.active && e.registered)
            st.publishers.note_activity(endpoint, publisher_activity(st, e), now);
        for (const auto& endpoint : st.publishers.silent(now))
          forget_publisher(st, endpoint);
        st.ctx->metrics->set_section("publishers", publishers_metrics_text(st));
        self->delayed_send(self, std::chrono::milliseconds(publishers_tick_ms(st.ctx->config)),
                           publishers_tick_atom::value);
      },
      [=](publisher_atom, publisher_frames_ptr f) {
        auto& st = self->state;
        auto it = st.subscriptions.find(f->subscription);
        if (it == st.subscriptions.end()) {
          ++st.unknown_subscription;
          return;
        }
        st.frames.clear();
        for (const auto& fr : f->frames)
          st.frames.emplace_back(fr.data(), fr.size());
        const uint32_t model = it->second.model;
        auto& mc = st.models[model];
        mc.dirty = true;
        auto& ev = *mc.events;
        uint32_t publisher = it->second.publisher;
        if (it->second.by_topic && !st.frames.empty() && st.frames[0].size() <= max_topic_bytes) {
          const std::string_view topic(reinterpret_cast<const char*>(st.frames[0].data()),
                                       st.frames[0].size());
          auto& topics = it->second.topics;
          if (auto t = topics.find(topic); t != topics.end()) {
            publisher = t->second;
          } else if (topics.size() < max_bound_topics) {
            publisher = ev.add_kv_publisher(it->second.endpoint + "#" + std::string(topic));
            topics.emplace(std::string(topic), publisher);
          }
        }
        if (it->second.counts)
          ev.on_counts_message(publisher, st.frames);
        else
          ev.on_kv_message(publisher, st.frames);
        // The rest of a large batch goes behind whatever is queued now (route requests).
        if (ev.pending() && !mc.resume_posted) {
          mc.resume_posted = true;
          self->send(self, ingest_more_atom::value, model);
        }
      },
      [=](ingest_more_atom, uint32_t model) {
        auto& mc = self->state.models.at(model);
        mc.resume_posted = false;
        mc.dirty = true;
        mc.events->resume();
        if (mc.events->pending()) {
          mc.resume_posted = true;
          self->send(self, ingest_more_atom::value, model);
        }
      },
      [=](commit_atom) {
        auto& st = self->state;
        const int64_t now = st.ctx->now_ms();
        for (size_t m = 0; m < st.models.size(); ++m) {
          auto& mc = st.models[m];
          // Idle stores write nothing; grace periods still expire once a second.
          if (!mc.dirty && !mc.events->expiry_pending() && now - mc.last_expire_ms < 1000) continue;
          mc.dirty = false;
          mc.last_expire_ms = now;
          const auto t0 = std::chrono::steady_clock::now();
          auto committed = mc.events->commit();
          const auto took = std::chrono::steady_clock::now() - t0;
          st.ctx->metrics->cache_committed(st.ctx->config.models[m].name,
                                           std::chrono::duration<double>(took).count());
          // Staging runs on the route path; a long one shows up in route latency.
          if (took > std::chrono::milliseconds(50))
            spdlog::warn("model {}: staging a commit took {} us", st.ctx->config.models[m].name,
                         std::chrono::duration_cast<std::chrono::microseconds>(took).count());
          // A degraded store fails every commit until it recovers: logged once, by its health.
          if (auto s = committed; !s.ok()) {
            ++st.commit_errors;
            if (!mc.cache->health().degraded)
              spdlog::error("model {}: signature cache commit failed: {}",
                            st.ctx->config.models[m].name, s.to_string());
          }
        }
        for (size_t m = 0; m < st.models.size(); ++m) {
          log_store_health(st.models[m], st.ctx->config.models[m].name, now);
          // /readyz: a degraded store keeps the node ready (it routes on from memory) but is
          // listed with its reason, so probes and operators see it.
          if (st.ctx->readiness) {
            const auto h = st.models[m].cache->health();
            st.ctx->readiness->set_store(st.ctx->config.models[m].name, !h.degraded, h.degraded,
                                         h.degraded ? h.reason : std::string());
          }
        }
        if (st.metrics_rendered_ms == INT64_MIN ||
            now - st.metrics_rendered_ms >= metrics_refresh_ms) {
          st.metrics_rendered_ms = now;
          st.ctx->metrics->set_section("ingest", ingest_metrics_text(st));
          st.ctx->metrics->set_section("store", store_metrics_text(st));
        }
        self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.commit_interval_ms),
                           commit_atom::value);
      },
      // A new epoch: newest stored + 1, so epochs only grow whatever the file says.
      [=](store_set_atom, uint32_t model, stored_set_ptr s) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (model >= st.models.size()) return caf::sec::invalid_argument;
        auto& cache = *st.models[model].cache;
        uint64_t epoch = std::max<uint64_t>(1, s->at_least);
        for (uint64_t e : cache.centroid_epochs())
          epoch = std::max(epoch, e + 1);
        if (s->epoch != 0) epoch = s->epoch;
        centroid_file f = s->file;
        f.epoch = epoch;
        if (auto w = cache.put_centroid_set(epoch, encode_centroid_file(f)); !w.ok())
          return caf::make_error(caf::sec::runtime_error, w.to_string());
        return epoch;
      },
      // A stored epoch (made the current one on request).
      [=](load_set_atom, uint32_t model, uint64_t epoch,
          bool make_current) -> caf::result<stored_set_ptr> {
        auto& st = self->state;
        if (model >= st.models.size()) return caf::sec::invalid_argument;
        auto& cache = *st.models[model].cache;
        auto bytes = cache.centroid_set(epoch);
        if (!bytes.ok())
          return caf::make_error(caf::sec::runtime_error,
                                 "epoch " + std::to_string(epoch) + " is not stored");
        auto f = parse_centroid_file(*bytes, "stored epoch " + std::to_string(epoch));
        if (!f.ok()) return caf::make_error(caf::sec::runtime_error, f.error().to_string());
        if (make_current)
          if (auto r = cache.rollback_to(epoch); !r.ok())
            return caf::make_error(caf::sec::runtime_error, r.to_string());
        return stored_set_ptr(std::make_shared<const stored_set>(stored_set{epoch, std::move(*f)}));
      },
      [=](history_atom, uint32_t model) -> std::vector<uint64_t> {
        auto& st = self->state;
        if (model >= st.models.size()) return {};
        return st.models[model].cache->centroid_epochs();
      },
      // The operator page's ingest per publisher, per model: the first max_page_publishers
      // publishers (the page's size stays bounded however many follow), and how many in all.
      [=](page_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        constexpr size_t max_page_publishers = 64;
        auto& st = self->state;
        nlohmann::json out = nlohmann::json::object();
        for (size_t m = 0; m < st.models.size(); ++m) {
          const auto& mc = st.models[m];
          nlohmann::json rows = nlohmann::json::array();
          size_t total = 0;
          for (const auto* list : {&mc.events->kv_metrics(), &mc.events->counts_metrics()}) {
            for (const publisher_metrics& p : *list) {
              if (total++ >= max_page_publishers) continue;
              uint64_t dropped = 0;
              for (uint64_t d : p.dropped)
                dropped += d;
              rows.push_back({{"publisher", p.name},
                              {"kind", list == &mc.events->kv_metrics() ? "kv" : "counts"},
                              {"messages", p.messages},
                              {"block_events", p.block_events},
                              {"gaps", p.gaps},
                              {"gaps_unfilled", p.gaps_unfilled},
                              {"replayed", p.replayed},
                              {"restarts", p.restarts},
                              {"dropped", dropped}});
            }
          }
          out[st.ctx->config.models[m].name] = {{"publishers", std::move(rows)},
                                                {"publishers_total", total}};
        }
        return out.dump();
      },
      [=](cache_stats_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        auto& st = self->state;
        nlohmann::json out = nlohmann::json::array();
        for (size_t m = 0; m < st.models.size(); ++m) {
          const auto& mc = st.models[m];
          const auto s = mc.cache->stats();
          out.push_back(
              {{"model", st.ctx->config.models[m].name},
               {"blocks", s.blocks},
               {"blocks_with_counts", s.blocks_with_counts},
               {"holders", s.holders},
               {"commits", s.commits},
               {"counts_refused", mc.counts_refused},
               {"handoff_sent_blocks", mc.handed_off},
               {"handoff_received_blocks", mc.taken_over},
               {"handoff_refused_blocks", mc.handoff_refused},
               {"signed_requests", mc.signed_requests},
               {"publishers", mc.events->kv_metrics().size() + mc.events->counts_metrics().size()},
               {"store", store_json(mc.cache->health())},
               {"ingest", nlohmann::json::parse(mc.events->metrics_json(), nullptr, false)}});
        }
        return out.dump();
      },
      [=](admin_atom, admin_job_ptr job) {
        auto& st = self->state;
        // centroids.export {model, epoch?}
        const auto& args = job->request.args;
        const auto model_arg = string_arg(args, "model");
        const auto epoch_arg = uint_arg(args, "epoch");
        for (const status* bad : {&model_arg.error(), &epoch_arg.error()})
          if (!bad->ok())
            return answer_admin_error(*st.ctx, *job, route_error_code::malformed, bad->message());
        const std::string model = model_arg->value_or("");
        uint32_t index = 0;
        while (index < st.ctx->config.models.size() && st.ctx->config.models[index].name != model)
          ++index;
        if (index == st.ctx->config.models.size())
          return answer_admin_error(*st.ctx, *job, route_error_code::unknown_model,
                                    "no model named '" + model + "'");
        auto& cache = *st.models[index].cache;
        uint64_t epoch = 0;
        if (*epoch_arg) {
          epoch = **epoch_arg;
        } else {
          auto cur = cache.current_epoch();
          if (!cur.ok())
            return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                      "model '" + model + "' has no centroid set");
          epoch = *cur;
        }
        auto bytes = cache.centroid_set(epoch);
        if (!bytes.ok())
          return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                    "epoch " + std::to_string(epoch) + " is not stored");
        answer_admin(*st.ctx, *job, nlohmann::json::binary(std::move(*bytes)));
      },
  };
}

}  // namespace

// A model's directory name: its name with every byte outside [A-Za-z0-9_-] written %XX, so that
// names like "Qwen/Qwen3-30B-A3B" or ".." stay one directory under data_dir/models.
std::string model_dir_name(const std::string& name) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

result<std::vector<std::unique_ptr<signature_cache>>> open_model_caches(const node_config& config) {
  std::vector<std::unique_ptr<signature_cache>> out;
  for (const auto& m : config.models) {
    const auto dir = std::filesystem::path(config.data_dir) / "models" / model_dir_name(m.name);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return status::io_error("cannot create " + dir.string() + ": " + ec.message());
    signature_cache_options o;
    o.memory_cache_bytes = config.cache_memory_bytes;
    o.max_blocks = config.cache_max_blocks;
    o.max_blocks_per_publisher =
        std::max<size_t>(1, static_cast<size_t>(static_cast<double>(config.cache_max_blocks) *
                                                config.cache_publisher_share));
    o.uncounted_block_grace_ms = config.cache_uncounted_block_grace_ms;
    o.sync_wal = config.sync_wal;
    o.background_writes = true;  // a RocksDB write never delays a route request's signature
    auto c = signature_cache::open(dir.string(), o);
    if (!c.ok()) return status(c.error().code(), "model " + m.name + ": " + c.error().message());
    out.push_back(std::move(*c));
  }
  return out;
}

result<std::optional<centroid_file>> stored_current_set(signature_cache& cache,
                                                        const std::string& model) {
  auto epoch = cache.current_epoch();
  if (!epoch.ok()) return std::optional<centroid_file>();
  auto bytes = cache.centroid_set(*epoch);
  if (!bytes.ok()) return bytes.error();
  auto f = parse_centroid_file(*bytes, model + " epoch " + std::to_string(*epoch));
  if (!f.ok()) return f.error();
  f->epoch = *epoch;
  return std::optional<centroid_file>(std::move(*f));
}

caf::actor spawn_sigcache(caf::actor_system& sys, node_context_ptr ctx,
                          std::vector<std::unique_ptr<signature_cache>> caches, bool detached) {
  // CAF copies spawn arguments: the move-only caches travel in a shared holder.
  auto holder = std::make_shared<std::vector<std::unique_ptr<signature_cache>>>(std::move(caches));
  if (!detached) return sys.spawn(sigcache_behavior, std::move(ctx), holder);
  return sys.spawn<caf::detached>(sigcache_behavior, std::move(ctx), holder);
}

}  // namespace eldr
