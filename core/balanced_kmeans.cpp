// balanced_kmeans: spherical K-means with capacitated or argmax assignment, k-means++ seeding,
// and the Hungarian alignment of a refit to the old worker identities.
#include "core/balanced_kmeans.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <system_error>
#include <thread>

#include "core/balanced_assignment.hpp"
#include "core/base/parallel.hpp"
#include "core/base/vector_math.hpp"

namespace eldr {
namespace {

constexpr uint32_t kDefaultThreadCap = 16;
constexpr uint32_t kExplicitThreadCap = 256;
// Rows must be unit vectors; this admits float rounding and slightly lossy serialisation.
constexpr double kUnitNormSlack = 1e-3;

uint32_t resolve_threads(uint32_t requested, std::size_t work_items) {
  uint32_t t = requested;
  if (t == 0) t = std::min(std::max(1u, std::thread::hardware_concurrency()), kDefaultThreadCap);
  t = std::min(t, kExplicitThreadCap);
  return static_cast<uint32_t>(std::max<std::size_t>(1, std::min<std::size_t>(t, work_items)));
}

// Library-independent sampling (std:: distributions differ between standard libraries).
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}
std::size_t uniform_index(std::mt19937_64& rng, std::size_t n) {
  return std::min(n - 1, static_cast<std::size_t>(uniform01(rng) * static_cast<double>(n)));
}

struct problem {
  const float* x;
  std::size_t n, dim, k;
  uint32_t threads;
  const float* row(std::size_t i) const { return x + i * dim; }
};

status check_rows(const float* rows, std::size_t count, std::size_t dim, const char* what,
                  bool require_unit) {
  for (std::size_t i = 0; i < count; ++i) {
    // A NaN or Inf anywhere makes the squared norm non-finite, so one pass checks both (values
    // near FLT_MAX overflow too, which no unit vector or centroid has).
    const double sq = squared_norm(rows + i * dim, dim);
    if (!std::isfinite(sq)) {
      return status::invalid_argument(std::string(what) + " " + std::to_string(i) +
                                      " has a NaN, infinite or float-overflowing coordinate");
    }
    if (sq == 0.0) {
      return status::invalid_argument(std::string(what) + " " + std::to_string(i) + " is all zero");
    }
    if (require_unit && std::abs(std::sqrt(sq) - 1.0) > kUnitNormSlack) {
      return status::invalid_argument(std::string(what) + " " + std::to_string(i) + " has norm " +
                                      std::to_string(std::sqrt(sq)) + ", expected unit norm");
    }
  }
  return {};
}

// k-means++ with the spherical distance 1 - x.c (proportional to the squared Euclidean distance
// between unit vectors): the first centroid is uniform, each next one is drawn with probability
// proportional to a point's distance to its nearest chosen centroid.
std::vector<float> kmeans_plus_plus(const problem& pb, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> centroids(pb.k * pb.dim);
  std::vector<double> nearest(pb.n, std::numeric_limits<double>::infinity());
  std::size_t chosen = uniform_index(rng, pb.n);
  for (std::size_t c = 0; c < pb.k; ++c) {
    if (c > 0) {
      double total = 0.0;
      for (double d : nearest)
        total += d;
      if (total > 0.0) {
        const double target = uniform01(rng) * total;
        double cumulative = 0.0;
        chosen = pb.n;
        std::size_t last_positive = 0;
        for (std::size_t i = 0; i < pb.n && chosen == pb.n; ++i) {
          if (nearest[i] <= 0.0) continue;
          last_positive = i;
          cumulative += nearest[i];
          if (cumulative > target) chosen = i;
        }
        if (chosen == pb.n) chosen = last_positive;  // target rounded past the end
      } else {
        // Every point coincides with a chosen centroid (fewer distinct points than K).
        chosen = uniform_index(rng, pb.n);
      }
    }
    float* centroid = &centroids[c * pb.dim];
    std::copy(pb.row(chosen), pb.row(chosen) + pb.dim, centroid);
    normalize(centroid, pb.dim);
    if (c + 1 == pb.k) break;
    parallel_slices(pb.threads, pb.n, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const double d = std::max(0.0, 1.0 - dot(pb.row(i), centroid, pb.dim));
        nearest[i] = std::min(nearest[i], d);
      }
    });
  }
  return centroids;
}

// sim[i * K + c] = x_i . centroid_c: the N x K x D cost centre of every iteration.
void similarities(const problem& pb, const std::vector<float>& centroids, std::vector<float>& sim) {
  parallel_slices(pb.threads, pb.n, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const float* x = pb.row(i);
      float* out = &sim[i * pb.k];
      for (std::size_t c = 0; c < pb.k; ++c)
        out[c] = dot(x, &centroids[c * pb.dim], pb.dim);
    }
  });
}

