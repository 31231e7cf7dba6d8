// signing: the signature cache's answers to route requests, over one model's cache. This node's
// router asks for a whole signature (sign) or, in a cluster, each shard for its part (shard_sign);
// the counts a request carries are stored first. Plain functions over model_cache: no actor
// system, so unit tests can drive them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/messages.hpp"
#include "actors/sigcache/sigcache_state.hpp"

namespace eldr::sigcache {

// Stores the counts the request carries, then sums the counts of its blocks under the job's spec
// (coverage only when the spec's geometry is not the cache's).
sign_result_ptr sign(model_cache& mc, const sign_job& job);

// Stores the counts a shard request carries; returns why some were refused ("" when none).
std::string store_counts(model_cache& mc, const std::vector<uint8_t>& bytes);

// Stores the counts of this node's router's request (by pointer); returns why some were refused
// ("" when none).
std::string store_local_counts(model_cache& mc, const shard_job& job);

// A shard's part of a signature over `blocks` and the requested `layers`; `problem` is the
// reply's problem so far.
shard_sign_reply sum_shard_part(model_cache& mc, std::span<const uint64_t> blocks,
                                const std::vector<uint32_t>& layers, std::string problem);

// A remote router's request: counts arrive encoded.
shard_sign_reply shard_sign(model_cache& mc, const shard_sign_request& req);

// This node's router: counts are the request's own, by pointer.
shard_sign_reply shard_sign(model_cache& mc, const shard_job& job);

}  // namespace eldr::sigcache
