// router_peers: what the routers of a cluster tell each other -- their decisions (for retries and
// load, cluster.load_sharing = "decisions"), their pools and current sets when one joins, each new
// epoch with its cause -- and the ring of signature-cache shards rebuilt from the live members.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/router/model_policy.hpp"
#include "actors/router/route_decision.hpp"
#include "actors/router/router_actor_internal.hpp"
#include "core/membership/recall_gather.hpp"

namespace eldr::router {

// Tells the other routers that `m` now routes with `epoch` (they install it when it is newer
// than theirs), and why, so that their rollback histories follow this one's.
void announce_epoch(caf::event_based_actor* self, const router_state& st, const model_state& m) {
  if (st.peers.empty() || !m.file) return;
  const auto bytes = encode_centroid_file(*m.file);
  for (const auto& p : st.peers)
    self->send(p, epoch_atom::value, m.cfg->name, m.epoch, m.fence.highest_term(), bytes,
               m.last_cause);
}

namespace {

// Every node of the ring before a join handed its blocks over: lookups read the new ring.
void end_bridge(router_state& st, size_t ring_size) {
  if (!st.ring_before) return;
  ++st.handoffs_confirmed;
  spdlog::info(
      "signature-cache ring of {} node(s): every node of the ring before handed its blocks over "
      "after {} ms; lookups read the new ring",
      ring_size, st.ctx->now_ms() - st.ring_before_since_ms);
  st.ring_before.reset();
}

// Nodes joined the ring, none left: their blocks are still with their owners on the ring before
// the join, which hand them over now (actors/sigcache/sigcache_cluster.cpp). Lookups read that
// ring for cluster.handoff_grace_ms, so that a request does not miss a prefix a newcomer has not
// yet been handed. On a node that has just started and meets the others (its ring was itself
// alone), this node is the newcomer: the ring before is the new one without it. A ring that lost
// a member is read at once (its blocks' other owners have the copies).
void bridge_join(router_state& st, const hash_ring& next,
                 const std::map<std::string, caf::actor>& actors) {
  const uint32_t grace = st.ctx->config.cluster.handoff_grace_ms;
  if (st.ring_before && !only_joined(st.ring_before->ring, next)) {
    st.ring_before.reset();
    st.handoff_wait.stop();
  }
  if (grace == 0) return;
  const int64_t now = st.ctx->now_ms();
  const std::string& me = st.ctx->config.name;
  auto names = handoff_read_members(st.ring ? &*st.ring : nullptr, next, me,
                                    now - st.started_ms < int64_t{grace});
  if (!names) return;
  if (!st.ring_before) {
    auto ring = hash_ring::make(std::move(*names), st.ctx->config.cluster.vnodes);
    if (!ring.ok()) return;
    router_state::previous_ring before{std::move(*ring), {}, std::nullopt};
    for (const auto& n : before.ring.members())
      before.shards.push_back(actors.at(n));
    before.local = before.ring.index_of(me);
    if (before.local && !st.sigcache) before.local.reset();
    st.ring_before = std::move(before);
    st.ring_before_since_ms = now;
  }
  st.ring_before_until_ms = now + grace;
  ++st.ring_joins_bridged;
  spdlog::info(
      "signature-cache ring of {} node(s): lookups read the ring of {} before the join while its "
      "blocks are handed over (until every node of it says it has, at most {} ms)",
      next.size(), st.ring_before->ring.size(), grace);
  // Every node of the ring before hands off for the new ring; those that already said so count.
  if (st.handoff_wait.start(st.ring_before->ring.members(), next.members()))
    end_bridge(st, next.size());
}

}  // namespace

void on_handoff_done(router_state& st, const std::string& from,
                     const std::vector<std::string>& ring) {
  if (st.handoff_wait.on_done(from, ring)) end_bridge(st, ring.size());
}

// Rebuilds the ring of signature-cache shards from the live members (and this node).
void rebuild_ring(router_state& st, const std::vector<member_info>& members) {
  std::vector<std::string> names;
  std::map<std::string, caf::actor> actors;
  if (st.sigcache) {
    names.push_back(st.ctx->config.name);
    actors[st.ctx->config.name] = st.sigcache;
  }
  for (const auto& mi : members)
    if (mi.sigcache && !actors.count(mi.name)) {
      names.push_back(mi.name);
      actors[mi.name] = mi.sigcache;
    }
  auto ring = hash_ring::make(std::move(names), st.ctx->config.cluster.vnodes);
  if (!ring.ok()) {
    spdlog::error("signature-cache ring: {}", ring.error().to_string());
    return;
  }
  if (!st.ring || st.ring->members() != ring->members()) st.handoff_wait.on_ring(ring->members());
  bridge_join(st, *ring, actors);
  st.shards.clear();
  for (const auto& n : ring->members())
    st.shards.push_back(actors[n]);
  st.local_shard = st.sigcache ? ring->index_of(st.ctx->config.name) : std::nullopt;
  st.ring.emplace(std::move(*ring));
}

void flush_decisions(router_actor_t* self) {
  auto& st = self->state;
  st.flush_armed = false;
  for (auto& [index, ds] : st.outbox) {
    if (ds.empty()) continue;
    for (const auto& p : st.peers)
      self->send(p, decisions_atom::value, st.models[index]->cfg->name, ds);
    ds.clear();
  }
}

std::vector<pool_snapshot> snapshot_pools(router_state& st) {
  std::vector<pool_snapshot> out;
  const int64_t now = st.ctx->now_ms();
  for (auto& m : st.models) {
    pool_snapshot p;
    p.model = m->cfg->name;
    p.epoch = m->epoch;
    p.term = m->fence.highest_term();
    if (m->file) p.centroids = encode_centroid_file(*m->file);
    for (const auto& w : m->pool.snapshot_all(now)) {
      if (w.state == worker_state::unregistered) continue;
      worker_row row{w.index, w.endpoint, w.capacity, w.load, w.draining, {}, {}, 0};
      if (w.index < m->metrics_url_text.size()) row.metrics_url = m->metrics_url_text[w.index];
      if (const authority_claim* c = m->claims.claim(w.index); c != nullptr && st.authority_mode) {
        row.authority = c->node;
        row.claim = encode_claim(*c);
      }
      p.workers.push_back(std::move(row));
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Installs a peer's centroid set when the fence accepts it (a newer epoch of a current term),
// and stores it under the same epoch on this node, so that a restart is warm and the next local
// epoch number is above it. `cause` is the change as the announcing router recorded it ("peer"
// for a snapshot), so that this router's rollback history follows.
void adopt_epoch(router_actor_t* self, model_state& m, uint64_t epoch, uint64_t term,
                 const std::vector<uint8_t>& bytes, const char* why, const std::string& cause) {
  if (bytes.empty()) return;
  if (!m.fence.has_epoch() && m.epoch > 0) m.fence = epoch_fence(0, m.epoch);
  const auto verdict = m.fence.offer(term, epoch);
  if (verdict != fence_result::accepted) {
    if (verdict == fence_result::stale_term || verdict == fence_result::old_epoch) {
      ++m.fenced;
      spdlog::info("model {}: epoch {} (term {}) {} refused: {} (current epoch {}, term {})",
                   m.cfg->name, epoch, term, why, to_string(verdict), m.epoch,
                   m.fence.highest_term());
    }
    return;
  }
  auto file = parse_centroid_file(std::span<const uint8_t>(bytes.data(), bytes.size()), "peer");
  if (!file.ok()) {
    spdlog::warn("model {}: epoch {} {} is unreadable: {}", m.cfg->name, epoch, why,
                 file.error().message());
    return;
  }
  if (auto s = check_installable(m, *file); !s.ok()) {
    spdlog::warn("model {}: epoch {} {} does not fit: {}", m.cfg->name, epoch, why, s.message());
    return;
  }
  if (auto s = install(self->state, m, *file, epoch, cause); !s.ok()) return;
  ++self->state.peer_epochs;
  spdlog::info("model {}: installed epoch {} (term {}) {}", m.cfg->name, epoch, term, why);
  if (self->state.sigcache) {
    auto stored = std::make_shared<const stored_set>(stored_set{epoch, std::move(*file)});
    const std::string name = m.cfg->name;
    self->request(self->state.sigcache, caf::infinite, store_set_atom::value, m.index,
                  stored_set_ptr(stored))
        .then([](uint64_t) {},
              [self, name, epoch](caf::error& e) {
                spdlog::warn("model {}: adopted epoch {} not stored: {}", name, epoch,
                             self->system().render(e));
              });
  }
}

// A router that joins late (or after a partition) learns the registered workers and the newest
// centroid set from its peers; its in-flight counts converge with the next load reports.
void merge_pools(router_actor_t* self, const std::vector<pool_snapshot>& pools) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  for (const auto& p : pools) {
    auto* m = st.find(p.model);
    if (!m) continue;
    adopt_epoch(self, *m, p.epoch, p.term, p.centroids, "from a peer's snapshot", "peer");
    for (const auto& w : p.workers) {
      if (w.worker >= m->pool.k()) {
        if (m->cfg->workers != 0 || m->set || w.worker >= m->cfg->max_workers) continue;
        if (!m->pool.resize(w.worker + 1).ok()) continue;
      }
      auto snap = m->pool.snapshot(w.worker, now);
      if (snap.ok() && snap->state != worker_state::unregistered) continue;
      if (!m->pool.register_worker(w.worker, w.endpoint, w.capacity, now).ok()) continue;
      if (w.draining) (void)m->pool.drain(w.worker);
      if (!w.metrics_url.empty()) set_metrics_url(*m, w.worker, w.metrics_url);
      if (st.authority_mode && !w.authority.empty())
        on_snapshot_claim(st, *m, w.worker, decode_claim(w.authority, w.claim), w.load);
    }
    if (m->policy->workers() != m->pool.k()) (void)rebuild_policy(*m);
    publish_readiness(st, *m);
  }
}

void on_members(router_actor_t* self, const std::vector<member_info>& members) {
  auto& st = self->state;
  std::vector<caf::actor> peers;
  for (const auto& mi : members)
    if (mi.router) peers.push_back(mi.router);
  // A router we did not know gets our pools, so that it can route before the next reports.
  std::vector<pool_snapshot> snapshot;
  for (const auto& p : peers) {
    if (std::find(st.peers.begin(), st.peers.end(), p) != st.peers.end()) continue;
    if (snapshot.empty()) snapshot = snapshot_pools(st);
    self->send(p, pool_sync_atom::value, snapshot);
  }
  st.peers = std::move(peers);
  if (st.peers.empty()) st.outbox.clear();
  st.routers_by_name.clear();
  for (const auto& mi : members)
    if (mi.router) st.routers_by_name[mi.name] = mi.router;
  // Load authorities that left: their workers go to their successors (authority_map.hpp).
  if (st.authority_mode) {
    std::vector<std::string> live;
    for (const auto& [name, r] : st.routers_by_name)
      live.push_back(name);
    for (auto& m : st.models)
      on_authorities_left(st, *m, live);
  }
  // Batched stores go to the owners they were planned for, before the ring moves blocks.
  flush_stores(self);
  rebuild_ring(st, members);
}

namespace {

// One outcome of a recall, handled: the client answered with a peer's decision, or the request
// signed and decided afresh once every peer is in.
void on_recall_step(router_actor_t* self, uint32_t index, const route_job_ptr& job,
                    const recall_gather& g, recall_gather::step step) {
  auto& st = self->state;
  if (step == recall_gather::step::wait || step == recall_gather::step::settled) return;
  auto& m = *st.models[index];
  if (step == recall_gather::step::answer &&
      answer_recalled(st, m, *job, remembered{g.found()->worker, g.found()->epoch}))
    return;
  ++st.recall_misses;
  if (g.failures() > 0) {
    // Fail loudly: a peer that could not answer may hold the first decision, and this one then
    // counts the request a second time until the worker's next report.
    uint64_t held = 0;
    if (st.recall_log.allow(st.ctx->now_ms(), held))
      spdlog::warn(
          "model {}: request {} was resent here after a timeout elsewhere; {} of {} peer routers "
          "did not say within {} ms whether they decided it, so it is decided afresh{}",
          m.cfg->name, job->request.id, g.failures(), st.peers.size(),
          st.ctx->config.timeouts.recall_ms, log_limiter::held_note(held));
  }
  sign_and_route(self, m, job, 0);
}

}  // namespace

void recall_from_peers(router_actor_t* self, model_state& m, route_job_ptr job) {
  auto& st = self->state;
  if (st.peers.empty()) return sign_and_route(self, m, std::move(job), 0);
  if (!st.recall_budget->on_timeout()) {
    ++st.recalls_refused;
    uint64_t held = 0;
    if (st.recall_log.allow(st.ctx->now_ms(), held))
      spdlog::warn(
          "model {}: request {} was resent here after a timeout elsewhere, but resends are too "
          "large a share of the requests to ask the peer routers about each: decided afresh{}",
          m.cfg->name, job->request.id, log_limiter::held_note(held));
    return sign_and_route(self, m, std::move(job), 0);
  }
  ++st.recalls;
  auto g = std::make_shared<recall_gather>(st.peers.size());
  const uint32_t index = m.index;
  const auto timeout = std::chrono::milliseconds(st.ctx->config.timeouts.recall_ms);
  for (const auto& p : st.peers)
    self->request(p, timeout, recall_atom::value, m.cfg->name, job->request.id)
        .then(
            [self, index, job, g](const std::vector<shared_decision>& found) {
              std::optional<recalled_decision> d;
              if (found.size() == 1) d = recalled_decision{found[0].worker, found[0].epoch};
              on_recall_step(self, index, job, *g, g->on_answer(d));
            },
            [self, index, job, g](caf::error&) {
              ++self->state.recall_peer_failures;
              on_recall_step(self, index, job, *g, g->on_failure());
            });
}

void enter_deciding(router_state& st, const model_state& m, const route_job& job) {
  if (st.peers.empty() || st.deciding.size() >= st.ctx->config.cluster.max_decisions) return;
  st.deciding.try_emplace(decision_key(m, job.request.id));
}

void settle_deciding(router_state& st, const model_state& m, const route_job& job) {
  if (st.deciding.empty()) return;
  const auto key = decision_key(m, job.request.id);
  auto it = st.deciding.find(key);
  if (it == st.deciding.end()) return;
  std::vector<shared_decision> found;
  if (const auto* r = st.decisions->get(key, st.ctx->now_ms()); r != nullptr)
    found.push_back(shared_decision{job.request.id, r->worker, r->epoch});
  for (auto& rp : it->second) {
    ++st.recalls_answered_waited;
    if (!found.empty()) ++st.recalls_answered_known;
    rp.deliver(found);
  }
  st.deciding.erase(it);
}

caf::result<std::vector<shared_decision>> answer_recall(router_actor_t* self,
                                                        const std::string& model,
                                                        const std::string& request) {
  auto& st = self->state;
  if (!trusted_sender(self, st.ctx->trust.get())) {
    untrusted(self);
    return std::vector<shared_decision>{};
  }
  ++st.recalls_answered;
  auto* m = st.find(model);
  if (!m) return std::vector<shared_decision>{};
  const auto key = decision_key(*m, request);
  if (const auto* r = st.decisions->get(key, st.ctx->now_ms()); r != nullptr) {
    ++st.recalls_answered_known;
    return std::vector<shared_decision>{shared_decision{request, r->worker, r->epoch}};
  }
  // Deciding it now: answered when decided (settle_deciding), well within the asker's
  // timeouts.recall_ms unless this router is far behind.
  if (auto it = st.deciding.find(key); it != st.deciding.end()) {
    auto rp = self->make_response_promise<std::vector<shared_decision>>();
    it->second.push_back(rp);
    return rp;
  }
  return std::vector<shared_decision>{};
}

}  // namespace eldr::router