void argmax_assign(const problem& pb, const std::vector<float>& sim,
                   std::vector<uint32_t>& assignment) {
  for (std::size_t i = 0; i < pb.n; ++i) {
    const float* s = &sim[i * pb.k];
    std::size_t best = 0;
    for (std::size_t c = 1; c < pb.k; ++c) {
      if (s[c] > s[best]) best = c;  // strict: ties stay with the lower index
    }
    assignment[i] = static_cast<uint32_t>(best);
  }
}

// Moves each centroid to the normalised mean of its points (the mean's direction: the sum is
// normalised directly); an empty cluster keeps its old centroid. Threads split the dimensions, so
// every coordinate is summed in point order whatever the thread count. Returns the largest L2
// distance a centroid moved.
double update_centroids(const problem& pb, const std::vector<uint32_t>& assignment,
                        std::vector<float>& centroids, std::vector<float>& sums) {
  std::fill(sums.begin(), sums.end(), 0.0f);
  const uint32_t threads = resolve_threads(pb.threads, pb.dim / 16);
  parallel_slices(threads, pb.dim, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = 0; i < pb.n; ++i) {
      axpy(1.0f, pb.row(i) + begin, &sums[assignment[i] * pb.dim + begin], end - begin);
    }
  });
  double moved = 0.0;
  for (std::size_t c = 0; c < pb.k; ++c) {
    float* sum = &sums[c * pb.dim];
    if (normalize(sum, pb.dim) == 0.0f) continue;  // empty (or cancelling): keep the old one
    float* centroid = &centroids[c * pb.dim];
    double sq = 0.0;
    for (std::size_t d = 0; d < pb.dim; ++d) {
      const double diff = static_cast<double>(sum[d]) - centroid[d];
      sq += diff * diff;
    }
    moved = std::max(moved, std::sqrt(sq));
    std::copy(sum, sum + pb.dim, centroid);
  }
  return moved;
}

double mean_cosine_distance(const problem& pb, const std::vector<float>& centroids,
                            const std::vector<uint32_t>& assignment) {
  std::vector<double> distance(pb.n);
  parallel_slices(pb.threads, pb.n, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      distance[i] = 1.0 - dot(pb.row(i), &centroids[assignment[i] * pb.dim], pb.dim);
    }
  });
  double total = 0.0;
  for (double d : distance)
    total += d;  // in point order: thread-count independent
  return total / static_cast<double>(pb.n);
}

}  // namespace

result<kmeans_result> balanced_kmeans(std::span<const float> points, std::size_t dim, std::size_t k,
                                      const kmeans_options& options) {
  if (dim == 0) return status::invalid_argument("dimension D is 0");
  if (points.size() % dim != 0) {
    return status::invalid_argument("points hold " + std::to_string(points.size()) +
                                    " values, not a multiple of D = " + std::to_string(dim));
  }
  const std::size_t n = points.size() / dim;
  if (n == 0) return status::invalid_argument("no points (N == 0)");
  if (k == 0) return status::invalid_argument("no clusters (K == 0)");
  if (k > n) {
    return status::invalid_argument("K (" + std::to_string(k) + ") exceeds the number of points (" +
                                    std::to_string(n) + ")");
  }
  if (options.max_iterations == 0) return status::invalid_argument("max_iterations is 0");
  if (!std::isfinite(options.tolerance) || options.tolerance < 0.0) {
    return status::invalid_argument("tolerance must be finite and non-negative");
  }
  if (status s = check_rows(points.data(), n, dim, "point", true); !s.ok()) return s;

  std::vector<uint32_t> caps;
  if (!options.worker_weights.empty()) {
    if (options.worker_weights.size() != k) {
      return status::invalid_argument("got " + std::to_string(options.worker_weights.size()) +
                                      " worker weights for K = " + std::to_string(k));
    }
    auto w = weighted_capacities(n, options.worker_weights);
    if (!w.ok()) return w.error();
    caps = std::move(*w);
  } else {
    auto b = balanced_capacities(n, k);
    if (!b.ok()) return b.error();
    caps = std::move(*b);
  }

  const problem pb{points.data(), n, dim, k, resolve_threads(options.threads, n)};
  std::vector<float> centroids;
  if (!options.initial_centroids.empty()) {
    if (options.initial_centroids.size() != k * dim) {
      return status::invalid_argument(
          "initial centroids hold " + std::to_string(options.initial_centroids.size()) +
          " values, expected K * D = " + std::to_string(k) + " * " + std::to_string(dim));
    }
    if (status s = check_rows(options.initial_centroids.data(), k, dim, "initial centroid", false);
        !s.ok()) {
      return s;
    }
    centroids = options.initial_centroids;
    for (std::size_t c = 0; c < k; ++c)
      normalize(&centroids[c * dim], dim);
  } else {
    centroids = kmeans_plus_plus(pb, options.seed);
  }

  kmeans_result out;
  out.assignment.assign(n, 0);
  std::vector<float> sim(n * k), sums(k * dim);
  for (uint32_t it = 1; it <= options.max_iterations; ++it) {
    similarities(pb, centroids, sim);
    if (options.variant == kmeans_variant::balanced) {
      auto assigned = solve_balanced_assignment(sim, n, k, caps);
      if (!assigned.ok()) return assigned.error();  // unreachable: inputs were validated
      out.assignment = std::move(assigned->cluster_of);
    } else {
      argmax_assign(pb, sim, out.assignment);
    }
    const double moved = update_centroids(pb, out.assignment, centroids, sums);
    out.iterations = it;
    if (moved <= options.tolerance) {
      out.converged = true;
      break;
    }
  }
  out.cluster_sizes.assign(k, 0);
  for (uint32_t c : out.assignment)
    ++out.cluster_sizes[c];
  out.objective = mean_cosine_distance(pb, centroids, out.assignment);
  out.centroids = std::move(centroids);
  return out;
}

