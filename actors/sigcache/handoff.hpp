// handoff: the blocks that move when the ring of signature-cache nodes changes -- a block's counts
// in the hand-off's byte form, and the blocks a node receives (take_over); which blocks go where
// is handoff_planner.hpp, the sending side's messages sigcache_cluster.cpp. Plain code over the
// cache: no actor system, so unit tests drive it.
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
// counted in taken_over and handoff_refused. Returns the number stored.
uint64_t take_over(model_cache& mc, const model_geometry& g,
                   const std::vector<handoff_block>& blocks);

// A block's masked counts (signature_cache::masked_counts) in the hand-off's byte form; nullopt
// when a count does not fit a byte (a corrupt store: the block is not handed).
std::optional<std::vector<uint8_t>> handoff_bytes(const std::vector<uint32_t>& masked);

}  // namespace eldr::sigcache
