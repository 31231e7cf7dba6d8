// routing: the shared validation, the five baseline policies, the locality band, and the factory.
#include "core/routing.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

namespace eldr {
namespace {

constexpr uint32_t no_worker = std::numeric_limits<uint32_t>::max();

// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified here, so a seed gives the
// same decisions on every standard library (std:: distributions are implementation-defined).
class seeded_rng {
 public:
  explicit seeded_rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n), n >= 1, without modulo bias: draws from the top partial range are redrawn.
  uint32_t below(uint32_t n) {
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    const uint64_t limit = max - max % n;
    uint64_t r = next();
    while (r >= limit)
      r = next();
    return static_cast<uint32_t>(r % n);
  }

 private:
  uint64_t state_;
};

bool eligible_at(const route_input& in, uint32_t worker) {
  return in.eligible.empty() || in.eligible[worker] != 0;
}

// The worker that is the j-th eligible one (0-based) in ascending order.
uint32_t nth_eligible(const route_input& in, uint32_t j) {
  if (in.eligible.empty()) return j;
  for (uint32_t w = 0; w < in.eligible.size(); ++w)
    if (in.eligible[w] != 0 && j-- == 0) return w;
  return no_worker;  // unreachable for j < eligible count
}

struct least_loaded_result {
  uint32_t worker = no_worker;
  uint32_t candidates = 0;  // eligible workers in the range
};

// JSQ over the eligible workers in [first, first + count): the least loaded, ties to the lowest
// index (the scan is ascending and only a strictly smaller load replaces the pick).
least_loaded_result least_loaded(const route_input& in, uint32_t first, uint32_t count) {
  least_loaded_result r;
  for (uint32_t w = first; w < first + count; ++w) {
    if (!eligible_at(in, w)) continue;
    ++r.candidates;
    if (r.worker == no_worker || in.load[w] < in.load[r.worker]) r.worker = w;
  }
  return r;
}

void trace_eligible_range(const route_input& in, uint32_t first, uint32_t count,
                          route_trace* trace) {
  trace->score.clear();
  trace->candidates.clear();
  trace->threshold = 0.0f;
  trace->widened = false;
  trace->load_limit = 0;
  for (uint32_t w = first; w < first + count; ++w)
    if (eligible_at(in, w)) trace->candidates.push_back(w);
}

void trace_single(uint32_t worker, route_trace* trace) {
  trace->score.clear();
  trace->candidates.assign(1, worker);
  trace->threshold = 0.0f;
  trace->widened = false;
  trace->load_limit = 0;
}

route_decision plain_decision(uint32_t worker, uint32_t band_size) {
  route_decision d;
  d.worker = worker;
  d.band_size = band_size;
  return d;
}

// ---- the band policies' common steps (inline: they run once per decision) ----------------------

struct top_two {
  uint32_t best = no_worker;
  uint32_t second = no_worker;
};

// The two highest scores among the workers `admitted` accepts; the ascending scan with a strict
// '>' keeps the lower index on ties.
template <class Admitted>
top_two top_two_scores(std::span<const float> s, uint32_t workers, Admitted admitted) {
  top_two t;
  for (uint32_t w = 0; w < workers; ++w) {
    if (!admitted(w)) continue;
    if (t.best == no_worker || s[w] > s[t.best]) {
      t.second = t.best;
      t.best = w;
    } else if (t.second == no_worker || s[w] > s[t.second]) {
      t.second = w;
    }
  }
  return t;
}

// The band's trace: the scores and the candidates, the widened pair or the admitted workers at or
// above the threshold.
template <class Admitted>
void trace_band(std::span<const float> s, const top_two& top, float threshold, bool widened,
                uint32_t load_limit, Admitted admitted, route_trace* trace) {
  trace->score.assign(s.begin(), s.end());
  trace->candidates.clear();
  trace->threshold = threshold;
  trace->widened = widened;
  trace->load_limit = load_limit;
  if (widened) {
    trace->candidates.push_back(std::min(top.best, top.second));
    trace->candidates.push_back(std::max(top.best, top.second));
  } else {
    for (uint32_t w = 0; w < static_cast<uint32_t>(s.size()); ++w)
      if (admitted(w) && s[w] >= threshold) trace->candidates.push_back(w);
  }
}

route_decision band_decision(uint32_t chosen, uint32_t band, std::span<const float> s,
                             uint32_t best, uint64_t epoch) {
  route_decision d;
  d.worker = chosen;
  d.band_size = band;
  d.best_score = s[best];
  d.worker_score = s[chosen];
  d.epoch = epoch;
  return d;
}

// ---- the baselines ----------------------------------------------------------------------------

// Cycles through the workers, skipping ineligible ones; the cursor moves past each pick.
class round_robin_policy final : public routing_policy {
 public:
  explicit round_robin_policy(uint32_t workers) : routing_policy(workers) {}
  std::string_view name() const override { return "rr"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t, route_trace* trace) override {
    uint32_t chosen = no_worker;
    for (uint32_t step = 0; step < workers() && chosen == no_worker; ++step) {
      const uint32_t w = (cursor_ + step) % workers();
      if (eligible_at(in, w)) chosen = w;
    }
    cursor_ = (chosen + 1) % workers();
    if (trace != nullptr) trace_single(chosen, trace);
    return plain_decision(chosen, 1);
  }

