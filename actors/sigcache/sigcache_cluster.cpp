// sigcache_cluster: the signature cache as one shard of the cluster's. When the membership
// changes, the ring of signature-cache nodes is rebuilt and the blocks this node holds are handed
// to the owners that are new since (which ones: handoff_planner.hpp), one acknowledged batch at a
// time; blocks handed to this node are taken over (handoff.hpp). The actor's own file: it sends
// and receives CAF messages.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "actors/sigcache/handoff.hpp"
#include "actors/sigcache/sigcache_actor_internal.hpp"

namespace eldr::sigcache {
namespace {

// Blocks per hand-off message: about 3 MiB at 48 x 128 (6 KiB a block), moved in a few ms on a
// LAN, so a heartbeat behind it on the connection is not delayed past the peers' timeout.
constexpr size_t handoff_batch = 512;
// Held blocks examined per turn when no batch fills (most blocks do not move when a node joins a
// large cluster): the actor answers shard lookups between two slices.
constexpr size_t handoff_scan_per_turn = 8192;
// How long a receiver may take to store a batch before it counts as failed; the hand-off goes on
// with the next (a receiver that left is replaced by the next ring change).
constexpr auto handoff_ack_timeout = std::chrono::seconds(30);

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void handoff_step(sigcache_actor_t* self, uint64_t id);

// The hand-off is over: how long this node's share took is what an operator sizes
// cluster.handoff_grace_ms by, so it is logged with the blocks and the nodes they went to.
void finish_handoff(sigcache_actor_t* self) {
  auto& st = self->state;
  auto& job = *st.handoff;
  const int64_t ms = (steady_ns() - job.started_ns) / 1000000;
  st.handoff_last_ms = ms;
  ++st.handoffs_finished;
  // Every batch was acknowledged once stored: the routers reading the ring before the join may
  // stop waiting for this node (router_peers.cpp). With a batch lost they wait until their bound
  // (cluster.handoff_grace_ms) and say so.
  const std::vector<std::string>& ring = job.next.members();
  if (job.failed == 0) {
    if (st.local_router)
      self->send(st.local_router, handoff_done_atom::value, st.ctx->config.name, ring);
    for (const auto& r : st.peer_routers)
      self->send(r, handoff_done_atom::value, st.ctx->config.name, ring);
  }
  if (job.sent > 0 || job.failed > 0)
    spdlog::info("signature-cache ring of {} node(s): handed {} block(s) to {} node(s) in {} ms{}",
                 job.next.size(), job.sent, job.receivers.size(), ms,
                 job.failed > 0 ? fmt::format(" ({} in batches not acknowledged)", job.failed)
                                : std::string());
  st.handoff.reset();
}

// Reads one batch's counts and sends it; the receiver's answer (or its failure) resumes the job.
void send_batch(sigcache_actor_t* self, handoff_planner::batch b) {
  auto& st = self->state;
  auto& job = *st.handoff;
  auto& mc = st.models[job.model];
  std::vector<handoff_block> blocks;
  blocks.reserve(b.blocks.size());
  for (const auto& [hash, parent] : b.blocks) {
    auto counts = mc.cache->masked_counts(hash);
    if (!counts.ok()) continue;  // evicted since the scan
    auto bytes = handoff_bytes(*counts);
    if (!bytes) continue;
    blocks.push_back(
        handoff_block{hash, parent.has_value(), parent.value_or(0), std::move(*bytes)});
  }
  const uint64_t id = job.id;
  if (blocks.empty()) {
    self->send(self, handoff_step_atom::value, id);
    return;
  }
  const uint64_t n = blocks.size();
  mc.handed_off += n;
  job.sent += n;
  job.receivers.insert(b.to);
  const auto& g = mc.cache->geometry();
  self->request(job.to.at(b.to), handoff_ack_timeout, handoff_atom::value,
                st.ctx->config.models[job.model].name, g.layers, g.experts, g.top_k,
                std::move(blocks))
      .then([self, id](uint64_t) { handoff_step(self, id); },
            [self, id, n, to = b.to](caf::error& e) {
              auto& s = self->state;
              if (!s.handoff || s.handoff->id != id) return;
              s.handoff->failed += n;
              spdlog::warn("signature-cache hand-off: {} block(s) to {} not acknowledged: {}", n,
                           to, self->system().render(e));
              handoff_step(self, id);
            });
}

// The next slice of the hand-off `id` (ignored once another ring change superseded it).
void handoff_step(sigcache_actor_t* self, uint64_t id) {
  auto& st = self->state;
  if (!st.handoff || st.handoff->id != id) return;
  auto& job = *st.handoff;
  const size_t r = st.ctx->config.cluster.replication;
  std::set<std::string> receivers;
  for (const auto& [name, a] : job.to)
    receivers.insert(name);
  while (job.model < st.models.size()) {
    if (!job.planner) {
      std::vector<handoff_planner::held_block> held;
      st.models[job.model].cache->for_each_block([&](const block_info& b) {
        if (b.has_counts) held.emplace_back(b.hash, b.parent);
      });
      job.planner.emplace(job.base, job.next, r, st.ctx->config.name, receivers, std::move(held),
                          handoff_batch);
    }
    if (auto b = job.planner->next(handoff_scan_per_turn)) return send_batch(self, std::move(*b));
    if (!job.planner->done()) {
      self->send(self, handoff_step_atom::value, id);  // other messages first
      return;
    }
    job.planner.reset();
    ++job.model;
  }
  finish_handoff(self);
}

// After a ring change, every block this node holds counts for goes to the owners it has now and
// did not have before (a node that joined or came back takes its share from the nodes that hold
// it, without a full reload).
void start_handoff(sigcache_actor_t* self, hash_ring next, std::map<std::string, caf::actor> to) {
  auto& st = self->state;
  std::optional<hash_ring> base = st.ring;
  if (st.handoff) {
    base = std::move(st.handoff->base);
    ++st.handoffs_superseded;
  }
  st.ring = next;
  st.handoff = sigcache_state::handoff_job{++st.handoff_ids,
                                           std::move(base),
                                           std::move(next),
                                           std::move(to),
                                           0,
                                           std::nullopt,
                                           steady_ns(),
                                           0,
                                           0,
                                           {}};
  handoff_step(self, st.handoff_ids);
}

}  // namespace

model_cache* find_model(sigcache_state& st, const std::string& name) {
  const auto& models = st.ctx->config.models;
  for (size_t m = 0; m < models.size(); ++m)
    if (models[m].name == name) return &st.models[m];
  return nullptr;
}

void on_members(sigcache_actor_t* self, const std::vector<member_info>& members) {
  auto& st = self->state;
  if (!accept_member_list(self, *st.ctx->metrics)) return;
  std::vector<std::string> names{st.ctx->config.name};
  std::map<std::string, caf::actor> to;
  st.peer_routers.clear();
  for (const auto& mi : members)
    if (mi.router && mi.name != st.ctx->config.name) st.peer_routers.push_back(mi.router);
  for (const auto& mi : members)
    if (mi.sigcache && !to.count(mi.name) && mi.name != st.ctx->config.name) {
      names.push_back(mi.name);
      to[mi.name] = mi.sigcache;
    }
  auto next = hash_ring::make(std::move(names), st.ctx->config.cluster.vnodes);
  if (!next.ok()) return;
  if (st.ring && st.ring->members() == next->members()) return;  // the same ring: nothing moves
  start_handoff(self, std::move(*next), std::move(to));
}

void on_handoff_watch(sigcache_actor_t* self) {
  if (!local_sender(self)) return;
  self->state.local_router = caf::actor_cast<caf::actor>(self->current_sender());
}

void on_handoff_step(sigcache_actor_t* self, uint64_t id) {
  if (!local_sender(self)) return;
  handoff_step(self, id);
}

caf::result<uint64_t> on_handoff(sigcache_actor_t* self, const std::string& model,
                                 const model_geometry& g,
                                 const std::vector<handoff_block>& blocks) {
  auto& st = self->state;
  if (!trusted_sender(self, st.ctx->trust.get())) return caf::sec::invalid_argument;
  auto* mc = find_model(st, model);
  if (!mc) return caf::sec::invalid_argument;
  return take_over(*mc, g, blocks);
}

}  // namespace eldr::sigcache
