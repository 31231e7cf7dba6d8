// refit: the reservoir sample, the argmax view of a centroid set on a sample, the distinct-expert
// score, the validation checks and the fit of a candidate.
#include "core/refit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <thread>
#include <utility>

#include "core/base/parallel.hpp"
#include "core/base/resident_buffer.hpp"

namespace eldr {
namespace {

constexpr uint64_t max_sample_floats = uint64_t{1} << 30;

// splitmix64 finaliser: derives independent per-worker seeds from one seed.
uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t resolve_threads(uint32_t threads) {
  if (threads != 0) return std::min<uint32_t>(threads, 16);
  return std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 16);
}

status check_points(std::span<const float> points, uint32_t width, const char* who) {
  if (width == 0) return status::invalid_argument(std::string(who) + ": width is 0");
  if (points.size() % width != 0)
    return status::invalid_argument(std::string(who) + ": " + std::to_string(points.size()) +
                                    " floats are not a whole number of rows of width " +
                                    std::to_string(width));
  for (std::size_t i = 0; i < points.size(); ++i)
    if (!std::isfinite(points[i]))
      return status::invalid_argument(std::string(who) + ": point " + std::to_string(i / width) +
                                      " has a non-finite coordinate");
  return {};
}

status check_options(const refit_validation_options& o) {
  if (!(o.max_balance_ratio >= 1.0) || !std::isfinite(o.max_balance_ratio))
    return status::invalid_argument("refit: max_balance_ratio must be finite and >= 1");
  if (o.batch_size == 0) return status::invalid_argument("refit: batch_size must be >= 1");
  if (!(o.score_tolerance >= 0.0) || !std::isfinite(o.score_tolerance))
    return status::invalid_argument("refit: score_tolerance must be finite and >= 0");
  return {};
}

// Check a) on raw rows: "" when every row is finite and nonzero, else the reason.
std::string row_problem(std::span<const float> rows, uint32_t k, uint32_t width) {
  for (uint32_t r = 0; r < k; ++r) {
    double squared = 0.0;
    for (uint32_t d = 0; d < width; ++d) {
      const float x = rows[static_cast<std::size_t>(r) * width + d];
      if (!std::isfinite(x))
        return "non-finite centroid: worker " + std::to_string(r) + " has a NaN or Inf coordinate";
      squared += static_cast<double>(x) * x;
    }
    if (squared == 0.0) return "zero centroid: worker " + std::to_string(r) + " has no direction";
  }
  return {};
}

// Every point's best-scoring centroid (ties to the lower index) and the mean best score.
struct argmax_view {
  std::vector<uint32_t> cluster_of;
  std::vector<uint32_t> sizes;
  double objective = 0.0;
};

// Precondition: points checked (finite, whole rows of set.width()).
argmax_view assign_argmax(const centroid_set& set, std::span<const float> points,
                          uint32_t threads) {
  const uint32_t k = set.k();
  const uint32_t width = set.width();
  const std::size_t n = points.size() / width;
  argmax_view out;
  out.cluster_of.assign(n, 0);
  out.sizes.assign(k, 0);
  std::vector<float> best(n, 0.0f);
  parallel_slices(resolve_threads(threads), n, [&](std::size_t begin, std::size_t end) {
    std::vector<float> scores(k);
    for (std::size_t i = begin; i < end; ++i) {
      // Sizes match and the row is finite, so score_dense cannot fail.
      (void)set.score_dense(points.subspan(i * width, width), scores);
      uint32_t arg = 0;
      for (uint32_t c = 1; c < k; ++c)
        if (scores[c] > scores[arg]) arg = c;
      out.cluster_of[i] = arg;
      best[i] = scores[arg];
    }
  });
  double total = 0.0;  // accumulated in point order: independent of the thread count
  for (std::size_t i = 0; i < n; ++i) {
    ++out.sizes[out.cluster_of[i]];
    total += best[i];
  }
  out.objective = n > 0 ? total / static_cast<double>(n) : 0.0;
  return out;
}

// The distinct-expert score of an assignment (see predicted_distinct_experts).
double distinct_score(const argmax_view& a, std::span<const float> points, uint32_t width,
                      uint32_t k, const refit_validation_options& o) {
  std::vector<std::vector<uint32_t>> members(k);
  for (std::size_t i = 0; i < a.cluster_of.size(); ++i)
    members[a.cluster_of[i]].push_back(static_cast<uint32_t>(i));
  // stamp[d] == current batch id <=> dimension d already counted in this batch.
  std::vector<uint64_t> stamp(width, 0);
  uint64_t batch_id = 0;
  uint64_t total = 0;
  uint64_t batches = 0;
  const std::size_t b = o.batch_size;
  for (uint32_t w = 0; w < k; ++w) {
    std::vector<uint32_t>& m = members[w];
    if (m.empty()) continue;
    rng_engine rng(mix_seed(o.seed, w));
    for (std::size_t i = m.size() - 1; i > 0; --i)  // Fisher-Yates
      std::swap(m[i], m[uniform_index(rng, i + 1)]);
    const std::size_t count = (m.size() + b - 1) / b;
    const std::size_t size = std::min(b, m.size());
    for (std::size_t j = 0; j < count; ++j) {
      ++batch_id;
      for (std::size_t t = 0; t < size; ++t) {
        const float* row =
            points.data() + static_cast<std::size_t>(m[(j * b + t) % m.size()]) * width;
        for (uint32_t d = 0; d < width; ++d) {
          if (row[d] != 0.0f && stamp[d] != batch_id) {
            stamp[d] = batch_id;
            ++total;
          }
        }
      }
      ++batches;
    }
  }
  return batches > 0 ? static_cast<double>(total) / static_cast<double>(batches) : 0.0;
}

// The degenerate-cluster threshold after defaulting: max(1, N / (10 K)) unless set.
uint32_t min_cluster_points(uint64_t n, uint32_t k, const refit_validation_options& o) {
  if (o.min_cluster_points != 0) return o.min_cluster_points;
  return static_cast<uint32_t>(std::max<uint64_t>(1, n / (uint64_t{k} * 10)));
}

// "" when N points can fill K clusters of at least min_points each, else the rejection reason.
std::string too_small(uint64_t n, uint32_t k, uint32_t min_points) {
  if (n != 0 && n >= uint64_t{k} * min_points) return {};
  return "sample too small: " + std::to_string(n) + " points for " + std::to_string(k) +
         " workers (need >= " + std::to_string(uint64_t{k} * min_points) + ")";
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

// ---- signature_sample ---------------------------------------------------------------------------

result<signature_sample> signature_sample::make(uint32_t capacity, uint32_t width, uint64_t seed,
                                                uint64_t horizon) {
  if (capacity == 0) return status::invalid_argument("signature sample: capacity is 0");
  if (horizon < capacity)
    return status::invalid_argument("signature sample: horizon " + std::to_string(horizon) +
                                    " is below the capacity " + std::to_string(capacity));
  if (width == 0) return status::invalid_argument("signature sample: width is 0");
  if (uint64_t{capacity} * width > max_sample_floats)
    return status::out_of_range("signature sample: " + std::to_string(capacity) + " rows of " +
                                std::to_string(width) + " floats exceed 2^30 floats");
  return signature_sample(capacity, width, seed, horizon);
}

signature_sample::signature_sample(uint32_t capacity, uint32_t width, uint64_t seed,
                                   uint64_t horizon)
    : capacity_(capacity), width_(width), horizon_(horizon), rng_(seed) {
  // The whole reservoir up front, resident: growing it copies every held row, and with thousands
  // of rows of thousands of floats that is a pause of milliseconds in the router's first minutes;
  // faulting its pages in as rows are kept cost each of the first few thousand decisions ~0.1 ms
  // (core/base/resident_buffer.hpp).
  make_resident(points_, std::size_t{capacity_} * width_);
}

// The squared norm of a non-empty signature of the sample's width; errors: indices not strictly
// increasing or >= width, a NaN/Inf value, entries all zero.
result<double> signature_sample::squared_norm(const signature& s) const {
  double squared = 0.0;
  for (std::size_t i = 0; i < s.index.size(); ++i) {
    if (s.index[i] >= width_ || (i > 0 && s.index[i] <= s.index[i - 1]))
      return status::invalid_argument(
          "signature sample: indices must be strictly increasing and below the width");
    if (!std::isfinite(s.value[i]))
      return status::invalid_argument("signature sample: non-finite signature value");
    squared += static_cast<double>(s.value[i]) * s.value[i];
  }
  if (squared == 0.0)
    return status::invalid_argument(
        "signature sample: entries all zero (an empty signature has none)");
  return squared;
}

status signature_sample::add(const signature& s) {
  if (s.width != width_)
    return status::invalid_argument("signature sample: signature width " + std::to_string(s.width) +
                                    " differs from the sample's " + std::to_string(width_));
  if (s.index.size() != s.value.size())
    return status::invalid_argument("signature sample: index and value lengths differ");
  if (s.empty()) {
    ++skipped_;
    return {};
  }
  // Read and densified only when the reservoir keeps it: past capacity, most offers are dropped.
  float* row = claim_row();
  if (row == nullptr) return {};
  const result<double> squared = squared_norm(s);
  if (!squared.ok()) {
    undo_claim();
    return squared.error();
  }
  const double inv = 1.0 / std::sqrt(*squared);
  std::fill(row, row + width_, 0.0f);
  for (std::size_t i = 0; i < s.index.size(); ++i)
    row[s.index[i]] = static_cast<float>(s.value[i] * inv);
  return {};
}

status signature_sample::add_dense(std::span<const float> v) {
  if (v.size() != width_)
    return status::invalid_argument("signature sample: dense row of " + std::to_string(v.size()) +
                                    " floats, the sample's width is " + std::to_string(width_));
  double squared = 0.0;
  for (float x : v) {
    if (!std::isfinite(x))
      return status::invalid_argument("signature sample: non-finite signature value");
    squared += static_cast<double>(x) * x;
  }
  const auto [row, inv] = admit(squared);
  if (row == nullptr) return {};
  for (uint32_t d = 0; d < width_; ++d)
    row[d] = static_cast<float>(v[d] * inv);
  return {};
}

std::pair<float*, double> signature_sample::admit(double squared) {
  if (squared == 0.0) {
    ++skipped_;
    return {nullptr, 0.0};
  }
  return {claim_row(), 1.0 / std::sqrt(squared)};
}

float* signature_sample::claim_row() {
  ++seen_;
  if (size() < capacity_) {
    points_.resize(points_.size() + width_);
    return points_.data() + points_.size() - width_;
  }
  // Algorithm R: the seen_-th item replaces a uniformly chosen held one with probability
  // capacity / seen_ -- or capacity / horizon_ once seen_ is past the horizon.
  const uint64_t j = uniform_index(rng_, std::min(seen_, horizon_));
  return j < capacity_ ? points_.data() + j * width_ : nullptr;
}

void signature_sample::undo_claim() {
  // During the fill every kept offer is appended (seen_ == size()); after it, a claimed row is
  // written only once the signature passed its checks, so only the count is taken back.
  if (seen_ == size()) points_.resize(points_.size() - width_);
  --seen_;
}

uint64_t resolved_sample_horizon(uint32_t sample_size, uint64_t configured) {
  return configured != 0 ? configured : uint64_t{8} * sample_size;
}

void signature_sample::clear() {
  points_.clear();
  seen_ = 0;
  skipped_ = 0;
}

status signature_sample::reset(uint32_t width) {
  if (width == 0) return status::invalid_argument("signature sample: width is 0");
  if (uint64_t{capacity_} * width > max_sample_floats)
    return status::out_of_range("signature sample: " + std::to_string(capacity_) + " rows of " +
                                std::to_string(width) + " floats exceed 2^30 floats");
  clear();
  width_ = width;
  make_resident(points_, std::size_t{capacity_} * width_);
  return {};
}

// ---- score and validation -----------------------------------------------------------------------

result<double> predicted_distinct_experts(const centroid_set& set, std::span<const float> points,
                                          uint32_t width, const refit_validation_options& options) {
  if (auto s = check_points(points, width, "distinct-expert score"); !s.ok()) return s;
  if (points.empty()) return status::invalid_argument("distinct-expert score: no points");
  if (set.width() != width)
    return status::invalid_argument("distinct-expert score: set width " +
                                    std::to_string(set.width()) + " differs from the points' " +
                                    std::to_string(width));
  if (options.batch_size == 0)
    return status::invalid_argument("distinct-expert score: batch_size must be >= 1");
  const argmax_view a = assign_argmax(set, points, options.threads);
  return distinct_score(a, points, width, set.k(), options);
}

result<refit_report> validate_refit(const centroid_set& candidate, const centroid_set* current,
                                    std::span<const float> points, uint32_t width,
                                    const refit_validation_options& options) {
  if (auto s = check_points(points, width, "refit validation"); !s.ok()) return s;
  if (auto s = check_options(options); !s.ok()) return s;
  if (candidate.width() != width)
    return status::invalid_argument("refit validation: candidate width " +
                                    std::to_string(candidate.width()) +
                                    " differs from the sample's " + std::to_string(width));
  const uint32_t k = candidate.k();
  if (!options.worker_weights.empty()) {
    if (options.worker_weights.size() != k)
      return status::invalid_argument(
          "refit validation: " + std::to_string(options.worker_weights.size()) +
          " worker weights for " + std::to_string(k) + " workers");
    for (double w : options.worker_weights)
      if (!(w > 0.0) || !std::isfinite(w))
        return status::invalid_argument(
            "refit validation: worker weights must be positive and finite");
  }
  refit_report r;
  const uint64_t n = points.size() / width;
  r.k = k;
  r.points = n;
  r.min_cluster_points = min_cluster_points(n, k, options);
  if (r.reason = too_small(n, k, r.min_cluster_points); !r.reason.empty()) return r;

  // a) The set is unit-norm and finite by construction; checked again because this is the last
  // gate before every router scores against it.
  if (std::string problem = row_problem(candidate.rows(), k, width); !problem.empty()) {
    r.reason = std::move(problem);
    return r;
  }

  const argmax_view cand = assign_argmax(candidate, points, options.threads);
  const auto [lo, hi] = std::minmax_element(cand.sizes.begin(), cand.sizes.end());
  r.min_cluster_size = *lo;
  r.max_cluster_size = *hi;
  // The worst worker relative to its own share: with weights, a big worker may hold more.
  const double weight_sum =
      options.worker_weights.empty()
          ? static_cast<double>(k)
          : std::accumulate(options.worker_weights.begin(), options.worker_weights.end(), 0.0);
  uint32_t worst = 0;
  for (uint32_t w = 0; w < k; ++w) {
    const double weight = options.worker_weights.empty() ? 1.0 : options.worker_weights[w];
    const double ratio =
        static_cast<double>(cand.sizes[w]) * weight_sum / (weight * static_cast<double>(n));
    if (ratio > r.balance_ratio) {
      r.balance_ratio = ratio;
      worst = w;
    }
  }
  r.objective = cand.objective;
  r.candidate_score = distinct_score(cand, points, width, k, options);

  // b) Degenerate: a worker that (almost) no live request prefers gets only the band's overflow.
  // The balanced assignment the fit uses would hide this (it fills every cluster to capacity,
  // even behind a duplicated centroid), so the check uses the router's own argmax view.
  if (*lo < r.min_cluster_points) {
    const auto worker = static_cast<uint32_t>(lo - cand.sizes.begin());
    r.reason = "degenerate clusters: worker " + std::to_string(worker) + " is preferred by " +
               std::to_string(*lo) + " of " + std::to_string(n) + " points (minimum " +
               std::to_string(r.min_cluster_points) + ")";
    return r;
  }
  // c) Balance: the band concentrates traffic on the best-scoring worker; too lopsided an argmax
  // split turns locality into queueing.
  if (r.balance_ratio > options.max_balance_ratio) {
    r.reason = "balance broken: worker " + std::to_string(worst) + " is preferred by " +
               std::to_string(cand.sizes[worst]) + " of " + std::to_string(n) + " points, " +
               fmt(r.balance_ratio) + "x its share (maximum " + fmt(options.max_balance_ratio) +
               "x)";
    return r;
  }
  // d) The point of a refit: touch fewer distinct experts per decode batch than the current set.
  if (current == nullptr) {
    r.score_note = "no current set";
  } else if (current->width() != width) {
    r.score_note = "current set has width " + std::to_string(current->width()) + ", the sample " +
                   std::to_string(width) + " (new layer mask)";
  } else {
    const argmax_view cur = assign_argmax(*current, points, options.threads);
    r.current_score = distinct_score(cur, points, width, current->k(), options);
    r.score_checked = true;
    // Strictly better, by more than the tolerance: a candidate that only matches the current set
    // (a refit on unchanged traffic converges back to it) would be a new epoch that changes
    // nothing but the history, and churn every router's set for no gain.
    if (!(r.candidate_score * (1.0 + options.score_tolerance) < r.current_score)) {
      r.reason = std::string(r.candidate_score > r.current_score ? "distinct-expert score worse"
                                                                 : "distinct-expert score not "
                                                                   "better") +
                 ": candidate " + fmt(r.candidate_score) + " experts per batch, current " +
                 fmt(r.current_score) + " (needs candidate x (1 + tolerance " +
                 fmt(options.score_tolerance) + ") < current)";
      return r;
    }
  }
  r.accepted = true;
  return r;
}

// ---- refit ------------------------------------------------------------------------------------

result<refit_outcome> refit_candidate(std::span<const float> points, uint32_t width,
                                      const centroid_set* current, const refit_options& options) {
  if (width == 0) return status::invalid_argument("refit: width is 0");
  if (points.size() % width != 0)
    return status::invalid_argument("refit: " + std::to_string(points.size()) +
                                    " floats are not a whole number of rows of width " +
                                    std::to_string(width));
  if (auto s = check_options(options.validation); !s.ok()) return s;
  const uint32_t k = options.k != 0 ? options.k : (current != nullptr ? current->k() : 0);
  if (k == 0) return status::invalid_argument("refit: K is 0 and there is no current set");
  const uint64_t n = points.size() / width;

  refit_outcome out;
  out.report.k = k;
  out.report.points = n;
  out.report.min_cluster_points = min_cluster_points(n, k, options.validation);
  out.report.reason = too_small(n, k, out.report.min_cluster_points);
  if (!out.report.reason.empty()) return out;  // the fit needs K <= N and would fail validation

  const bool same_space = current != nullptr && current->k() == k && current->width() == width;
  kmeans_options ko = options.kmeans;
  if (ko.initial_centroids.empty() && same_space)
    ko.initial_centroids.assign(current->rows().begin(), current->rows().end());
  auto fit = balanced_kmeans(points, width, k, ko);
  if (!fit.ok()) return fit.error();
  out.iterations = fit->iterations;
  out.converged = fit->converged;

  if (std::string problem = row_problem(fit->centroids, k, width); !problem.empty()) {
    out.report.reason = std::move(problem);
    return out;
  }
  if (options.align && same_space) {
    auto perm = align_centroids(current->rows(), fit->centroids, width);
    if (!perm.ok()) return perm.error();
    if (auto s = apply_alignment(*perm, *fit); !s.ok()) return s;
    out.aligned = true;
  }
  out.fit_cluster_sizes = fit->cluster_sizes;

  const uint64_t epoch =
      options.epoch != 0 ? options.epoch : (current != nullptr ? current->epoch() + 1 : 1);
  auto set = centroid_set::make(k, width, std::move(fit->centroids), epoch);
  if (!set.ok()) {
    out.report.reason = "non-finite centroid: " + set.error().message();
    return out;
  }
  auto candidate = std::make_shared<const centroid_set>(std::move(set).value());
  refit_validation_options vo = options.validation;
  if (vo.worker_weights.empty()) vo.worker_weights = options.kmeans.worker_weights;
  auto report = validate_refit(*candidate, current, points, width, vo);
  if (!report.ok()) return report.error();
  out.report = std::move(report).value();
  out.candidate = std::move(candidate);
  return out;
}

result<refit_outcome> refit_candidate(const signature_sample& sample, const centroid_set* current,
                                      const refit_options& options) {
  return refit_candidate(sample.points(), sample.width(), current, options);
}

// ---- the node's rule ----------------------------------------------------------------------------

std::string refit_rule::sample_shortfall(std::size_t rows) const {
  if (rows >= min_sample) return {};
  return "sample too small: " + std::to_string(rows) + " live signatures, " +
         std::to_string(min_sample) + " needed (models.min_sample)";
}

refit_options refit_rule::options(const centroid_set& current,
                                  std::span<const float> worker_weights, uint64_t run) const {
  refit_options ro;
  ro.k = current.k();
  ro.kmeans.seed = seed + run;
  ro.kmeans.threads = 1;  // on a node, the router and the frontend keep the other core
  ro.kmeans.worker_weights.assign(worker_weights.begin(), worker_weights.end());
  ro.validation.max_balance_ratio = max_balance_ratio;
  ro.validation.score_tolerance = score_tolerance;
  ro.validation.batch_size = batch_size;
  ro.validation.seed = seed;
  return ro;
}

}  // namespace eldr