 private:
  uint32_t cursor_ = 0;
};

// Uniform over the eligible workers.
class random_policy final : public routing_policy {
 public:
  random_policy(uint32_t workers, uint64_t seed) : routing_policy(workers), rng_(seed) {}
  std::string_view name() const override { return "random"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t eligible_count,
                              route_trace* trace) override {
    const uint32_t chosen = nth_eligible(in, rng_.below(eligible_count));
    if (trace != nullptr) trace_single(chosen, trace);
    return plain_decision(chosen, 1);
  }

 private:
  seeded_rng rng_;
};

// Join-shortest-queue over the eligible workers.
class jsq_policy final : public routing_policy {
 public:
  explicit jsq_policy(uint32_t workers) : routing_policy(workers) {}
  std::string_view name() const override { return "jsq"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t, route_trace* trace) override {
    const least_loaded_result r = least_loaded(in, 0, workers());
    if (trace != nullptr) trace_eligible_range(in, 0, workers(), trace);
    return plain_decision(r.worker, r.candidates);
  }
};

// Power of two choices: two distinct eligible workers drawn uniformly, the less loaded wins, ties
// to the lower index. With one eligible worker there is nothing to compare.
class p2c_policy final : public routing_policy {
 public:
  p2c_policy(uint32_t workers, uint64_t seed) : routing_policy(workers), rng_(seed) {}
  std::string_view name() const override { return "p2c"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t eligible_count,
                              route_trace* trace) override {
    if (eligible_count == 1) {
      const uint32_t only = nth_eligible(in, 0);
      if (trace != nullptr) trace_single(only, trace);
      return plain_decision(only, 1);
    }
    // Draw the second from the m - 1 remaining positions, so the pair is distinct without retries.
    const uint32_t a = rng_.below(eligible_count);
    uint32_t b = rng_.below(eligible_count - 1);
    if (b >= a) ++b;
    const uint32_t lo = nth_eligible(in, std::min(a, b));
    const uint32_t hi = nth_eligible(in, std::max(a, b));
    const uint32_t chosen = in.load[hi] < in.load[lo] ? hi : lo;
    if (trace != nullptr) {
      trace_single(lo, trace);
      trace->candidates.push_back(hi);
    }
    return plain_decision(chosen, 2);
  }

 private:
  seeded_rng rng_;
};

// The paper's oracle: JSQ inside the pool of the request's known domain. Unknown label (-1): JSQ
// over every eligible worker. A pool with no eligible worker left (all drained) falls back to JSQ
// over every eligible worker, so the baseline keeps serving as the router itself would.
class domain_policy final : public routing_policy {
 public:
  domain_policy(uint32_t workers, std::vector<worker_range> pools)
      : routing_policy(workers), pools_(std::move(pools)) {}
  std::string_view name() const override { return "domain"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t, route_trace* trace) override {
    if (in.label < -1 || in.label >= static_cast<int64_t>(pools_.size()))
      return status::invalid_argument("unknown domain label " + std::to_string(in.label) +
                                      " (the domain policy knows 0.." +
                                      std::to_string(pools_.size() - 1) + ", and -1 = unknown)");
    worker_range range{0, workers()};
    least_loaded_result r;
    if (in.label >= 0) {
      range = pools_[static_cast<std::size_t>(in.label)];
      r = least_loaded(in, range.first, range.count);
    }
    if (r.worker == no_worker) {
      range = {0, workers()};
      r = least_loaded(in, range.first, range.count);
    }
    if (trace != nullptr) trace_eligible_range(in, range.first, range.count, trace);
    return plain_decision(r.worker, r.candidates);
  }

 private:
  std::vector<worker_range> pools_;
};

}  // namespace

