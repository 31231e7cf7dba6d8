// memory_caches: the signature cache's two byte-bounded LRUs in front of RocksDB: the encoded
// counts of single blocks, and remembered prefix sums. The prefix sums also serve a clustered
// router, which keeps the shards' answers with them (actors/router/shard_sum_cache.hpp).
//
// Both are keyed by a block hash and evict the least recently used entry once their byte bound
// would be exceeded; an entry larger than the bound is not kept. Neither knows RocksDB or the
// block table: the signature cache erases an entry when its block goes.
//
// Pointers returned by find() stay valid until the next put(), erase() or clear() on the same
// cache (sum_prefix relies on it: it sums through views into counts_lru before it puts).
//
// Thread safety: none (the cache's owner thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace eldr {

// A list of block hashes folded in order: equal lists give equal values; two different lists of
// the same last hash and length (a shard asked for different subsets of one prompt) collide by
// accident with probability ~2^-64. Not keyed: no defence against lists chosen to collide (a
// client can send any list ending in any hash anyway).
inline uint64_t list_fingerprint(uint64_t acc, uint64_t hash) {
  uint64_t x = (acc ^ hash) + 0x9e3779b97f4a7c15ULL;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Block hashes are low bits of SHA-256 in practice, but they come from the network: mix them so
// that chosen hashes cannot pile into one bucket.
struct hash_mix {
  size_t operator()(uint64_t x) const {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<size_t>(x);
  }
};

// LRU of encoded (validated) counts: front = most recent. Bounded by the bytes of the encodings,
// plus entry_overhead bytes an entry when the owner counts the bookkeeping too.
class counts_lru {
 public:
  explicit counts_lru(size_t capacity_bytes, size_t entry_overhead = 0)
      : capacity_(capacity_bytes), overhead_(entry_overhead) {}

  // The block's bytes, made most recent; nullptr when not held.
  const std::string* find(uint64_t h) {
    auto it = entries_.find(h);
    if (it == entries_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.pos);
    return &it->second.bytes;
  }

  void erase(uint64_t h) {
    auto it = entries_.find(h);
    if (it == entries_.end()) return;
    bytes_ -= it->second.bytes.size() + overhead_;
    order_.erase(it->second.pos);
    entries_.erase(it);
  }

  void put(uint64_t h, std::string bytes) {
    erase(h);
    const size_t cost = bytes.size() + overhead_;
    if (cost > capacity_) return;
    while (bytes_ + cost > capacity_ && !order_.empty()) {
      const uint64_t victim = order_.back();
      erase(victim);
    }
    order_.push_front(h);
    bytes_ += cost;
    entries_.emplace(h, entry{std::move(bytes), order_.begin()});
  }

  void clear() {
    entries_.clear();
    order_.clear();
    bytes_ = 0;
  }

  size_t size() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct entry {
    std::string bytes;
    std::list<uint64_t>::iterator pos;
  };
  size_t capacity_;
  size_t overhead_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, entry, hash_mix> entries_;
  size_t bytes_ = 0;
};

// Remembered prefix sums (masked, dense), keyed by the prefix's last block hash: the chained
// hash fixes the prefix's content, so its sum never changes. Byte-bounded LRU; an entry goes
// with its block. A cluster shard is asked for subsets of prompts, and which subset depends on
// the router asking (core/membership/shard_plan.hpp): an entry also keeps the fingerprint of the
// exact list it sums, and serves only that list.
class prefix_memo {
 public:
  explicit prefix_memo(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The sum of the `blocks` hashes ending in h whose list_fingerprint is `fingerprint`, made most
  // recent; nullptr when no such sum is remembered.
  const std::vector<uint32_t>* find(uint64_t h, size_t blocks, uint64_t fingerprint) {
    auto it = entries_.find(h);
    if (it == entries_.end() || it->second.blocks != blocks ||
        it->second.fingerprint != fingerprint)
      return nullptr;
    order_.splice(order_.begin(), order_, it->second.pos);
    return &it->second.sum;
  }

  void erase(uint64_t h) {
    auto it = entries_.find(h);
    if (it == entries_.end()) return;
    bytes_ -= cost(it->second);
    order_.erase(it->second.pos);
    entries_.erase(it);
  }

  // Remembers the sum of `length` blocks ending in h, unless a sum ending in h is remembered.
  void put(uint64_t h, const std::vector<uint32_t>& sum, size_t length, uint64_t fingerprint) {
    if (entries_.count(h)) return;
    const size_t c = sum.size() * 4 + 64;
    if (c > capacity_) return;
    while (bytes_ + c > capacity_ && !order_.empty())
      erase(order_.back());
    order_.push_front(h);
    entries_.emplace(h, entry{sum, length, fingerprint, order_.begin()});
    bytes_ += c;
  }

  void clear() {
    entries_.clear();
    order_.clear();
    bytes_ = 0;
  }

  size_t size() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct entry {
    std::vector<uint32_t> sum;
    size_t blocks = 0;
    uint64_t fingerprint = 0;  // list_fingerprint of the `blocks` hashes summed
    std::list<uint64_t>::iterator pos;
  };
  static size_t cost(const entry& e) { return e.sum.size() * 4 + 64; }

  size_t capacity_;
  std::unordered_map<uint64_t, entry, hash_mix> entries_;
  std::list<uint64_t> order_;
  size_t bytes_ = 0;
};

}  // namespace eldr
