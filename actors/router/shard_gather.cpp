// shard_gather: see shard_gather.hpp.
#include "actors/router/shard_gather.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/membership/shard_plan.hpp"
#include "core/signature.hpp"

namespace eldr::router {

shard_gather_ptr start_gather(const model_state& m, route_job_ptr job, int attempt,
                              bool counts_usable) {
  auto g = std::make_shared<shard_gather>();
  g->job = std::move(job);
  g->spec = m.eldr_active ? m.spec : nullptr;
  if (g->spec) {
    g->layers = g->spec->layer_mask();
    g->acc.assign(g->spec->width(), 0);
    g->asked_acc.assign(g->spec->width(), 0);
  }
  g->model = m.index;
  g->attempt = attempt;
  const auto& req = g->job->request;
  std::unordered_map<uint64_t, const counts_block*> carried;
  if (req.counts && counts_usable)
    for (const auto& b : req.counts->blocks)
      carried.emplace(b.hash, &b);
  for (uint64_t h : req.block_hashes) {
    const auto it = carried.find(h);
    if (it == carried.end()) {
      g->asked.push_back(h);
      continue;
    }
    ++g->covered;
    if (!g->spec) continue;
    if (auto s = add_masked_counts(*g->spec, it->second->counts, g->acc); !s.ok())
      g->problem = s.message();
  }
  return g;
}

size_t sum_seen(shard_gather& g, seen_blocks& seen) {
  if (!g.spec || g.asked.empty()) return 0;
  size_t summed = 0;
  std::erase_if(g.asked, [&](uint64_t h) {
    if (!seen.add_to(g.spec, h, g.acc)) return false;
    ++summed;
    return true;
  });
  g.covered += static_cast<uint32_t>(summed);
  return summed;
}

void keep_carried(const shard_gather& g, seen_blocks& seen) {
  const auto& req = g.job->request;
  // cached_blocks comes from a client that sends every block's counts, prefix hits included
  // (eldr-proxy): a later hit on these blocks will carry them again, so keeping them (0.6-0.7 us a
  // new block, BENCHMARKS.md "Prefill-affine routers and seen blocks") would buy nothing.
  if (!g.spec || !req.counts || req.cached_blocks) return;
  for (const counts_block& b : req.counts->blocks)
    seen.keep(g.spec, b.hash, b.counts);
}

bool gather_complete(const shard_gather& g) {
  return g.spec && g.problem.empty() && !g.asked.empty() && g.asked_covered == g.asked.size();
}

void merge_shard(shard_gather& g, const shard_sign_reply& r, std::vector<uint32_t>& scratch) {
  g.covered += r.covered;
  g.asked_covered += r.covered;
  if (!r.problem.empty()) g.problem = r.problem;
  if (!g.spec || r.sums.empty()) return;
  const uint32_t e = g.spec->geometry().experts;
  if (r.experts != e || !unpack_sums(r.sums, r.value_bytes, scratch) ||
      !add_common_layers(r.layer_mask, scratch, g.layers, e, g.asked_acc))
    g.problem = "a shard's counts have another geometry";
}

sign_result finish_gather(const shard_gather& g) {
  sign_result out;
  out.spec = g.spec;
  out.covered = g.covered;
  out.problem = g.problem;
  if (g.spec && g.covered > 0) {
    signature_builder b(g.spec);
    if (b.add_masked(g.acc).ok() && b.add_masked(g.asked_acc).ok()) b.finish(out.sig);
  }
  return out;
}

shard_parts plan_parts(const hash_ring& ring, size_t replication,
                       const std::vector<uint64_t>& blocks, std::optional<uint32_t> local,
                       const std::vector<std::string>& excluded_names) {
  // Names, not ring indices: the ring may change between a request and its fail-over.
  std::vector<uint32_t> excluded;
  for (const auto& n : excluded_names)
    if (auto i = ring.index_of(n)) excluded.push_back(*i);
  std::vector<std::vector<uint32_t>> owners;
  owners.reserve(blocks.size());
  for (uint64_t h : blocks)
    owners.push_back(ring.owners(h, replication));
  const auto chosen = choose_signers(owners, local, excluded);
  shard_parts out;
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i] == no_signer)
      ++out.lost;
    else
      out.parts[chosen[i]].push_back(blocks[i]);
  }
  return out;
}

stores store_plan(const hash_ring& ring, size_t replication, const route_request& req,
                  const hash_ring* also) {
  stores out;
  if (!req.counts) return out;
  // `also`'s members as `ring`'s indices (a member `ring` lacks gets no stores).
  std::vector<std::optional<uint32_t>> also_index;
  if (also)
    for (const auto& name : also->members())
      also_index.push_back(ring.index_of(name));
  std::vector<uint32_t> owners;
  // The cached prefix, by hash: a client lists its counts in prompt order (then block i of the
  // counts is block i of the prompt, the common case), but nothing obliges it to.
  const size_t cached = std::min<size_t>(req.cached_blocks.value_or(0), req.block_hashes.size());
  std::unordered_set<uint64_t> cached_set;
  const auto& blocks = req.counts->blocks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const counts_block& b = blocks[i];
    if (cached > 0) {
      bool hit = false;
      if (i < req.block_hashes.size() && req.block_hashes[i] == b.hash) {
        hit = i < cached;
      } else {
        if (cached_set.empty())
          cached_set.insert(req.block_hashes.begin(), req.block_hashes.begin() + cached);
        hit = cached_set.contains(b.hash);
      }
      if (hit) {
        ++out.skipped;
        continue;
      }
    }
    owners = ring.owners(b.hash, replication);
    if (also)
      for (uint32_t a : also->owners(b.hash, replication))
        if (also_index[a] &&
            std::find(owners.begin(), owners.end(), *also_index[a]) == owners.end())
          owners.push_back(*also_index[a]);
    for (uint32_t o : owners)
      out.by_owner[o].push_back(&b);
  }
  return out;
}

}  // namespace eldr::router