// ---- the shared entry point -------------------------------------------------------------------

routing_policy::~routing_policy() = default;

result<route_decision> routing_policy::route(const route_input& in, route_trace* trace) {
  if (in.load.size() != workers_)
    return status::invalid_argument(
        "load vector has " + std::to_string(in.load.size()) +
        " entries, expected one per decode worker (K = " + std::to_string(workers_) + ")");
  uint32_t eligible_count = workers_;
  if (!in.eligible.empty()) {
    if (in.eligible.size() != workers_)
      return status::invalid_argument(
          "eligibility mask has " + std::to_string(in.eligible.size()) +
          " entries, expected 0 (all eligible) or K = " + std::to_string(workers_));
    eligible_count = 0;
    for (uint8_t e : in.eligible)
      eligible_count += e != 0 ? 1u : 0u;
  }
  if (eligible_count == 0)
    return status::failed_precondition("no eligible decode worker: all " +
                                       std::to_string(workers_) + " are drained or timed out");
  return pick(in, eligible_count, trace);
}

// ---- the centroid machinery ---------------------------------------------------------------

centroid_policy::centroid_policy(std::shared_ptr<const centroid_set> centroids, float tau,
                                 bool widen_single)
    : routing_policy(centroids->k()),
      tau_(tau),
      widen_single_(widen_single),
      centroids_(std::move(centroids)),
      scores_(workers(), 0.0f) {}

status centroid_policy::check(std::string_view policy, const centroid_set* centroids, float tau) {
  if (centroids == nullptr)
    return status::invalid_argument(std::string(policy) + " policy: no centroid set given");
  if (!std::isfinite(tau) || tau < 0.0f)
    return status::invalid_argument(
        std::string(policy) + " policy: tau must be finite and >= 0, got " + std::to_string(tau));
  return {};
}

status centroid_policy::install(std::shared_ptr<const centroid_set> next) {
  if (next == nullptr)
    return status::invalid_argument(std::string(name()) + " policy: cannot install a null set");
  if (next->k() != workers())
    return status::invalid_argument(std::string(name()) + " policy: new centroid set (epoch " +
                                    std::to_string(next->epoch()) +
                                    ") has K = " + std::to_string(next->k()) +
                                    ", the policy routes over K = " + std::to_string(workers()));
  centroids_ = std::move(next);
  return {};
}

result<const centroid_set*> centroid_policy::score(const route_input& in) {
  const centroid_set& set = *centroids_;
  const std::span<float> s(scores_);

  // A default (width 0) empty signature means "none": all-zero scores. Anything else goes through
  // score(), which checks its width and structure.
  if (in.sig == nullptr || (in.sig->empty() && in.sig->width == 0)) {
    std::fill(s.begin(), s.end(), 0.0f);
  } else {
    status scored = set.score(*in.sig, s);
    if (!scored.ok()) return scored;
  }
  return &set;
}

// ---- the locality band ------------------------------------------------------------------------

result<std::unique_ptr<locality_band_policy>> locality_band_policy::make(
    std::shared_ptr<const centroid_set> centroids, float tau, bool widen_single) {
  if (status s = check("eldr", centroids.get(), tau); !s.ok()) return s;
  return std::unique_ptr<locality_band_policy>(
      new locality_band_policy(std::move(centroids), tau, widen_single));
}

result<route_decision> locality_band_policy::pick(const route_input& in, uint32_t,
                                                  route_trace* trace) {
  auto scored = score(in);
  if (!scored.ok()) return scored.error();
  const centroid_set& set = **scored;
  const std::span<float> s = scores();
  const float half_width = tau();

  auto eligible = [&](uint32_t w) { return eligible_at(in, w); };
  const top_two top = top_two_scores(s, workers(), eligible);
  const uint32_t best = top.best;
  const uint32_t second = top.second;

  const float threshold = s[best] - half_width;
  uint32_t chosen = no_worker;
  uint32_t band = 0;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (!eligible_at(in, w) || s[w] < threshold) continue;
    ++band;
    if (chosen == no_worker || in.load[w] < in.load[chosen]) chosen = w;
  }
  // band >= 1: best itself passes. A band of one is best alone.
  const bool widen = widen_single() && half_width > 0.0f && band == 1 && second != no_worker;
  if (widen) {
    band = 2;
    const uint32_t lo = std::min(best, second);
    const uint32_t hi = std::max(best, second);
    chosen = in.load[hi] < in.load[lo] ? hi : lo;
  }

  if (trace != nullptr) trace_band(s, top, threshold, widen, 0, eligible, trace);
  return band_decision(chosen, band, s, best, set.epoch());
}

