// router_peers: what the routers of a cluster tell each other -- their decisions (for retries and
// load, cluster.load_sharing = "decisions"), their pools and current sets when one joins, each new
// epoch with its cause -- and the ring of signature-cache shards rebuilt from the live members.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/router/model_policy.hpp"
#include "actors/router/router_actor_internal.hpp"

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
    for (const auto& w : m->pool.snapshot_all(now))
      if (w.state != worker_state::unregistered)
        p.workers.push_back(worker_row{w.index, w.endpoint, w.capacity, w.load, w.draining});
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
  // Batched stores go to the owners they were planned for, before the ring moves blocks.
  flush_stores(self);
  rebuild_ring(st, members);
}

}  // namespace eldr::router
