// sigcache_actor: hosts the signature cache of every model of the node (storage/signature_cache,
// one RocksDB database per model) and its ingest of vLLM KV events and counts messages.
//
// It runs on the scheduler's threads like the router, because a route request visits it twice
// per decision and a hop to a thread of its own costs a wake-up each way (measured: p99 at 5,000
// req/s fell from ~50 ms to ~5 ms without them). What blocks for long -- RocksDB writes -- is
// off its path: the caches commit through their background writer (signature_cache_options::
// background_writes); what remains are point reads of counts the memory LRU has dropped.
//
// It signs route requests for the router: stores the counts the request carries (the blocks its
// prefill computed), then sums the counts of all its blocks -- prefix hits come from the cache --
// into a signature under the router's spec. Ingested events and stored counts are group-committed
// every commit_interval_ms, and the centroid history (epochs) lives in the same databases.
#pragma once

#include <caf/all.hpp>
#include <memory>
#include <vector>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"
#include "storage/signature_cache.hpp"

namespace eldr {

// Opens the cache of every configured model under <data_dir>/models/<name, %XX-escaped outside
// [A-Za-z0-9_-]>. Errors name the model and RocksDB's reason.
result<std::vector<std::unique_ptr<signature_cache>>> open_model_caches(const node_config& config);

// The stored current centroid set of one cache, if any (warm restart).
result<std::optional<centroid_file>> stored_current_set(signature_cache& cache,
                                                        const std::string& model);

// `detached`: on a thread of its own instead of the scheduler's (the node passes false, see
// above).
caf::actor spawn_sigcache(caf::actor_system& sys, node_context_ptr ctx,
                          std::vector<std::unique_ptr<signature_cache>> caches,
                          bool detached = true);

}  // namespace eldr
