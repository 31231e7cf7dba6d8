// bounded_lru: least-recently-used eviction, TTL expiry by injected time (get refreshes recency,
// not age; put refreshes both), the hard size bound whatever keys arrive, heterogeneous
// std::string lookups without allocation, counters, and moves.
#include "core/base/bounded_lru.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

#include "tests/support/allocation_counter.hpp"  // once per test binary

namespace eldr {
namespace {

using string_lru = bounded_lru<std::string, int>;

template <class Key, class Value>
bounded_lru<Key, Value> make_or_die(std::size_t capacity, int64_t ttl_ms) {
  auto c = bounded_lru<Key, Value>::make(capacity, ttl_ms);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return std::move(c).value();
}

constexpr int64_t long_ttl = 1'000'000;

TEST(BoundedLru, MakeRejectsBadParameters) {
  EXPECT_EQ(string_lru::make(0, 10).error().code(), status_code::invalid_argument);
  EXPECT_EQ(string_lru::make(4, 0).error().code(), status_code::invalid_argument);
  EXPECT_EQ(string_lru::make(4, -5).error().code(), status_code::invalid_argument);
  EXPECT_EQ(string_lru::make(string_lru::max_capacity + 1, 10).error().code(),
            status_code::invalid_argument);
  auto ok = string_lru::make(4, 10);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->capacity(), 4u);
  EXPECT_EQ(ok->ttl_ms(), 10);
  EXPECT_TRUE(ok->empty());
}

TEST(BoundedLru, EvictsInLeastRecentlyUsedOrder) {
  auto c = make_or_die<std::string, int>(3, long_ttl);
  c.put("a", 1, 0);
  c.put("b", 2, 1);
  c.put("c", 3, 2);
  c.put("d", 4, 3);  // a is the oldest untouched
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.get("a", 4), nullptr);
  c.put("e", 5, 5);  // then b
  EXPECT_EQ(c.get("b", 6), nullptr);
  ASSERT_NE(c.get("c", 7), nullptr);
  EXPECT_EQ(*c.get("c", 7), 3);
  EXPECT_EQ(*c.get("d", 7), 4);
  EXPECT_EQ(*c.get("e", 7), 5);
  EXPECT_EQ(c.counters().evicted, 2u);
  EXPECT_EQ(c.counters().expired, 0u);
}

// get refreshes recency: the entry read last survives the next eviction.
TEST(BoundedLru, GetRefreshesRecency) {
  auto c = make_or_die<std::string, int>(3, long_ttl);
  c.put("a", 1, 0);
  c.put("b", 2, 0);
  c.put("c", 3, 0);
  ASSERT_NE(c.get("a", 1), nullptr);  // order now, oldest first: b, c, a
  c.put("d", 4, 2);
  EXPECT_EQ(c.get("b", 3), nullptr);
  EXPECT_NE(c.get("a", 3), nullptr);
  // A miss changes nothing.
  EXPECT_EQ(c.get("zz", 3), nullptr);
  EXPECT_EQ(c.size(), 3u);
}

// put of an existing key replaces its value and makes it most recent, without growing.
TEST(BoundedLru, PutReplacesAndRefreshes) {
  auto c = make_or_die<std::string, int>(3, long_ttl);
  c.put("a", 1, 0);
  c.put("b", 2, 0);
  c.put("c", 3, 0);
  c.put("a", 10, 1);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.counters().evicted, 0u);
  c.put("d", 4, 2);  // b is now the least recent
  EXPECT_EQ(c.get("b", 3), nullptr);
  ASSERT_NE(c.get("a", 3), nullptr);
  EXPECT_EQ(*c.get("a", 3), 10);
}

TEST(BoundedLru, ExpiresAfterTtl) {
  auto c = make_or_die<std::string, int>(8, 100);
  c.put("a", 1, 1000);
  ASSERT_NE(c.get("a", 1100), nullptr) << "an age of exactly the TTL is still live";
  EXPECT_EQ(c.get("a", 1101), nullptr);
  EXPECT_EQ(c.size(), 0u) << "the expired entry is removed, not just hidden";
  EXPECT_EQ(c.counters().expired, 1u);
  EXPECT_EQ(c.get("a", 1102), nullptr);
  EXPECT_EQ(c.counters().expired, 1u) << "counted once";
}

