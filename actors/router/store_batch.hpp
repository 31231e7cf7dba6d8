// store_batch: the replica stores a clustered router sends to other nodes, batched. Each request's
// carried counts go to the R owners of each block (shard_gather.hpp's store_plan); sent at once
// that is about one message per request to each other node. Batched, it is one message per
// owner, model and geometry every cluster.store_batch_ms (or sooner, at max_blocks), whatever the
// request rate (issue 14: at most 0.05 cross-node messages per decision on the hot path).
//
// What the batching must not change: a router that asks an owner for blocks one of its waiting
// stores holds sends that owner's batch first, so its own stores still reach the shard before its
// lookups (CAF delivers one sender's messages to one receiver in order). What it does change:
// another router's lookup may reach the owner up to store_batch_ms before the store, and then
// misses those blocks (the reply's coverage says so). docs/cluster.md measures it.
//
// Plain class: the router actor adds, takes and sends.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cluster/wire/counts_message.hpp"

namespace eldr::router {

class store_batcher {
 public:
  explicit store_batcher(size_t max_blocks = 4096) : max_blocks_(max_blocks) {}

  // One message's worth: blocks of one model and geometry for one owner (a node name).
  struct batch {
    std::string owner;
    std::string model;
    counts_message counts;
  };

  // Queues copies of `blocks` for `owner`. True when the owner's batches now hold max_blocks or
  // more: take(owner) and send them now.
  bool add(const std::string& owner, const std::string& model, const model_geometry& geometry,
           std::span<const counts_block* const> blocks);

  // The batches waiting for `owner` (every model), removed.
  std::vector<batch> take(const std::string& owner);
  // True when a batch waiting for `owner` holds one of `blocks` (then a lookup of them at that
  // owner must follow the batch; otherwise it need not wait for it).
  bool holds_any(const std::string& owner, std::span<const uint64_t> blocks) const;
  // Every waiting batch, removed.
  std::vector<batch> take_all();

  bool empty() const { return by_owner_.empty(); }
  size_t pending_blocks() const { return pending_; }

 private:
  struct owner_batches {
    std::vector<batch> batches;
    size_t blocks = 0;
    std::unordered_set<uint64_t> hashes;  // of every block waiting
  };
  size_t max_blocks_;
  size_t pending_ = 0;
  std::map<std::string, owner_batches> by_owner_;
};

}  // namespace eldr::router
