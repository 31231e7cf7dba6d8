// balanced_assignment: the assignment step of balanced K-means (docs/method.md section 4) and the
// capacities it enforces.
//
// Problem: N points, K clusters, an N x K similarity matrix (row-major) and capacities cap_k with
// sum(cap) >= N. Put every point in exactly one cluster, at most cap_k points in cluster k,
// maximising the total similarity (equivalently minimising sum of 1 - sim). This is a
// transportation problem; the paper's artifact solved it as an N x (K * cap) Hungarian problem,
// which is cubic in N. Here:
//
// * solve_balanced_assignment (the scalable, exact solver): successive shortest paths on the
//   K-node "cluster graph". Points are inserted one at a time. Each cluster carries a price
//   lambda_k >= 0 (the LP dual; non-zero only on full clusters) and every assigned point sits in
//   a cluster maximising sim - lambda. A new point goes to its best cluster by sim - lambda; when
//   that cluster is full, Dijkstra over the clusters finds the cheapest chain of displacements
//   (point enters a, some point of a moves to b, ..., the last cluster has room). The arc a -> b
//   costs the smallest sim(q,a) - sim(q,b) over q in a, read from a lazily-cleaned heap kept per
//   ordered pair of full clusters; prices keep all reduced arc costs non-negative.
//   Time: O(N K log N) for the heaps plus O(K) per point when its best cluster has room and
//   O(K * settled clusters) per Dijkstra, so O(N K^2) in the worst case (N = 100,000 and K = 64:
//   well under a second). Memory: 8 bytes per (point, other cluster) once its cluster is full,
//   about twice the similarity matrix. Optimal up to float rounding of similarity differences
//   (about 1e-7 per displaced point); ties go to the lower cluster index, so the result is a
//   deterministic function of the input.
// * solve_balanced_assignment_exact (the reference, for tests and small offline fits): the
//   artifact's method, Hungarian / shortest augmenting paths on the N x sum(cap) matrix of
//   replicated cluster slots, in double precision. O(N^2 * sum(cap)); refuses N > 5,000 or more
//   than 50,000 slots. Shares no code with the scalable solver, so comparing them means something.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// The paper's balance: cap = ceil(N / K) for every cluster. Errors: N == 0, K == 0, K > N.
result<std::vector<uint32_t>> balanced_capacities(std::size_t n, std::size_t k);

// Capacities for heterogeneous decode workers: cap_k = ceil(N * w_k / sum(w)), K = weights.size().
// The sum is always >= N (a rounding shortfall, which exact arithmetic cannot produce, is
// given to the largest weights). Errors: N == 0, no weights, K > N, a weight that is zero,
// negative, NaN or infinite.
result<std::vector<uint32_t>> weighted_capacities(std::size_t n, std::span<const double> weights);

// One balanced assignment: cluster_of[i] is point i's cluster, sizes[k] <= cap_k.
struct cluster_assignment {
  std::vector<uint32_t> cluster_of;  // N entries, each < K
  std::vector<uint32_t> sizes;       // K entries, summing to N
  double total_similarity = 0.0;     // sum_i sim(i, cluster_of[i]), accumulated in double
};

// The scalable exact solver described above. similarity: N x K row-major, finite. capacities: K
// entries (zeros allowed) summing to at least N. Errors (invalid_argument): N == 0, K == 0,
// K > N, similarity.size() != N * K, a NaN/Inf similarity, capacities.size() != K, sum < N.
result<cluster_assignment> solve_balanced_assignment(std::span<const float> similarity,
                                                     std::size_t n, std::size_t k,
                                                     std::span<const uint32_t> capacities);

// The exact reference (Hungarian on replicated slots). Same contract and errors as
// solve_balanced_assignment, plus out_of_range when N > 5,000 or the slots
// (sum of min(cap_k, N)) exceed 50,000.
result<cluster_assignment> solve_balanced_assignment_exact(std::span<const float> similarity,
                                                           std::size_t n, std::size_t k,
                                                           std::span<const uint32_t> capacities);

// Rectangular linear assignment (Hungarian, exact in double): cost is rows x cols row-major with
// rows <= cols; returns col_of_row minimising sum cost[r][col_of_row[r]], distinct columns.
// O(rows^2 * cols). Errors: rows == 0, rows > cols, size mismatch, NaN/Inf, rows > 5,000.
result<std::vector<uint32_t>> solve_linear_assignment(std::span<const double> cost,
                                                      std::size_t rows, std::size_t cols);

}  // namespace eldr
