// spec_keyed_cache: what a router's two memories of masked counts share (shard_sum_cache.hpp,
// the shards' sums by block list; seen_blocks.hpp, single blocks' counts). Both hold values over
// one signature spec's layer mask, so both are emptied when another spec object is installed (a
// set with other layers, transform or IDF; the router keeps the object when only the centroids
// change); both are byte-bounded LRUs of storage/memory_caches.hpp, off at budget 0; both count
// their hits and misses for `status`. Plain class template; on the router's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "actors/messages.hpp"

namespace eldr::router {

template <class Store>
class spec_keyed_cache {
 public:
  size_t entries() const { return store_.size(); }
  size_t bytes() const { return store_.bytes(); }
  size_t budget_bytes() const { return budget_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 protected:
  spec_keyed_cache(size_t budget_bytes, Store store)
      : budget_(budget_bytes), store_(std::move(store)) {}

  // Makes `spec` the one the values are under, emptying the store when it is another object.
  void follow(const spec_ptr& spec) {
    if (spec == spec_) return;
    store_.clear();
    spec_ = spec;
  }

  size_t budget_ = 0;
  Store store_;
  uint64_t hits_ = 0, misses_ = 0;

 private:
  spec_ptr spec_;
};

}  // namespace eldr::router
