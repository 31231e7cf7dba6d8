// metrics: a small Prometheus metrics registry -- counters, gauges, histograms and callback gauges,
// declared once and exported in the text exposition format 0.0.4 by the node's /metrics page.
//
// A metric is a family (name, help, type) plus one child per set of constant labels, e.g.
// eldr_route_decisions_total{model="qwen",worker="3"}. Registration looks the child up (or makes
// it) under the registry's mutex and returns a pointer that stays valid for the registry's life,
// so the hot path keeps the pointer and increments it with one relaxed atomic operation: no lock,
// no lookup, no allocation.
//
// Thread safety: every method of every class here may be called from any thread at any time.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// Constant labels of one child, as (name, value) pairs in any order: the same set in another order
// is the same child. Names follow [a-zA-Z_][a-zA-Z0-9_]*, must not start with "__" (reserved by
// Prometheus), must be distinct, and "le" is refused on histograms (it names their buckets).
using metric_labels = std::vector<std::pair<std::string, std::string>>;

// For registrations whose names, help and labels are fixed in the caller's source (label values
// are escaped by the registry, so any value is fine): an error is a bug the tests catch, asserted
// in debug builds.
template <class T>
T* must_register(result<T*> r) {
  assert(r.ok());
  return r.ok() ? *r : nullptr;
}
inline void must_register(const status& s) {
  assert(s.ok());
  (void)s;
}

