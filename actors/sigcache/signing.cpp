// signing: see signing.hpp.
#include "actors/sigcache/signing.hpp"

#include <memory>
#include <utility>

#include "cluster/wire/counts_message.hpp"
#include "core/membership/shard_plan.hpp"

namespace eldr::sigcache {

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
// Which of its blocks a shard is asked for depends on the router asking
// (core/membership/shard_plan.hpp): the cache's remembered prefix sums serve only the exact list
// they summed.
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

}  // namespace eldr::sigcache
