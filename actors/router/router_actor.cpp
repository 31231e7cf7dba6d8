// router_actor: see router_actor.hpp. This file wires the router's messages to its modules
// (actors/router/): route requests through signing (the node's signature cache, or the cluster's
// shards) to the decision, and every other message to the file that handles it.
#include "actors/router/router_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/caf_status.hpp"
#include "actors/router/model_policy.hpp"
#include "actors/router/route_decision.hpp"
#include "actors/router/router_actor_internal.hpp"
#include "actors/router/router_files.hpp"
#include "actors/router/router_status.hpp"
#include "actors/router/shard_gather.hpp"
#include "cluster/wire/counts_message.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/resident_buffer.hpp"
#include "core/membership/incarnation.hpp"

namespace eldr::router {

namespace {

// Sends batched stores to their owners' shards; a batch whose owner left the ring is dropped (and
// its blocks counted).
void send_batches(router_actor_t* self, std::vector<store_batcher::batch> batches) {
  auto& st = self->state;
  for (auto& b : batches) {
    const auto index = st.ring ? st.ring->index_of(b.owner) : std::nullopt;
    if (!index) {
      st.shard_stores_dropped += b.counts.blocks.size();
      continue;
    }
    ++st.shard_store_messages;
    self->send(st.shards[*index], shard_store_atom::value, b.model,
               encode_counts_message(b.counts));
  }
}

}  // namespace

void flush_stores(router_actor_t* self) {
  if (!self->state.store_out.empty()) send_batches(self, self->state.store_out.take_all());
}

bool flush_due_stores(router_actor_t* self, int64_t now_ms) {
  auto& st = self->state;
  if (st.store_out.empty()) {
    st.store_waiting_since_ms = -1;
    return false;
  }
  if (st.store_waiting_since_ms < 0) st.store_waiting_since_ms = now_ms;
  // A clock that went back (an injected one) flushes rather than holds the batches.
  const int64_t waited = now_ms - st.store_waiting_since_ms;
  if (waited >= 0 && waited < st.ctx->config.cluster.store_batch_ms) return true;
  flush_stores(self);
  st.store_waiting_since_ms = -1;
  return false;
}

void untrusted(router_actor_t* self) {
  ++self->state.untrusted;
  self->state.ctx->metrics->cluster_event("untrusted");
}

namespace {

// Decides `job` (route_decision.hpp) and does what the decision leaves to the actor.
void decide_and_wire(router_actor_t* self, model_state& m, const route_job_ptr& job,
                     const sign_result* signed_, int attempt) {
  switch (decide(self->state, m, *job, signed_, attempt)) {
    case decided::answered:
      settle_deciding(self->state, m, *job);
      // With load authorities the decision is in this router's totals: they go out at once
      // after a quiet spell, else with the next tick (at most one per load_sync_ms).
      wake_load_tick(self);
      return;
    case decided::arm_flush:
      settle_deciding(self->state, m, *job);
      self->delayed_send(self,
                         std::chrono::milliseconds(self->state.ctx->config.cluster.load_sync_ms),
                         flush_atom::value);
      return;
    case decided::sign_again:
      return sign_and_route(self, m, job, 1);
  }
}

// --- Sharded signing (cluster; shard_gather.hpp plans and merges) ---

// After timeouts.shard_sign_ms a shard's part of a signature is given up on (shard_gather merges
// what did arrive).
std::chrono::milliseconds shard_timeout(const router_state& st) {
  return std::chrono::milliseconds(st.ctx->config.timeouts.shard_sign_ms);
}

// The ring shard lookups read: the one before a join during its grace period, else the current.
struct shard_view {
  const hash_ring& ring;
  const std::vector<caf::actor>& shards;
  std::optional<uint32_t> local;
  bool before;
};

// Drops the ring before a join once its grace period is over.
void expire_ring_before(router_state& st) {
  if (!st.ring_before || st.ctx->now_ms() < st.ring_before_until_ms) return;
  if (st.handoff_wait.waiting()) {
    // Fail loudly: a block a newcomer was not handed yet now reads as missing there.
    ++st.handoffs_unconfirmed;
    std::string who;
    for (const auto& n : st.handoff_wait.pending())
      who += (who.empty() ? "" : ", ") + n;
    spdlog::warn(
        "signature-cache hand-off not confirmed by {} within cluster.handoff_grace_ms ({} ms): "
        "lookups read the new ring, where blocks not handed over yet read as missing",
        who, st.ctx->config.cluster.handoff_grace_ms);
    st.handoff_wait.stop();
  }
  st.ring_before.reset();
}

shard_view read_view(router_state& st) {
  expire_ring_before(st);
  if (st.ring_before)
    return {st.ring_before->ring, st.ring_before->shards, st.ring_before->local, true};
  return {*st.ring, st.shards, st.local_shard, false};
}

void shard_done(router_actor_t* self, const shard_gather_ptr& g) {
  if (--g->pending > 0) return;
  auto& m = *self->state.models[g->model];
  // Kept only under the spec the model still routes with (a swap may have landed meanwhile).
  if (!g->from_kept_sums && gather_complete(*g) && g->spec == m.spec)
    m.shard_sums.put(g->spec, g->asked, g->asked_acc);
  const sign_result out = finish_gather(*g);
  decide_and_wire(self, m, g->job, &out, g->attempt);
}

// Plans who sums `blocks` (never a member named in `excluded`) and asks them. The caller holds one
// pending slot of `g` for this call, released here.
void ask_shards(router_actor_t* self, const shard_gather_ptr& g,
                const std::vector<uint64_t>& blocks, const std::vector<std::string>& excluded);

// Asks one shard (member `owner` of `v`) for its part; on an error or a timeout the part goes to
// the owners left.
void ask_shard(router_actor_t* self, const shard_gather_ptr& g, const shard_view& v, uint32_t owner,
               std::vector<uint64_t> blocks, std::vector<std::string> excluded) {
  auto& st = self->state;
  ++st.shard_requests;
  if (v.before) ++st.shard_requests_ring_before;
  std::string name = v.ring.members()[owner];
  const bool local = v.local && owner == *v.local;
  auto on_reply = [self, g, local, sent_ns = steady_ns()](const shard_sign_reply& r) {
    self->state.shard_failover->on_answer();
    merge_shard(*g, r, self->state.shard_scratch);
    self->state.ctx->metrics->shard_answered(local, 1e-9 * double(steady_ns() - sent_ns));
    shard_done(self, g);
  };
  auto on_error = [self, g, name = std::move(name), blocks,
                   excluded = std::move(excluded)](caf::error& e) mutable {
    auto& s = self->state;
    // A shard that timed out is usually busy, not gone (a dead one fails at once): asking the
    // next owner doubles the work of a saturated cluster, so only within the failover budget.
    // Otherwise the part is given up and the request routed with lower coverage.
    if (e == caf::sec::request_timeout && !s.shard_failover->on_timeout()) {
      ++s.shard_failovers_refused;
      ++s.shard_failures;
      uint64_t held = 0;
      if (s.shard_failover_log.allow(s.ctx->now_ms(), held))
        spdlog::warn(
            "shard {} did not answer within {} ms and too many shard parts time out to ask the "
            "other owners: {} blocks left unsummed{}",
            name, s.ctx->config.timeouts.shard_sign_ms, blocks.size(),
            log_limiter::held_note(held));
      return shard_done(self, g);
    }
    excluded.push_back(name);
    ++g->pending;  // ask_shards adds its own parts and releases this slot
    ask_shards(self, g, blocks, excluded);
    shard_done(self, g);
  };
  if (local) {
    ++st.shard_local_requests;
    auto job = std::make_shared<shard_job>();
    job->model = g->model;
    job->layers = g->layers;
    job->job = g->job;
    job->blocks = std::move(blocks);
    self->request(v.shards[owner], shard_timeout(st), sign_atom::value, shard_job_ptr(job))
        .then(on_reply, std::move(on_error));
    return;
  }
  // This router's batched stores for that node go first when they hold one of the blocks: CAF
  // keeps their order, so the shard has them when it sums.
  if (st.store_out.holds_any(v.ring.members()[owner], blocks))
    send_batches(self, st.store_out.take(v.ring.members()[owner]));
  shard_sign_request req;
  req.model = g->job->request.model;
  req.blocks = std::move(blocks);
  req.layers = g->layers;
  self->request(v.shards[owner], shard_timeout(st), shard_sign_atom::value, std::move(req))
      .then(on_reply, std::move(on_error));
}

void ask_shards(router_actor_t* self, const shard_gather_ptr& g,
                const std::vector<uint64_t>& blocks, const std::vector<std::string>& excluded) {
  auto& st = self->state;
  const shard_view v = read_view(st);
  auto plan = plan_parts(v.ring, st.ctx->config.cluster.replication, blocks, v.local, excluded);
  if (!excluded.empty()) {
    if (!plan.parts.empty()) ++st.shard_failovers;
    if (plan.lost > 0 || plan.parts.empty()) ++st.shard_failures;
  }
  g->pending += plan.parts.size();
  for (auto& [owner, part] : plan.parts)
    ask_shard(self, g, v, owner, std::move(part), excluded);
  shard_done(self, g);
}

// Sends the counts a request carries to every owner of their blocks (R of them;
// core/membership/hash_ring): by pointer to this node's own shard, at once; to the others batched
// (store_batch.hpp), one message per owner every cluster.store_batch_ms. One-way, off the request's
// path. A later request that needs these blocks is sent to their owners by this router after this
// store (a batch goes before a lookup to its owner), and CAF delivers one sender's messages to one
// receiver in order.
void store_at_owners(router_actor_t* self, const shard_gather_ptr& g) {
  auto& st = self->state;
  const auto& req = g->job->request;
  if (!req.counts || req.counts->blocks.empty()) return;
  expire_ring_before(st);
  auto plan = store_plan(*st.ring, st.ctx->config.cluster.replication, req,
                         st.ring_before ? &st.ring_before->ring : nullptr);
  st.shard_stores_cached += plan.skipped;
  for (auto& [owner, blocks] : plan.by_owner) {
    if (st.local_shard && owner == *st.local_shard) {
      auto job = std::make_shared<shard_job>();
      job->model = g->model;
      job->job = g->job;
      job->counts = std::move(blocks);
      self->send(st.shards[owner], shard_store_atom::value, shard_job_ptr(job));
      continue;
    }
    const std::string& name = st.ring->members()[owner];
    const bool full = st.store_out.add(name, req.model, req.counts->geometry, blocks);
    const uint32_t every = st.ctx->config.cluster.store_batch_ms;
    if (full || every == 0) {
      send_batches(self, st.store_out.take(name));
    } else if (st.load_timer && every >= st.ctx->config.cluster.load_sync_ms) {
      // The load tick runs at most load_sync_ms apart while anything is owed (this batch counts,
      // flush_due_stores): the batch rides it instead of arming a timer of its own, which cost
      // the node three thread wake-ups per store_batch_ms (BENCHMARKS.md, "Timers and thread
      // wake-ups"), and the node's stores and load messages leave together.
      if (st.store_waiting_since_ms < 0) st.store_waiting_since_ms = st.ctx->now_ms();
      wake_load_tick(self);
    } else if (!st.store_flush_armed) {
      st.store_flush_armed = true;
      self->delayed_send(self, std::chrono::milliseconds(every), store_flush_atom::value);
    }
  }
}

// The counts a request carries are summed here, where they already are, and stored at their
// owners on the side; only the blocks without counts (prefix hits) are asked of the shards, unless
// this router kept the shards' sum for exactly those blocks (shard_sum_cache.hpp) or was sent
// their counts before (seen_blocks.hpp). A cold prompt, all of whose counts the prefill sent,
// needs no shard at all.
void shard_sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt) {
  // Counts of another geometry are neither summed nor stored (decide() says so in the reply).
  const bool counts_usable = !counts_of_other_geometry(m, job->request);
  auto g = start_gather(m, std::move(job), attempt, counts_usable);
  if (counts_usable) {
    store_at_owners(self, g);
    keep_carried(*g, m.seen);
  }
  g->pending = 1;
  if (g->spec && m.shard_sums.add_to(g->spec, g->asked, g->asked_acc)) {
    g->covered += static_cast<uint32_t>(g->asked.size());
    g->asked_covered = static_cast<uint32_t>(g->asked.size());
    g->from_kept_sums = true;
    return shard_done(self, g);
  }
  // Blocks this router was sent before (with prefill-affine clients, every prefix hit) are summed
  // here; only the rest are asked of the shards.
  sum_seen(*g, m.seen);
  if (g->asked.empty()) return shard_done(self, g);
  ask_shards(self, g, g->asked, {});
}

}  // namespace

void sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt) {
  if (attempt == 0) enter_deciding(self->state, m, *job);
  // A ring of this node alone (a one-node cluster, or the only cache node left) signs like a
  // standalone node: one local message, no partial sums.
  const auto& ring = self->state.ring;
  if (ring && !(ring->size() == 1 && self->state.sigcache &&
                ring->members()[0] == self->state.ctx->config.name)) {
    if (!ring->empty()) return shard_sign_and_route(self, m, std::move(job), attempt);
    return decide_and_wire(self, m, job, nullptr,
                           attempt);  // no signature-cache node alive: load only
  }
  if (!self->state.sigcache) return decide_and_wire(self, m, job, nullptr, attempt);
  auto sj = std::make_shared<sign_job>(sign_job{m.index, m.spec, job_to_sign(m, job)});
  const uint32_t index = m.index;
  self->request(self->state.sigcache, caf::infinite, sign_atom::value, sign_job_ptr(sj))
      .then(
          [=](sign_result_ptr r) {
            decide_and_wire(self, *self->state.models[index], job, r.get(), attempt);
          },
          [=](caf::error& e) {
            spdlog::warn("signature cache failed for request {}: {}", job->request.id,
                         self->system().render(e));
            decide_and_wire(self, *self->state.models[index], job, nullptr, attempt);
          });
}

