// shard_gather: a route request signed across the signature-cache shards of a cluster. The
// counts the request carries are summed where they are; the blocks without counts (prefix hits)
// are planned among their owners (core/membership/shard_plan.hpp: this node's own shard first, then
// as few other nodes as possible), each owner's partial sum over the spec's layers is merged, and
// the signature is built once every part has answered. The carried counts are also stored at their
// R owners (store_plan). Plain data and functions: the router actor only sends the parts and feeds
// the answers back (router_actor.cpp); unit tests drive the plan and the merge without it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/messages.hpp"
#include "actors/router/router_state.hpp"
#include "actors/router/seen_blocks.hpp"
#include "core/membership/hash_ring.hpp"

namespace eldr::router {

// What the shards of one request have answered so far.
struct shard_gather {
  route_job_ptr job;
  spec_ptr spec;                 // the spec when the shards were asked (null: coverage only)
  std::vector<uint32_t> layers;  // spec's layer mask: what shards are asked to sum (empty: none)
  uint32_t model = 0;
  int attempt = 0;
  size_t pending = 0;
  uint32_t covered = 0;
  std::vector<uint32_t> acc;  // spec->width(): the masked sum over the carried blocks
  // The blocks without counts, asked of the shards (prompt order), and what the shards answered
  // for them: how many they covered and the masked sum (spec->width()), which the router keeps
  // in its shard_sum_cache when it covers every asked block.
  std::vector<uint64_t> asked;
  uint32_t asked_covered = 0;
  std::vector<uint32_t> asked_acc;
  // asked_acc came from the router's shard_sum_cache (so it is not kept a second time).
  bool from_kept_sums = false;
  std::string problem;
};
using shard_gather_ptr = std::shared_ptr<shard_gather>;

// Starts the gather of `job` for model `m`: the blocks whose counts the request carries (when
// `counts_usable`) are summed now; the others, in prompt order, go to `asked`.
shard_gather_ptr start_gather(const model_state& m, route_job_ptr job, int attempt,
                              bool counts_usable);

// Sums the asked blocks that `seen` keeps under the gather's spec into the carried sum (covered,
// no shard asked for them) and leaves only the others in `asked`. Returns how many it summed.
size_t sum_seen(shard_gather& g, seen_blocks& seen);

// Keeps every block whose counts the request carries in `seen`, for later prefix hits on them;
// none when the request says how many blocks its prefill served from cache (cached_blocks: a
// client that sends every block's counts, whose later hits carry them too).
void keep_carried(const shard_gather& g, seen_blocks& seen);

// True when the shards' answers cover every asked block with no problem: their sum can be kept.
bool gather_complete(const shard_gather& g);

// Adds a shard's sum (over the requested layers its store keeps) to the asked blocks' sum (over
// the spec's mask); a layer the store lacks adds nothing. `scratch`: the unpacked sum.
void merge_shard(shard_gather& g, const shard_sign_reply& r, std::vector<uint32_t>& scratch);

// The signature (and coverage) once every part has answered: the carried and the asked sums.
sign_result finish_gather(const shard_gather& g);

// Who sums `blocks` among their R owners on `ring`, never a member in `excluded`: the blocks of
// each chosen owner (ring member index) in prompt order, and how many blocks have no owner left.
struct shard_parts {
  std::map<uint32_t, std::vector<uint64_t>> parts;
  size_t lost = 0;
};
shard_parts plan_parts(const hash_ring& ring, size_t replication,
                       const std::vector<uint64_t>& blocks, std::optional<uint32_t> local,
                       const std::vector<std::string>& excluded);

// The carried blocks each of their R owners stores (ring member index -> blocks, prompt order):
// every block of the request's counts but those among its first cached_blocks block hashes,
// which the prefill served from its prefix cache and so were stored when they were computed.
// `skipped` counts the carried blocks left out so. With `also` (the ring before a node joined,
// still read while the newcomer is handed its blocks), each block goes to its owners on `also`
// too, once each, as `ring`'s member indices.
struct stores {
  std::map<uint32_t, std::vector<const counts_block*>> by_owner;
  size_t skipped = 0;
};
stores store_plan(const hash_ring& ring, size_t replication, const route_request& req,
                  const hash_ring* also = nullptr);

}  // namespace eldr::router
