// bounded_lru: a map with a hard size bound, least-recently-used eviction and a time to live.
//
// The router remembers per-request facts that clients can make arbitrarily many of: the routing
// decision for a request id (so that a retried route returns the same worker) and which finished
// events were already applied (so each is applied once). Whatever ids clients send, a bounded_lru
// holds at most `capacity` entries; an entry older than the TTL is treated as absent, so a stale
// fact is never acted on even if the cache is not full.
//
// Recency and age are distinct on purpose. get() refreshes recency (a key in use is the last to
// be evicted) but not age: an entry's age counts from its last put(), so a remembered decision
// expires ttl_ms after it was made however often it is read. put() of an existing key replaces
// the value and refreshes both.
//
// Time is injected as now_ms (any monotonic millisecond clock the owner chooses); an entry whose
// age is exactly ttl_ms is still live. Keys are stored once. With std::string keys, get, contains
// and erase also accept std::string_view or const char* without building a std::string.
//
// Thread safety: none; one owner. Pointers returned by get() are valid until the next non-const
// call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/base/status.hpp"

namespace eldr {

// Totals since construction, for the metrics exporter.
struct lru_counters {
  uint64_t evicted = 0;  // live entries dropped to make room (capacity reached)
  uint64_t expired = 0;  // entries dropped because older than the TTL (on get, put or expire)
};

// Hashes every string-like type the same way, so std::string-keyed maps can be probed with a
// std::string_view or a literal.
struct transparent_string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

namespace detail {
template <class Key>
struct lru_default_hash {
  using type = std::hash<Key>;
};
template <>
struct lru_default_hash<std::string> {
  using type = transparent_string_hash;
};
}  // namespace detail

template <class Key, class Value, class Hash = typename detail::lru_default_hash<Key>::type,
          class KeyEqual = std::equal_to<>>
class bounded_lru {
 public:
  // Errors (invalid_argument): capacity == 0 or above max_capacity; ttl_ms < 1.
  static constexpr std::size_t max_capacity = std::size_t{1} << 24;
  static result<bounded_lru> make(std::size_t capacity, int64_t ttl_ms) {
    if (capacity == 0) return status::invalid_argument("bounded_lru: capacity must be >= 1");
    if (capacity > max_capacity)
      return status::invalid_argument("bounded_lru: capacity must be <= 2^24");
    if (ttl_ms < 1) return status::invalid_argument("bounded_lru: ttl_ms must be >= 1");
    return bounded_lru(capacity, ttl_ms);
  }

  bounded_lru(bounded_lru&&) = default;
  bounded_lru& operator=(bounded_lru&&) = default;
  bounded_lru(const bounded_lru&) = delete;  // the recency list points at this map's keys
  bounded_lru& operator=(const bounded_lru&) = delete;

  std::size_t capacity() const { return capacity_; }
  int64_t ttl_ms() const { return ttl_ms_; }
  // Entries held, expired ones included until they are noticed (<= capacity).
  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const lru_counters& counters() const { return counters_; }

  // Inserts key -> value, or replaces the value of an existing key; either way the entry becomes
  // the most recently used and its age restarts at now_ms. When a new key finds the cache full,
  // the least recently used entry is dropped first (counted as expired if it was, else evicted).
  void put(const Key& key, Value value, int64_t now_ms) {
    if (auto it = entries_.find(key); it != entries_.end()) {
      it->second.value = std::move(value);
      it->second.written_ms = now_ms;
      touch(it->second);
      return;
    }
    // Expired entries at the cold end go first, two per new key at most: with age and recency
    // roughly in step (a decision is rarely read again), the cache then holds about the keys of
    // the last TTL instead of filling up to capacity with dead ones -- and no put pays for a
    // sweep.
    for (int i = 0; i < 2 && !recency_.empty(); ++i) {
      auto oldest = entries_.find(*recency_.back());
      if (!is_expired(oldest->second, now_ms)) break;
      ++counters_.expired;
      remove(oldest);
    }
    if (entries_.size() >= capacity_) {
      auto victim = entries_.find(*recency_.back());
      if (is_expired(victim->second, now_ms)) {
        ++counters_.expired;
      } else {
        ++counters_.evicted;
      }
      remove(victim);
    }
    auto [it, inserted] = entries_.try_emplace(key, std::move(value), now_ms);
    recency_.push_front(&it->first);
    it->second.position = recency_.begin();
  }

  // The live value for key, which becomes the most recently used (its age is unchanged); nullptr
  // when absent. An expired entry is removed (counted) and reported absent.
  template <class K>
  const Value* get(const K& key, int64_t now_ms) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    if (is_expired(it->second, now_ms)) {
      ++counters_.expired;
      remove(it);
      return nullptr;
    }
    touch(it->second);
    return &it->second.value;
  }

  // get(key, now_ms) != nullptr, with the same effects.
  template <class K>
  bool contains(const K& key, int64_t now_ms) {
    return get(key, now_ms) != nullptr;
  }

  // Drops key; false when it was not held. Not counted as evicted or expired.
  template <class K>
  bool erase(const K& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    remove(it);
    return true;
  }

  // Drops every entry older than the TTL at now_ms (counted as expired). get and put drop the
  // expired entries they meet; this lets the owner shrink memory from a timer while idle. O(size):
  // recency order is not age order, since get refreshes the one but not the other.
  void expire(int64_t now_ms) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (is_expired(it->second, now_ms)) {
        ++counters_.expired;
        recency_.erase(it->second.position);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Drops every entry (not counted). Counters are kept.
  void clear() {
    entries_.clear();
    recency_.clear();
  }

 private:
  using recency_list = std::list<const Key*>;  // most recent first; points at entries_' keys
  struct entry {
    entry(Value v, int64_t written) : value(std::move(v)), written_ms(written) {}
    Value value;
    int64_t written_ms;
    typename recency_list::iterator position;
  };
  using map_type = std::unordered_map<Key, entry, Hash, KeyEqual>;

  bounded_lru(std::size_t capacity, int64_t ttl_ms) : capacity_(capacity), ttl_ms_(ttl_ms) {
    // Buckets for the whole capacity up front: growing rehashes every entry inside one put(), a
    // pause of milliseconds at a few hundred thousand entries, taken on the owner's hot path (the
    // router's, for every decision). 8 bytes a bucket; make() bounds capacity.
    entries_.reserve(capacity_);
  }

  // Age strictly above the TTL; an older now_ms than the write (a clock that stepped back) is live.
  bool is_expired(const entry& e, int64_t now_ms) const {
    if (now_ms <= e.written_ms) return false;
    // now_ms - written_ms can overflow int64 only for absurd clocks; compare in uint64.
    return static_cast<uint64_t>(now_ms) - static_cast<uint64_t>(e.written_ms) >
           static_cast<uint64_t>(ttl_ms_);
  }

  void touch(entry& e) { recency_.splice(recency_.begin(), recency_, e.position); }

  void remove(typename map_type::iterator it) {
    recency_.erase(it->second.position);
    entries_.erase(it);
  }

  std::size_t capacity_;
  int64_t ttl_ms_;
  lru_counters counters_;
  // Keys live in the map's nodes, which never move while the node lives (rehashing and moving the
  // map keep them), so the recency list can point at them.
  map_type entries_;
  recency_list recency_;
};

}  // namespace eldr