// Age counts from the last put: reads do not keep a decision alive, rewrites do.
TEST(BoundedLru, GetDoesNotExtendTtlButPutDoes) {
  auto c = make_or_die<std::string, int>(8, 100);
  c.put("read", 1, 0);
  c.put("rewritten", 2, 0);
  ASSERT_NE(c.get("read", 90), nullptr);
  c.put("rewritten", 3, 90);
  EXPECT_EQ(c.get("read", 150), nullptr);
  ASSERT_NE(c.get("rewritten", 150), nullptr);
  EXPECT_EQ(*c.get("rewritten", 150), 3);
  EXPECT_EQ(c.get("rewritten", 191), nullptr);
}

// A clock that steps back does not expire anything.
TEST(BoundedLru, EarlierNowIsNotExpiry) {
  auto c = make_or_die<std::string, int>(2, 10);
  c.put("a", 1, 500);
  EXPECT_NE(c.get("a", 0), nullptr);
  EXPECT_NE(c.get("a", -1'000'000), nullptr);
}

// When the least recent entry has already expired, making room for a new key counts an expiry,
// not an eviction.
TEST(BoundedLru, ExpiredVictimCountsAsExpired) {
  auto c = make_or_die<std::string, int>(2, 100);
  c.put("old", 1, 0);
  c.put("new", 2, 150);
  c.put("newer", 3, 160);  // "old" is the victim, and is 160 ms old
  EXPECT_EQ(c.counters().expired, 1u);
  EXPECT_EQ(c.counters().evicted, 0u);
  c.put("newest", 4, 170);  // "new" is live: evicted
  EXPECT_EQ(c.counters().evicted, 1u);
  EXPECT_EQ(c.size(), 2u);
}

// A steady stream of new keys (the router's decisions) keeps only about a TTL's worth: each put
// first drops expired entries at the cold end, so dead ones do not pile up to the capacity.
TEST(BoundedLru, PutsDropExpiredEntriesAtTheColdEnd) {
  auto c = make_or_die<std::string, int>(100000, 100);
  for (int t = 0; t < 5000; ++t) {
    c.put("request-" + std::to_string(t), t, t);
    ASSERT_LE(c.size(), 102u) << t;  // written in [t - 100, t], and at most one step behind
  }
  EXPECT_EQ(c.counters().evicted, 0u);
  EXPECT_GE(c.counters().expired, 5000u - 102u);
  EXPECT_NE(c.get("request-4999", 5000), nullptr);
  EXPECT_NE(c.get("request-4900", 5000), nullptr);  // exactly the TTL old: still live
  EXPECT_EQ(c.get("request-4898", 5000), nullptr);
}

// expire() sweeps every expired entry whatever its recency.
TEST(BoundedLru, ExpireSweepsRegardlessOfRecency) {
  auto c = make_or_die<std::string, int>(8, 100);
  c.put("early", 1, 0);
  c.put("late", 2, 80);
  c.put("earliest", 3, -10);
  ASSERT_NE(c.get("early", 90), nullptr);  // most recent now, but still written at 0
  c.expire(150);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.counters().expired, 2u);
  EXPECT_NE(c.get("late", 150), nullptr);
  EXPECT_EQ(c.get("early", 150), nullptr);
  // The recency list stayed consistent: filling up evicts in order.
  for (int i = 0; i < 8; ++i)
    c.put("k" + std::to_string(i), i, 151);
  EXPECT_EQ(c.size(), 8u);
  EXPECT_EQ(c.get("late", 152), nullptr);
  EXPECT_EQ(c.counters().evicted, 1u);
}

TEST(BoundedLru, EraseAndClear) {
  auto c = make_or_die<std::string, int>(4, long_ttl);
  c.put("a", 1, 0);
  c.put("b", 2, 0);
  EXPECT_TRUE(c.erase("a"));
  EXPECT_FALSE(c.erase("a"));
  EXPECT_EQ(c.get("a", 1), nullptr);
  EXPECT_EQ(c.size(), 1u);
  c.clear();
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.counters().evicted, 0u);
  EXPECT_EQ(c.counters().expired, 0u);
  c.put("a", 5, 2);  // usable after clear
  EXPECT_EQ(*c.get("a", 3), 5);
}

