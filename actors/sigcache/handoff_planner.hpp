// handoff_planner: which of this node's blocks go to which signature-cache nodes after the ring
// changed, one batch at a time (the sending side of a hand-off, docs/cluster.md "Signature
// cache"; the actor's messages are in sigcache_cluster.cpp). Plain code over the rings: no actor
// system, no store.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/membership/hash_ring.hpp"
#include "storage/signature_cache.hpp"

namespace eldr::sigcache {

// Which of one model's blocks go where after the ring changed from `base` to `next`: each block to
// the owners it has on `next` and did not have on `base` (nullopt: every owner but this node is
// new), among `receivers` (the other live signature-cache nodes), in batches of at most
// `batch_blocks` blocks. Owners on `base` hold every block (it is the ring of the last hand-off
// that finished), so nothing is missed; a block a receiver has already is ignored there.
class handoff_planner {
 public:
  using held_block = std::pair<block_hash, std::optional<block_hash>>;  // (hash, parent)
  struct batch {
    std::string to;
    std::vector<held_block> blocks;
  };

  handoff_planner(std::optional<hash_ring> base, hash_ring next, size_t replication, std::string me,
                  std::set<std::string> receivers, std::vector<held_block> held,
                  size_t batch_blocks);

  // Scans up to `scan` more held blocks and returns the first batch that fills; once every block
  // is scanned, the partly filled ones, one per call. nullopt: `scan` blocks were scanned and no
  // batch filled (call again: the caller yields between calls), or done().
  std::optional<batch> next(size_t scan);
  bool done() const;
  size_t scanned() const { return pos_; }

 private:
  std::optional<hash_ring> base_;
  hash_ring next_;
  size_t replication_;
  std::string me_;
  std::set<std::string> receivers_;
  std::vector<held_block> held_;
  size_t batch_blocks_;
  size_t pos_ = 0;
  std::map<std::string, std::vector<held_block>> filling_;
};

}  // namespace eldr::sigcache
