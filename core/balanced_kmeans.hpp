// balanced_kmeans: the offline fit of one centroid per decode worker (docs/method.md section 4)
// and the alignment that lets a refit keep each worker's region (section 6).
//
// Spherical K-means: points and centroids are unit vectors and the distance is 1 - x.c. Each
// iteration computes the N x K similarities (the cost centre, split over threads by points),
// assigns points (balanced: the exact capacitated solver of balanced_assignment.hpp with
// cap = ceil(N / K) or weighted capacities; vanilla: argmax, ties to the lower index), and moves
// every centroid to the normalised mean of its points; an empty cluster keeps its old centroid.
// It stops after max_iterations or when no centroid moved by more than the tolerance. Cost per
// iteration: O(N K D) for the similarities plus the assignment (see balanced_assignment.hpp);
// N = 20,000, D = 1,024, K = 64 fits in about 3 s on two cores (bench/kmeans_bench.cpp).
//
// Results are a deterministic function of (points, k, options) whatever the thread count: every
// similarity is one dot product, and centroid sums are split over threads by dimension, so each
// value is accumulated in point order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

enum class kmeans_variant {
  balanced,  // capacitated assignment: cluster k holds at most cap_k points
  vanilla,   // plain argmax assignment (the paper's ablation)
};

struct kmeans_options {
  uint64_t seed = 0;  // k-means++ seed (std::mt19937_64, library-independent sampling)
  uint32_t max_iterations = 50;
  // Converged when every centroid moved by at most this L2 distance in one iteration. An
  // iteration that reproduces the previous assignment moves nothing (distance exactly 0).
  double tolerance = 1e-5;
  kmeans_variant variant = kmeans_variant::balanced;
  // Optional, balanced only: positive relative capacities of the K workers, giving
  // cap_k = ceil(N * w_k / sum(w)). Empty: cap = ceil(N / K) for all. Vanilla validates but
  // ignores them.
  std::vector<double> worker_weights;
  // Optional K x D starting centroids (e.g. the current set, for an online refit); they are
  // normalised, and k-means++ is skipped. Empty: k-means++ from `seed`.
  std::vector<float> initial_centroids;
  // Worker threads for the dense steps; 0 = std::thread::hardware_concurrency(), capped at 16.
  uint32_t threads = 0;
};

struct kmeans_result {
  std::vector<float> centroids;         // K x D row-major, unit norm
  std::vector<uint32_t> assignment;     // N entries, each < K
  std::vector<uint32_t> cluster_sizes;  // K entries, summing to N
  // Mean cosine distance 1 - x.c of every point to its assigned (final) centroid; the same
  // quantity for both variants, so they can be compared.
  double objective = 0.0;
  uint32_t iterations = 0;  // assignment + update rounds run (>= 1)
  bool converged = false;   // stopped because centroids stopped moving, not by max_iterations
};

// Fits K centroids to N = points.size() / dim unit-norm points (row-major N x D).
// Errors (invalid_argument): dim == 0, points.size() not a multiple of dim, N == 0, K == 0,
// K > N, a NaN/Inf coordinate, a row whose norm is not 1 within 1e-3 (zero rows included:
// all-zero signatures carry no locality and must be left out of a fit), max_iterations == 0,
// a negative or non-finite tolerance, bad worker weights (count != K, zero, negative, NaN),
// initial centroids of the wrong size, non-finite or all-zero.
result<kmeans_result> balanced_kmeans(std::span<const float> points, std::size_t dim, std::size_t k,
                                      const kmeans_options& options = {});

// Matches a refit's centroids to the old worker identities: returns perm with perm[w] = the index
// in new_centroids of the centroid worker w takes over, maximising sum_w cos(old_w, new_perm[w])
// (exact K x K Hungarian). Both sets are K x D row-major with the same K; rows need not be unit
// norm but must be finite and non-zero.
result<std::vector<uint32_t>> align_centroids(std::span<const float> old_centroids,
                                              std::span<const float> new_centroids,
                                              std::size_t dim);

// Rewrites a fit so that cluster w is worker w under perm (from align_centroids): centroid rows
// and sizes are permuted and assignment labels renamed. Errors: perm is not a permutation of
// 0..K-1 for the fit's K (K = cluster_sizes.size()), or the fit is inconsistent.
status apply_alignment(std::span<const uint32_t> perm, kmeans_result& fit);

}  // namespace eldr
