// handoff: the blocks a node receives when the ring of signature-cache nodes changes and it owns
// blocks another node held (the sending side, which needs the actor, is hand_off in
// sigcache_cluster.cpp). Plain functions over the cache: no actor system, so unit tests can drive
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/sigcache/sigcache_state.hpp"

namespace eldr::sigcache {

// Stores all-layer counts given densely (layer-major, L * E entries) as block_counts.
status put_dense_counts(signature_cache& cache, block_hash hash, std::optional<block_hash> parent,
                        const model_geometry& g, const std::vector<uint32_t>& dense);

// Stores the blocks a node handed to this one (geometry `g`) that `mc` holds no counts for yet;
// counted in taken_over and handoff_refused.
void take_over(model_cache& mc, const model_geometry& g, const std::vector<handoff_block>& blocks);

}  // namespace eldr::sigcache
