// sigcache_cluster: the signature cache as one shard of the cluster's. When the membership
// changes, the ring of signature-cache nodes is rebuilt and the blocks this node holds are handed
// to the owners that are new since; blocks handed to this node are taken over (handoff.hpp). The
// actor's own file: it sends and receives CAF messages.
#include <algorithm>
#include <map>
#include <utility>

#include "actors/sigcache/handoff.hpp"
#include "actors/sigcache/sigcache_actor_internal.hpp"

namespace eldr::sigcache {
namespace {

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
  for (const auto& mi : members)
    if (mi.sigcache && !to.count(mi.name) && mi.name != st.ctx->config.name) {
      names.push_back(mi.name);
      to[mi.name] = mi.sigcache;
    }
  auto next = hash_ring::make(std::move(names), st.ctx->config.cluster.vnodes);
  if (next.ok()) hand_off(self, std::move(*next), to);
}

void on_handoff(sigcache_actor_t* self, const std::string& model, const model_geometry& g,
                const std::vector<handoff_block>& blocks) {
  auto& st = self->state;
  if (!trusted_sender(self, st.ctx->trust.get())) return;
  auto* mc = find_model(st, model);
  if (!mc) return;
  take_over(*mc, g, blocks);
}

}  // namespace eldr::sigcache