result<std::vector<uint32_t>> align_centroids(std::span<const float> old_centroids,
                                              std::span<const float> new_centroids,
                                              std::size_t dim) {
  if (dim == 0) return status::invalid_argument("dimension D is 0");
  if (old_centroids.size() != new_centroids.size()) {
    return status::invalid_argument("old and new centroid sets differ in size (" +
                                    std::to_string(old_centroids.size()) + " vs " +
                                    std::to_string(new_centroids.size()) + " values)");
  }
  if (old_centroids.empty()) return status::invalid_argument("no centroids (K == 0)");
  if (old_centroids.size() % dim != 0) {
    return status::invalid_argument("centroids hold " + std::to_string(old_centroids.size()) +
                                    " values, not a multiple of D = " + std::to_string(dim));
  }
  const std::size_t k = old_centroids.size() / dim;
  if (status s = check_rows(old_centroids.data(), k, dim, "old centroid", false); !s.ok()) return s;
  if (status s = check_rows(new_centroids.data(), k, dim, "new centroid", false); !s.ok()) return s;
  std::vector<double> inv_norm_old(k), inv_norm_new(k);
  for (std::size_t c = 0; c < k; ++c) {
    inv_norm_old[c] =
        1.0 / std::sqrt(static_cast<double>(squared_norm(&old_centroids[c * dim], dim)));
    inv_norm_new[c] =
        1.0 / std::sqrt(static_cast<double>(squared_norm(&new_centroids[c * dim], dim)));
  }
  // Minimising -cos maximises the summed cosine between each worker's old and new centroid.
  std::vector<double> cost(k * k);
  for (std::size_t w = 0; w < k; ++w) {
    for (std::size_t j = 0; j < k; ++j) {
      cost[w * k + j] =
          -static_cast<double>(dot(&old_centroids[w * dim], &new_centroids[j * dim], dim)) *
          inv_norm_old[w] * inv_norm_new[j];
    }
  }
  return solve_linear_assignment(cost, k, k);
}

status apply_alignment(std::span<const uint32_t> perm, kmeans_result& fit) {
  const std::size_t k = fit.cluster_sizes.size();
  if (perm.size() != k) {
    return status::invalid_argument("permutation has " + std::to_string(perm.size()) +
                                    " entries for K = " + std::to_string(k));
  }
  if (k == 0 || fit.centroids.size() % k != 0) {
    return status::invalid_argument("fit has " + std::to_string(fit.centroids.size()) +
                                    " centroid values for K = " + std::to_string(k));
  }
  std::vector<uint32_t> worker_of(k, std::numeric_limits<uint32_t>::max());
  for (std::size_t w = 0; w < k; ++w) {
    if (perm[w] >= k || worker_of[perm[w]] != std::numeric_limits<uint32_t>::max()) {
      return status::invalid_argument("alignment is not a permutation of 0.." +
                                      std::to_string(k - 1) + " (entry " + std::to_string(w) +
                                      " = " + std::to_string(perm[w]) + ")");
    }
    worker_of[perm[w]] = static_cast<uint32_t>(w);
  }
  for (uint32_t c : fit.assignment) {
    if (c >= k)
      return status::invalid_argument("fit assigns a point to cluster " + std::to_string(c));
  }
  const std::size_t dim = fit.centroids.size() / k;
  std::vector<float> centroids(fit.centroids.size());
  std::vector<uint32_t> sizes(k);
  for (std::size_t w = 0; w < k; ++w) {
    std::copy_n(&fit.centroids[perm[w] * dim], dim, &centroids[w * dim]);
    sizes[w] = fit.cluster_sizes[perm[w]];
  }
  for (uint32_t& c : fit.assignment)
    c = worker_of[c];
  fit.centroids = std::move(centroids);
  fit.cluster_sizes = std::move(sizes);
  return {};
}

}  // namespace eldr