// ---- the adaptive band ------------------------------------------------------------------------

result<std::unique_ptr<adaptive_band_policy>> adaptive_band_policy::make(
    std::shared_ptr<const centroid_set> centroids, float tau, bool widen_single, float load_slack,
    uint32_t group_min_load) {
  if (status s = check("eldr-adaptive", centroids.get(), tau); !s.ok()) return s;
  if (!std::isfinite(load_slack) || load_slack < 0.0f)
    return status::invalid_argument(
        "eldr-adaptive policy: load_slack must be finite and >= 0, got " +
        std::to_string(load_slack));
  return std::unique_ptr<adaptive_band_policy>(new adaptive_band_policy(
      std::move(centroids), tau, widen_single, load_slack, group_min_load));
}

result<route_decision> adaptive_band_policy::pick(const route_input& in, uint32_t,
                                                  route_trace* trace) {
  auto scored = score(in);
  if (!scored.ok()) return scored.error();
  const centroid_set& set = **scored;
  const std::span<float> s = scores();
  const float half_width = tau();

  // The load-admissible workers: at most floor(load_slack * m) above the lightest load m, and none
  // above it while m < group_min_load: one request more on a batch of one or two is a large share
  // of its step, which the p99 pays where locality is weak (docs/evaluation.md, "Where grouping
  // starts"). The product is taken in double and capped, so a huge slack admits every worker,
  // never wraps.
  uint32_t lightest = std::numeric_limits<uint32_t>::max();
  for (uint32_t w = 0; w < workers(); ++w)
    if (eligible_at(in, w)) lightest = std::min(lightest, in.load[w]);
  const double allowance =
      lightest < group_min_load_
          ? 0.0
          : std::floor(static_cast<double>(load_slack_) * static_cast<double>(lightest));
  const uint32_t limit = static_cast<uint32_t>(
      std::min(static_cast<double>(std::numeric_limits<uint32_t>::max()), lightest + allowance));
  auto admissible = [&](uint32_t w) { return eligible_at(in, w) && in.load[w] <= limit; };

  const top_two top = top_two_scores(s, workers(), admissible);
  const uint32_t best = top.best;
  const uint32_t second = top.second;

  // The least-loaded band member; on equal loads the one this policy routed to least recently
  // (its newest request is the oldest, so it is the closest to finishing: what round-robin gets
  // right and JSQ's lowest-index rule gets wrong), then the better match, then the lower index.
  auto better = [&](uint32_t a, uint32_t b) {  // is a a better pick than b?
    if (in.load[a] != in.load[b]) return in.load[a] < in.load[b];
    if (last_routed_[a] != last_routed_[b]) return last_routed_[a] < last_routed_[b];
    if (s[a] != s[b]) return s[a] > s[b];
    return a < b;
  };
  // Without slack (allowance 0: light load, or load_slack 0) there is no load to spend on
  // locality: every admissible worker is in the band and the pick is the balancer's.
  const bool grouping = allowance >= 1.0;
  const float threshold = grouping ? s[best] - half_width : -std::numeric_limits<float>::infinity();
  uint32_t chosen = no_worker;
  uint32_t band = 0;
  for (uint32_t w = 0; w < workers(); ++w) {
    if (!admissible(w) || s[w] < threshold) continue;
    ++band;
    if (chosen == no_worker || better(w, chosen)) chosen = w;
  }
  const bool widen = widen_single() && half_width > 0.0f && band == 1 && second != no_worker;
  if (widen) {
    band = 2;
    chosen = better(second, best) ? second : best;
  }

  if (trace != nullptr) trace_band(s, top, threshold, widen, limit, admissible, trace);
  last_routed_[chosen] = ++decisions_;
  return band_decision(chosen, band, s, best, set.epoch());
}

// ---- pools, names, factory --------------------------------------------------------------------