// Whatever keys arrive, the cache never holds more than its capacity.
TEST(BoundedLru, SizeIsBoundedWhateverKeysArrive) {
  auto c = make_or_die<std::string, int>(16, long_ttl);
  for (int i = 0; i < 10000; ++i) {
    c.put("request-" + std::to_string(i), i, i);
    ASSERT_LE(c.size(), 16u);
  }
  EXPECT_EQ(c.size(), 16u);
  EXPECT_EQ(c.counters().evicted, 10000u - 16u);
  EXPECT_NE(c.get("request-9999", 10000), nullptr);
  EXPECT_EQ(c.get("request-9983", 10000), nullptr);
  EXPECT_NE(c.get("request-9984", 10000), nullptr);
}

// std::string keys are found from a std::string_view or a literal without building a string.
TEST(BoundedLru, HeterogeneousStringLookupDoesNotAllocate) {
  auto c = make_or_die<std::string, int>(4, long_ttl);
  const std::string id(100, 'x');  // far beyond any small-string buffer
  c.put(id, 7, 0);
  const std::string_view view = id;
  const uint64_t before = allocations.load();
  const int* hit = c.get(view, 1);
  const bool has = c.contains("not-there-but-a-rather-long-literal-key-string", 1);
  const bool erased = c.erase(std::string_view("also-absent-and-long-enough-to-need-the-heap"));
  const uint64_t after = allocations.load();
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, 7);
  EXPECT_FALSE(has);
  EXPECT_FALSE(erased);
  EXPECT_EQ(after, before);
  EXPECT_TRUE(c.erase(view));
}

// The intended use: a retried route returns the decision made the first time; a finished event is
// applied once.
TEST(BoundedLru, RemembersRoutingDecisionsAndAppliedEvents) {
  struct decision {
    uint32_t worker;
    uint64_t epoch;
  };
  auto routes = make_or_die<std::string, decision>(1024, 60'000);
  routes.put("req-1", {3, 17}, 0);
  const decision* retried = routes.get(std::string_view("req-1"), 2'000);
  ASSERT_NE(retried, nullptr);
  EXPECT_EQ(retried->worker, 3u);
  EXPECT_EQ(retried->epoch, 17u);

  auto applied = make_or_die<std::string, bool>(1024, 60'000);
  int applications = 0;
  for (int delivery = 0; delivery < 3; ++delivery) {
    if (applied.contains("req-1", 5'000 + delivery)) continue;
    applied.put("req-1", true, 5'000 + delivery);
    ++applications;
  }
  EXPECT_EQ(applications, 1);
}

TEST(BoundedLru, IntegerKeys) {
  auto c = make_or_die<uint64_t, std::string>(2, long_ttl);
  c.put(1, "one", 0);
  c.put(2, "two", 0);
  c.put(3, "three", 0);
  EXPECT_EQ(c.get(uint64_t{1}, 1), nullptr);
  ASSERT_NE(c.get(uint64_t{3}, 1), nullptr);
  EXPECT_EQ(*c.get(uint64_t{3}, 1), "three");
}

// Moving the cache keeps its recency list valid (it points into the map's nodes, which move with
// it).
TEST(BoundedLru, MovedCacheKeepsWorking) {
  auto first = make_or_die<std::string, int>(2, long_ttl);
  first.put("a", 1, 0);
  first.put("b", 2, 0);
  string_lru second = std::move(first);
  ASSERT_NE(second.get("a", 1), nullptr);  // b is now least recent
  second.put("c", 3, 2);
  EXPECT_EQ(second.get("b", 3), nullptr);
  EXPECT_EQ(*second.get("a", 3), 1);
  EXPECT_EQ(*second.get("c", 3), 3);
  EXPECT_TRUE(second.erase("a"));
  EXPECT_EQ(second.size(), 1u);
}

}  // namespace
}  // namespace eldr