// A monotonic count (requests routed, messages dropped). Starts at 0.
class counter_metric {
 public:
  void inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  // For a count kept by another component (a store's write errors, a publisher's messages) and
  // copied here on its owner's tick: moves the counter up to `total`, never down, so the exported
  // series stays monotonic whatever the order of two copies.
  void advance_to(uint64_t total) {
    uint64_t v = value_.load(std::memory_order_relaxed);
    while (v < total && !value_.compare_exchange_weak(v, total, std::memory_order_relaxed)) {
    }
  }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (in-flight requests, current epoch). Starts at 0. Doubles hold
// every integer up to 2^53 exactly, which covers any count this process can reach.
class gauge_metric {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  void sub(double d) { value_.fetch_add(-d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A distribution over fixed buckets (latencies, band sizes). observe(v) counts v in the first
// bucket whose upper bound is >= v (Prometheus "le"), or in the implicit +Inf bucket.
// A render running concurrently with observe() may see the sum of an observation before its bucket
// (or the reverse); _count is derived from the buckets so that it always equals the +Inf bucket.
class histogram_metric {
 public:
  // Bounds must be strictly increasing and finite (validated by the registry).
  explicit histogram_metric(std::vector<double> upper_bounds);

  // Lock-free: a binary search over the bounds and two relaxed atomic adds. NaN is counted in +Inf
  // only (and poisons the sum, as in every Prometheus client).
  void observe(double v);

  std::span<const double> upper_bounds() const { return bounds_; }
  // Non-cumulative count of bucket i; i == upper_bounds().size() is the +Inf bucket.
  uint64_t bucket_count(std::size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
  uint64_t count() const;  // sum over every bucket
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0.0};
};

enum class metric_type : uint8_t { counter, gauge, histogram };

class metric_registry {
 public:
  metric_registry() = default;
  metric_registry(const metric_registry&) = delete;
  metric_registry& operator=(const metric_registry&) = delete;

  // Each returns the child of family `name` with exactly `labels`, creating the family and the
  // child on first use; the same name and labels always return the same object, valid until the
  // registry is destroyed.
  // Errors (invalid_argument): name not matching [a-zA-Z_:][a-zA-Z0-9_:]*; a bad label name (see
  // metric_labels) or a duplicate one; the name already registered with another type or another
  // help text; for histograms, bounds empty, not strictly increasing or not finite, or different
  // from the family's first registration.
  result<counter_metric*> counter(std::string_view name, std::string_view help,
                                  const metric_labels& labels = {});
  result<gauge_metric*> gauge(std::string_view name, std::string_view help,
                              const metric_labels& labels = {});
  result<histogram_metric*> histogram(std::string_view name, std::string_view help,
                                      std::vector<double> upper_bounds,
                                      const metric_labels& labels = {});

  // A gauge whose value is owned elsewhere (a cache's size): `read` is called at every render,
  // under the registry's mutex, so it must be thread-safe, quick, and must not call back into this
  // registry. Registering the same name and labels again replaces the function. Errors: as gauge()
  // (a callback gauge and a plain gauge may share a family), plus read being empty.
  status callback_gauge(std::string_view name, std::string_view help, const metric_labels& labels,
                        std::function<double()> read);
  // A counter whose count is owned elsewhere (a socket thread's atomics), read as callback_gauge
  // reads. The owner must remove() it before the count goes away. Errors: as counter(), plus read
  // being empty or the labels being a plain counter.
  status callback_counter(std::string_view name, std::string_view help, const metric_labels& labels,
                          std::function<double()> read);

  // Declares a counter or gauge family without a child, so that its HELP and TYPE are on the page
  // before its first series (e.g. drops per cause before the first drop). Errors: as counter() or
  // gauge(); a histogram (it needs bounds: register a child instead).
  status declare(std::string_view name, std::string_view help, metric_type type);

  // Removes the child of family `name` with exactly `labels` (any order); the family stays, with
  // its HELP and TYPE. For series whose subject is gone (a forgotten publisher), so that they do
  // not grow without bound. The pointer registration returned for the child dangles from here on:
  // only its sole user may remove it. Returns whether the child existed.
  bool remove(std::string_view name, const metric_labels& labels);

  // The value of a counter child now (a callback counter's read), 0 when it was never registered (a
  // count of no event so far). For readers that show the same count elsewhere (the status JSON);
  // takes the mutex, so not for the hot path.
  uint64_t counter_value(std::string_view name, const metric_labels& labels) const;

  // Every family in name order, children in label order, in the Prometheus text exposition format
  // 0.0.4 (Content-Type: text/plain; version=0.0.4): "# HELP" and "# TYPE" once per family, label
  // values escaped (\\, \", \n), histograms as cumulative _bucket{le=...} lines ending with +Inf,
  // then _sum and _count. Numbers in the shortest form that reads back exactly; +Inf, -Inf, NaN.
  std::string render() const;

 private:
  using kind = metric_type;
  // Labels sorted by name: the child's identity and its rendering order.
  using label_key = std::vector<std::pair<std::string, std::string>>;
  static label_key key_of(const metric_labels& labels);
  struct child {
    std::unique_ptr<counter_metric> c;
    std::unique_ptr<gauge_metric> g;
    std::unique_ptr<histogram_metric> h;
    std::function<double()> read;  // callback gauge or counter
  };
  struct family {
    kind type = kind::counter;
    std::string help;
    std::vector<double> bounds;  // histograms
    std::map<label_key, child> children;
  };

  // Validates and finds or creates the family. Caller holds mutex_.
  result<family*> find_or_add_family(std::string_view name, std::string_view help, kind type,
                                     const std::vector<double>* bounds);
  status add_callback(std::string_view name, std::string_view help, kind type,
                      const metric_labels& labels, std::function<double()> read);
  // Validates and finds or creates the child; the caller fills it if new. Caller holds mutex_.
  result<child*> find_or_add(std::string_view name, std::string_view help, kind type,
                             const metric_labels& labels, const std::vector<double>* bounds);

  mutable std::mutex mutex_;
  std::map<std::string, family, std::less<>> families_;
};

// Whether `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool valid_metric_name(std::string_view name);
// Whether `name` is a valid label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__".
bool valid_label_name(std::string_view name);
// A number as the exposition format writes it: shortest round-trip form, "+Inf", "-Inf", "NaN".
std::string format_metric_value(double v);

}  // namespace eldr