result<std::vector<worker_range>> split_into_pools(uint32_t workers,
                                                   std::span<const uint64_t> counts) {
  if (workers == 0) return status::invalid_argument("domain pools: K must be >= 1, got 0");
  if (counts.empty())
    return status::invalid_argument("domain pools: no domains (calibration counts are empty)");
  uint64_t total = 0;
  for (uint64_t c : counts) {
    if (c >= (uint64_t{1} << 32) || (total += c) >= (uint64_t{1} << 32))
      return status::invalid_argument("domain pools: calibration counts must sum to < 2^32");
  }
  if (total == 0) return status::invalid_argument("domain pools: calibration counts are all zero");

  const std::size_t domains = counts.size();
  std::vector<worker_range> pools(domains);
  if (workers < domains) {
    // Not enough workers for disjoint pools: each domain gets the worker at the middle of its
    // share of [0, K), so large domains still spread over different workers.
    uint64_t before = 0;
    for (std::size_t d = 0; d < domains; ++d) {
      const double middle = (static_cast<double>(before) + 0.5 * static_cast<double>(counts[d])) /
                            static_cast<double>(total);
      pools[d] = {std::min(workers - 1, static_cast<uint32_t>(middle * workers)), 1};
      before += counts[d];
    }
    return pools;
  }

  // Largest remainder (Hamilton): exact integer quotas, since K * c < 2^64.
  std::vector<uint64_t> remainder(domains);
  uint32_t assigned = 0;
  for (std::size_t d = 0; d < domains; ++d) {
    const uint64_t scaled = static_cast<uint64_t>(workers) * counts[d];
    pools[d].count = static_cast<uint32_t>(scaled / total);
    remainder[d] = scaled % total;
    assigned += pools[d].count;
  }
  std::vector<std::size_t> order(domains);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  for (std::size_t i = 0; assigned < workers; ++i, ++assigned)
    ++pools[order[i]].count;
  // Every domain gets at least one worker, taken from the currently largest pool (lowest index on
  // ties). One exists with >= 2 workers while some pool is empty, because K >= #domains.
  for (std::size_t d = 0; d < domains; ++d) {
    if (pools[d].count > 0) continue;
    std::size_t donor = 0;
    for (std::size_t e = 1; e < domains; ++e)
      if (pools[e].count > pools[donor].count) donor = e;
    --pools[donor].count;
    pools[d].count = 1;
  }
  uint32_t first = 0;
  for (worker_range& p : pools) {
    p.first = first;
    first += p.count;
  }
  return pools;
}

std::span<const std::string_view> policy_names() {
  static constexpr std::array<std::string_view, 7> names = {
      "rr", "random", "jsq", "p2c", "domain", "eldr", "eldr-adaptive"};
  return names;
}

bool needs_centroids(std::string_view name) {
  return name == "eldr" || name == "eldr-adaptive";
}

result<std::unique_ptr<routing_policy>> make_policy(std::string_view name,
                                                    const policy_config& config) {
  if (needs_centroids(name)) {
    if (config.centroids == nullptr)
      return status::invalid_argument(std::string(name) + " policy: no centroid set given");
    if (config.workers != 0 && config.workers != config.centroids->k())
      return status::invalid_argument(
          std::string(name) + " policy: workers = " + std::to_string(config.workers) +
          " but the centroid set has K = " + std::to_string(config.centroids->k()));
    if (name == "eldr") {
      auto made = locality_band_policy::make(config.centroids, config.tau, config.widen_single);
      if (!made.ok()) return made.error();
      return std::unique_ptr<routing_policy>(std::move(made).value());
    }
    auto made = adaptive_band_policy::make(config.centroids, config.tau, config.widen_single,
                                           config.load_slack, config.group_min_load);
    if (!made.ok()) return made.error();
    return std::unique_ptr<routing_policy>(std::move(made).value());
  }

  const bool known =
      std::find(policy_names().begin(), policy_names().end(), name) != policy_names().end();
  if (!known) {
    std::string valid;
    for (std::string_view n : policy_names())
      valid += (valid.empty() ? "" : ", ") + std::string(n);
    return status::invalid_argument("unknown routing policy \"" + std::string(name) +
                                    "\"; valid: " + valid);
  }
  if (config.workers == 0)
    return status::invalid_argument(std::string(name) + " policy: workers (K) must be >= 1");

  if (name == "rr") return std::unique_ptr<routing_policy>(new round_robin_policy(config.workers));
  if (name == "random")
    return std::unique_ptr<routing_policy>(new random_policy(config.workers, config.seed));
  if (name == "jsq") return std::unique_ptr<routing_policy>(new jsq_policy(config.workers));
  if (name == "p2c")
    return std::unique_ptr<routing_policy>(new p2c_policy(config.workers, config.seed));
  // "domain"
  auto pools = split_into_pools(config.workers, config.domain_counts);
  if (!pools.ok()) return pools.error();
  return std::unique_ptr<routing_policy>(
      new domain_policy(config.workers, std::move(pools).value()));
}

}  // namespace eldr