namespace {

caf::behavior router_behavior(router_actor_t* self, node_context_ptr ctx, caf::actor sigcache,
                              std::vector<router_model_init> init) {
  auto& st = self->state;
  st.ctx = ctx;
  st.sigcache = sigcache;
  // Validated config: capacity and TTL are >= 1, so make() cannot fail.
  auto decisions = bounded_lru<std::string, remembered>::make(ctx->config.cluster.max_decisions,
                                                              ctx->config.cluster.decision_ttl_ms);
  st.decisions.emplace(std::move(*decisions));
  // The defaults are valid, so make() cannot fail.
  st.shard_failover.emplace(*failover_budget::make());
  st.recall_budget.emplace(*failover_budget::make(100.0, 0.1));
  st.started_ms = ctx->now_ms();
  if (ctx->config.clustered()) rebuild_ring(st, {});  // this node's shard until peers join
  // Told when this node's cache finishes a hand-off (the bridge over a join waits for it).
  if (ctx->config.clustered() && st.sigcache) self->send(st.sigcache, handoff_watch_atom::value);
  st.authority_mode = ctx->config.clustered() && ctx->config.cluster.load_sharing == "authority";
  if (st.authority_mode) {
    // A restarted router counts from 0 again: a new incarnation tells the authorities so.
    st.incarnation = draw_incarnation();
    start_load_tick(self);
  }
  const auto persisted = read_persisted_policies(ctx->config);
  auto histories = read_histories(ctx->config);
  for (uint32_t i = 0; i < ctx->config.models.size(); ++i) {
    const auto& cfg = ctx->config.models[i];
    load_view_options lo;
    lo.report_timeout_ms = cfg.worker_timeout_ms;
    lo.max_tracked = ctx->config.max_tracked_requests;
    lo.max_id_bytes = 256;
    uint32_t k = cfg.workers;
    if (k == 0 && init[i].current) k = init[i].current->workers;
    auto pool = load_view::make(std::max<uint32_t>(k, 1), lo);
    auto m = std::make_unique<model_state>(std::move(*pool));
    m->index = i;
    m->cfg = &ctx->config.models[i];
    m->claims = authority_map(ctx->config.name, cfg.name);
    m->policy_name = cfg.policy;
    m->tau = cfg.tau;
    m->widen_single = cfg.widen_single;
    // Only a clustered router asks shards (standalone, the node's one cache signs).
    if (ctx->config.clustered()) {
      m->shard_sums = shard_sum_cache(size_t{ctx->config.cluster.shard_sum_cache_mib} << 20);
      m->seen = seen_blocks(size_t{ctx->config.cluster.seen_blocks_mib} << 20);
    }
    if (auto p = persisted.find(cfg.name); p != persisted.end()) {
      m->policy_name = p->second.policy;
      m->tau = p->second.tau;
      m->widen_single = p->second.widen_single.value_or(cfg.widen_single);
      m->policy_source = "admin";
      if (auto s = rebuild_policy(*m); !s.ok() || m->policy_name == "domain") {
        spdlog::error(
            "model {}: persisted policy {} tau {} not usable ({}); the config's {} applies",
            cfg.name, m->policy_name, m->tau, s.ok() ? "not servable" : s.message(), cfg.policy);
        m->policy_name = cfg.policy;
        m->tau = cfg.tau;
        m->widen_single = cfg.widen_single;
        m->policy_source = "config";
      } else {
        spdlog::info(
            "model {}: policy {} tau {} as set with eldrctl policy (persisted in {}); "
            "the config says {} tau {}",
            cfg.name, m->policy_name, m->tau, policy_file_path(ctx->config), cfg.policy, cfg.tau);
      }
    }
    if (auto h = histories.find(cfg.name); h != histories.end()) m->history = std::move(h->second);
    if (init[i].current) {
      if (auto s = install(st, *m, *init[i].current, init[i].current->epoch, "start"); !s.ok())
        spdlog::error("model {}: stored centroid set not installed: {}", cfg.name, s.to_string());
    }
    if (!m->policy) (void)rebuild_policy(*m);
    publish_readiness(st, *m);
    st.models.push_back(std::move(m));
    self->send(self, scrape_tick_atom::value, i);
  }
  persist_histories(st);
  return {
      [=](scrape_tick_atom, uint32_t index) {
        auto& s = self->state;
        if (self->current_sender() != self->ctrl() || index >= s.models.size()) return;
        scrape_model(self, *s.models[index]);
        self->delayed_send(self, std::chrono::milliseconds(s.models[index]->cfg->scrape_interval()),
                           scrape_tick_atom::value, index);
      },
      [=](scraped_atom, uint32_t model, uint32_t worker, int64_t issued_ms, bool ok,
          uint32_t running, uint32_t waiting, float kv_usage, const std::string& error) {
        vllm_load load;
        load.running = running;
        load.waiting = waiting;
        load.kv_usage = kv_usage;
        on_scraped(self, model, worker, issued_ms, ok, load, error);
        wake_load_tick(self);
      },
      [=](route_atom, route_job_ptr job) {
        auto* m = self->state.find(job->request.model);
        if (!m) {
          ++self->state.unknown_model;
          send_route_error(*self->state.ctx, *job, wire_error_code::unknown_model,
                           "no model named '" + job->request.model + "'");
          return;
        }
        if (answer_retry(self->state, *m, *job)) return;
        // A failover resend this router does not know: its first router may have decided it.
        if (job->request.retry) return recall_from_peers(self, *m, std::move(job));
        self->state.recall_budget->on_answer();
        sign_and_route(self, *m, std::move(job), 0);
      },
      [=](recall_atom, const std::string& model,
          const std::string& request) -> caf::result<std::vector<shared_decision>> {
        return answer_recall(self, model, request);
      },
      [=](flush_atom) { flush_decisions(self); },
      [=](store_flush_atom) {
        self->state.store_flush_armed = false;
        flush_stores(self);
      },
      [=](load_tick_atom, uint64_t token) {
        if (self->current_sender() != self->ctrl()) return;
        on_load_tick(self, token);
      },
      // A router's decision totals for workers this node is the authority of.
      [=](load_delta_atom, const load_delta_msg& msg) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(msg.model);
        if (!m || !m->authority || msg.workers.size() != msg.totals.size() || msg.seq == 0) {
          ++s.load_messages_refused;
          return;
        }
        load_delta d{msg.router, msg.incarnation, msg.seq, {}, msg.resync};
        d.totals.reserve(msg.workers.size());
        for (size_t i = 0; i < msg.workers.size(); ++i)
          d.totals.emplace_back(msg.workers[i], msg.totals[i]);
        m->authority->on_delta(d);
        ++s.deltas_applied;
        wake_load_tick(self);  // the vector now includes it: the sender stops owing it
      },
      // An authority's load vector.
      [=](load_vector_atom, const load_vector_msg& msg) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(msg.model);
        if (!m || msg.workers.size() != msg.in_flight.size() ||
            msg.workers.size() != msg.alive.size() || msg.workers.size() != msg.anchors.size() ||
            msg.workers.size() != msg.claim.size() || msg.routers.size() != msg.included.size() ||
            msg.routers.size() != msg.router_incarnations.size() || msg.authority.empty() ||
            msg.authority == s.ctx->config.name) {
          ++s.load_messages_refused;
          return;
        }
        // A late vector of a node that left (its workers have a successor now), or one that came
        // before the member list naming its node (the next one is applied).
        if (!s.routers_by_name.count(msg.authority)) {
          ++s.vectors_from_non_members;
          return;
        }
        load_vector v;
        v.authority = msg.authority;
        v.incarnation = msg.incarnation;
        v.seq = msg.seq;
        for (size_t i = 0; i < msg.workers.size(); ++i)
          v.workers.push_back({msg.workers[i], msg.in_flight[i], msg.alive[i] != 0, msg.claim[i],
                               msg.anchors[i] != 0});
        for (size_t i = 0; i < msg.routers.size(); ++i)
          v.included[msg.routers[i]] = {msg.router_incarnations[i], msg.included[i]};
        if (apply_vector(s, *m, v)) wake_load_tick(self);
      },
      [=](members_atom, const std::vector<member_info>& members, uint32_t) {
        auto& s = self->state;
        if (!accept_member_list(self, *s.ctx->metrics, &s.untrusted)) return;
        on_members(self, members);
        wake_load_tick(self);
      },
      [=](handoff_done_atom, const std::string& from, const std::vector<std::string>& ring) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return untrusted(self);
        on_handoff_done(self->state, from, ring);
      },
      [=](decisions_atom, const std::string& model, const std::vector<shared_decision>& ds) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(model);
        if (!m) return;
        const int64_t now = s.ctx->now_ms();
        for (const auto& d : ds) {
          const auto key = decision_key(*m, d.request);
          if (s.decisions->get(key, now) != nullptr || d.worker >= m->pool.k()) continue;
          (void)m->pool.on_route(d.request, d.worker, now);
          s.decisions->put(key, remembered{d.worker, d.epoch}, now);
          ++s.peer_decisions;
        }
      },
      [=](peer_worker_atom, const std::vector<uint8_t>& bytes) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        worker_protocol_limits limits;
        auto msg = decode_worker_message(bytes, limits);
        if (!msg.ok()) return;
        ++s.peer_worker_messages;
        handle_worker(self, worker_job{reply_address{}, std::move(*msg)}, false);
        wake_load_tick(self);
      },
      [=](pool_sync_atom, const std::vector<pool_snapshot>& pools) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return untrusted(self);
        merge_pools(self, pools);
      },
      [=](epoch_atom, const std::string& model, uint64_t epoch, uint64_t term,
          const std::vector<uint8_t>& file, const std::string& cause) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(model);
        if (m) adopt_epoch(self, *m, epoch, term, file, "announced by a peer router", cause);
      },
      // A refit leader's term: publishes from older terms are refused from now on, and imports
      // go to that leader.
      [=](leader_atom, const std::string& name, uint64_t term) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        for (auto& m : s.models)
          m->fence.observe_term(term);
        if (!name.empty() && term >= s.leader_term) {
          s.leader = name;
          s.leader_term = term;
        } else if (name.empty() && local_sender(self) && s.leader == s.ctx->config.name) {
          s.leader.clear();  // this node's refit actor stepped down
        }
      },
      [=](set_change_retry_atom, uint32_t index, admin_job_ptr job, std::string& command,
          std::vector<uint8_t>& bytes, uint64_t epoch, int64_t deadline_ms) {
        if (self->current_sender() != self->ctrl() || index >= self->state.models.size()) return;
        change_via_leader(self, index, std::move(job), std::move(command), std::move(bytes), epoch,
                          deadline_ms);
      },
      // Another router's change of the current set (import, swap, rollback), for this node to
      // make as the refit leader.
      [=](set_change_atom, const std::string& model, const std::string& command,
          const std::vector<uint8_t>& bytes, uint64_t epoch) -> caf::result<uint64_t, uint64_t> {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) {
          untrusted(self);
          return caf::sec::request_receiver_down;
        }
        auto* m = s.find(model);
        if (!m) return caf::make_error(caf::sec::runtime_error, "no model named '" + model + "'");
        if (command != "import" && command != "swap" && command != "rollback")
          return caf::make_error(caf::sec::runtime_error, "no change named '" + command + "'");
        if (s.leader != s.ctx->config.name)
          return caf::make_error(caf::sec::runtime_error,
                                 "this node is not the refit leader (the leader is " +
                                     (s.leader.empty() ? std::string("unknown") : s.leader) + ")");
        auto rp = self->make_response_promise<uint64_t, uint64_t>();
        change_as_leader(self, *m, command, bytes, epoch, s.leader_term,
                         [rp](result<uint64_t> r, uint64_t source) mutable {
                           if (r.ok())
                             rp.deliver(*r, source);
                           else
                             rp.deliver(to_caf_error(r.error()));
                         });
        return rp;
      },
      // The refit leader's sample of this router's live signatures (a copy).
      [=](peer_sample_atom, const std::string& model) -> caf::result<sample_reply> {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) {
          untrusted(self);
          return caf::sec::request_receiver_down;
        }
        auto* m = s.find(model);
        if (!m) return caf::sec::invalid_argument;
        sample_reply r;
        r.epoch = m->epoch;
        if (m->sample && m->spec) {
          r.width = m->spec->width();
          r.seen = m->sample->seen();
          r.points = pack_points(m->sample->points());
        }
        return r;
      },
      [=](worker_atom, worker_job_ptr job) {
        handle_worker(self, *job, true);
        wake_load_tick(self);
      },
      [=](admin_atom, admin_job_ptr job) { handle_admin(self, job); },
      // The operator page's worker rows (the `workers` admin command's) and spec, per model.
      [=](page_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        nlohmann::json out = nlohmann::json::object();
        for (auto& m : self->state.models)
          out[m->cfg->name] = {{"workers", workers_json(self->state, *m)}, {"spec", spec_json(*m)}};
        return out.dump();
      },
      // The router's part of `status`: models as a JSON text.
      [=](admin_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        return router_json(self->state).dump();
      },
      // The refit's sample: a copy of the reservoir and the current set.
      [=](sample_atom, uint32_t index) -> caf::result<refit_input_ptr> {
        if (index >= self->state.models.size()) return caf::sec::invalid_argument;
        auto& m = *self->state.models[index];
        auto in = std::make_shared<refit_input>();
        in->model = index;
        in->model_name = m.cfg->name;
        in->k = m.pool.k();
        in->spec = m.spec;
        in->current = m.set;
        in->current_file = m.file;
        if (m.sample) {
          in->seen = m.sample->seen();
          const auto pts = m.sample->points();
          // Up to 100 MB copied on this thread: into memory made resident in huge pages where
          // the kernel offers them, not faulted in page by page by the copy (a pause in routing
          // of 22 ms instead of 282-366 ms at the default sample_size on this project's VM;
          // bench/signature_bench.cpp, sample_copy; BENCHMARKS.md, "Timers and thread wake-ups").
          make_resident(in->points, pts.size());
          in->points.assign(pts.begin(), pts.end());
        }
        return refit_input_ptr(in);
      },
      // An accepted refit: store as a new epoch and install.
      // An accepted refit, published in `term` (0 standalone).
      [=](install_atom, uint32_t index, stored_set_ptr s, uint64_t term) -> caf::result<uint64_t> {
        if (index >= self->state.models.size()) return caf::sec::invalid_argument;
        auto& m = *self->state.models[index];
        if (term < m.fence.highest_term())
          return caf::make_error(caf::sec::runtime_error,
                                 "term " + std::to_string(term) + " is stale (current term " +
                                     std::to_string(m.fence.highest_term()) + ")");
        auto rp = self->make_response_promise<uint64_t>();
        store_and_install(self, m, s->file, "refit", "refit", deliver_epoch(rp), term);
        return rp;
      },
  };
}

}  // namespace
}  // namespace eldr::router

namespace eldr {

caf::actor spawn_router(caf::actor_system& sys, node_context_ptr ctx, caf::actor sigcache,
                        std::vector<router_model_init> init) {
  return sys.spawn(router::router_behavior, std::move(ctx), std::move(sigcache), std::move(init));
}

}  // namespace eldr
