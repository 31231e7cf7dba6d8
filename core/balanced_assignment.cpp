// balanced_assignment: capacities, the cluster-graph successive-shortest-path solver and the
// replicated-slot Hungarian reference. The header explains the algorithms and their guarantees.
#include "core/balanced_assignment.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>

namespace eldr {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kMaxExactRows = 5000;
constexpr std::size_t kMaxExactSlots = 50000;

status check_counts(std::size_t n, std::size_t k) {
  if (n == 0) return status::invalid_argument("no points (N == 0)");
  if (k == 0) return status::invalid_argument("no clusters (K == 0)");
  if (k > n) {
    return status::invalid_argument("K (" + std::to_string(k) + ") exceeds the number of points (" +
                                    std::to_string(n) + ")");
  }
  // Point and cluster ids are stored as uint32_t.
  if (n >= std::numeric_limits<uint32_t>::max()) {
    return status::out_of_range("too many points (" + std::to_string(n) + ")");
  }
  return {};
}

// Everything both solvers require of their input, checked once so the solvers can trust it.
status check_problem(std::span<const float> similarity, std::size_t n, std::size_t k,
                     std::span<const uint32_t> capacities) {
  if (status s = check_counts(n, k); !s.ok()) return s;
  if (similarity.size() / k != n || similarity.size() % k != 0) {
    return status::invalid_argument("similarity matrix has " + std::to_string(similarity.size()) +
                                    " values, expected N * K = " + std::to_string(n) + " * " +
                                    std::to_string(k));
  }
  for (std::size_t i = 0; i < similarity.size(); ++i) {
    if (!std::isfinite(similarity[i])) {
      return status::invalid_argument("similarity of point " + std::to_string(i / k) +
                                      " to cluster " + std::to_string(i % k) + " is not finite");
    }
  }
  if (capacities.size() != k) {
    return status::invalid_argument("got " + std::to_string(capacities.size()) +
                                    " capacities for K = " + std::to_string(k) + " clusters");
  }
  uint64_t total = 0;
  for (uint32_t c : capacities)
    total += c;
  if (total < n) {
    return status::invalid_argument("capacities sum to " + std::to_string(total) +
                                    ", fewer than the " + std::to_string(n) + " points");
  }
  return {};
}

cluster_assignment finish(std::span<const float> similarity, std::size_t k,
                          std::vector<uint32_t> cluster_of) {
  cluster_assignment out;
  out.sizes.assign(k, 0);
  for (std::size_t i = 0; i < cluster_of.size(); ++i) {
    ++out.sizes[cluster_of[i]];
    out.total_similarity += similarity[i * k + cluster_of[i]];
  }
  out.cluster_of = std::move(cluster_of);
  return out;
}

// ---- Scalable solver: successive shortest paths on the cluster graph ----------------------------

// One point of a full cluster a in the heap of arc (a, b); key = sim(q,a) - sim(q,b), the loss of
// moving q from a to b.
struct heap_entry {
  float key;
  uint32_t point;
};
// std heaps are max-heaps; this order puts the smallest key (then lowest point id) on top.
struct entry_after {
  bool operator()(const heap_entry& x, const heap_entry& y) const {
    return x.key > y.key || (x.key == y.key && x.point > y.point);
  }
};

class cluster_graph_solver {
 public:
  cluster_graph_solver(const float* sim, std::size_t n, std::size_t k,
                       std::span<const uint32_t> caps)
      : sim_(sim),
        n_(n),
        k_(k),
        cap_(caps.begin(), caps.end()),
        count_(k, 0),
        cluster_of_(n, kUnassigned),
        price_(k, 0.0),
        full_(k, 0),
        members_(k),
        heap_(k * k),
        arc_(k * k, kInf),
        dist_(k),
        pred_(k),
        settled_(k) {
    // A zero-capacity cluster is full from the start, with empty (infinite-cost) arcs.
    for (std::size_t a = 0; a < k; ++a)
      full_[a] = cap_[a] == 0 ? 1 : 0;
  }

  std::vector<uint32_t> solve() {
    for (std::size_t p = 0; p < n_; ++p)
      insert(static_cast<uint32_t>(p));
    return std::move(cluster_of_);
  }

 private:
  static constexpr uint32_t kUnassigned = std::numeric_limits<uint32_t>::max();
  static constexpr uint32_t kSource = std::numeric_limits<uint32_t>::max();

  float sim(std::size_t q, std::size_t a) const { return sim_[q * k_ + a]; }

  // Adds point p along a shortest augmenting path. Invariants before and after: every assigned
  // point maximises sim - price over the clusters; price > 0 only on full clusters; the heaps of
  // every full cluster have a valid top and arc_ holds its key. Together these certify that the
  // partial assignment is optimal for the points inserted so far.
  void insert(uint32_t p) {
    // Labels from the source: how much worse than p's best (by sim - price) each cluster is.
    double best = -kInf;
    for (std::size_t x = 0; x < k_; ++x)
      best = std::max(best, sim(p, x) - price_[x]);
    for (std::size_t x = 0; x < k_; ++x) {
      dist_[x] = best - (sim(p, x) - price_[x]);
      pred_[x] = kSource;
      settled_[x] = 0;
    }
    popped_.clear();
    // Dijkstra over the K clusters with a linear scan (K is small, the matrix is dense). It stops
    // at the first cluster with room: arcs from there to the sink cost nothing, so no later path
    // can be shorter. When p's best cluster has room this costs O(K).
    std::size_t target = k_;
    while (target == k_) {
      std::size_t x = k_;
      for (std::size_t y = 0; y < k_; ++y) {
        if (settled_[y]) continue;
        // Ties prefer a cluster with room (it ends the search) and then the lower index.
        if (x == k_ || dist_[y] < dist_[x] || (dist_[y] == dist_[x] && !full_[y] && full_[x])) {
          x = y;
        }
      }
      settled_[x] = 1;
      if (!full_[x]) {
        target = x;
        break;
      }
      popped_.push_back(static_cast<uint32_t>(x));
      const double* arcs = &arc_[x * k_];
      for (std::size_t y = 0; y < k_; ++y) {
        if (settled_[y] || arcs[y] == kInf) continue;
        // Exactly >= 0 in real arithmetic; clamp the rounding of the float keys.
        const double reduced = std::max(0.0, arcs[y] - price_[x] + price_[y]);
        if (dist_[x] + reduced < dist_[y]) {
          dist_[y] = dist_[x] + reduced;
          pred_[y] = static_cast<uint32_t>(x);
        }
      }
    }
    // Johnson's update, shifted so clusters with room stay at price 0: clusters settled before the
    // target become dearer by how much closer they were.
    const double d_target = dist_[target];
    for (uint32_t x : popped_)
      price_[x] += d_target - dist_[x];

    // The path source -> a_1 -> ... -> a_m = target, read backwards.
    path_.clear();
    for (uint32_t x = static_cast<uint32_t>(target); x != kSource; x = pred_[x])
      path_.push_back(x);
    std::reverse(path_.begin(), path_.end());
    // Pick every displaced point before changing any heap: the top of arc (a_i, a_i+1).
    movers_.clear();
    for (std::size_t i = 0; i + 1 < path_.size(); ++i) {
      movers_.push_back(heap_[path_[i] * k_ + path_[i + 1]].front().point);
    }
    cluster_of_[p] = path_[0];
    for (std::size_t i = 0; i < movers_.size(); ++i)
      cluster_of_[movers_[i]] = path_[i + 1];
    // Clusters inside the path are full: each lost one point and gained one.
    for (std::size_t i = 0; i + 1 < path_.size(); ++i) {
      const uint32_t entering = i == 0 ? p : movers_[i - 1];
      push_member(path_[i], entering);
      refresh_tops(path_[i]);
    }
    // The target had room and gains one point; it may fill up now.
    const uint32_t last = path_.back();
    members_[last].push_back(path_.size() == 1 ? p : movers_.back());
    if (++count_[last] == cap_[last]) make_full(last);
  }

  void push_member(std::size_t a, uint32_t q) {
    for (std::size_t b = 0; b < k_; ++b) {
      if (b == a) continue;
      auto& h = heap_[a * k_ + b];
      h.push_back({sim(q, a) - sim(q, b), q});
      std::push_heap(h.begin(), h.end(), entry_after{});
    }
  }

  // Drops entries of points that have left cluster a (lazy deletion) and re-reads the arc costs.
  void refresh_tops(std::size_t a) {
    for (std::size_t b = 0; b < k_; ++b) {
      if (b == a) continue;
      auto& h = heap_[a * k_ + b];
      while (!h.empty() && cluster_of_[h.front().point] != a) {
        std::pop_heap(h.begin(), h.end(), entry_after{});
        h.pop_back();
      }
      arc_[a * k_ + b] = h.empty() ? kInf : static_cast<double>(h.front().key);
    }
  }

  // Until a cluster is full no point ever leaves it (only full clusters are inside paths), so its
  // member list is exact; from now on the heaps track its members instead.
  void make_full(std::size_t a) {
    full_[a] = 1;
    const auto& members = members_[a];
    for (std::size_t b = 0; b < k_; ++b) {
      if (b == a) continue;
      auto& h = heap_[a * k_ + b];
      h.reserve(members.size() + members.size() / 4);
      for (uint32_t q : members)
        h.push_back({sim(q, a) - sim(q, b), q});
      std::make_heap(h.begin(), h.end(), entry_after{});
    }
    std::vector<uint32_t>().swap(members_[a]);
    refresh_tops(a);
  }

  const float* sim_;
  std::size_t n_, k_;
  std::vector<uint32_t> cap_, count_;
  std::vector<uint32_t> cluster_of_;
  std::vector<double> price_;  // lambda_k, the dual of cluster k's capacity
  std::vector<char> full_;
  std::vector<std::vector<uint32_t>> members_;  // members of clusters that are not full yet
  std::vector<std::vector<heap_entry>> heap_;   // K x K arcs, only for full clusters
  std::vector<double> arc_;                     // K x K, the current top key of each heap
  // Dijkstra scratch, reused across insertions.
  std::vector<double> dist_;
  std::vector<uint32_t> pred_;
  std::vector<char> settled_;
  std::vector<uint32_t> popped_, path_, movers_;
};

// ---- Reference: Hungarian (shortest augmenting paths, e-maxx formulation) ----------------------

// Minimises sum cost(r, col_of_row[r]) over injective maps rows -> cols; rows <= cols. Row
// potentials u and column potentials v keep reduced costs non-negative; each row is added by a
// Dijkstra over the columns. cost(r, c) is a callable so replicated slots need no matrix.
template <class Cost>
std::vector<uint32_t> hungarian(std::size_t rows, std::size_t cols, const Cost& cost) {
  std::vector<double> u(rows + 1, 0.0), v(cols + 1, 0.0), min_slack(cols + 1);
  std::vector<std::size_t> row_of(cols + 1, 0), way(cols + 1, 0);  // 1-based; 0 = none
  std::vector<char> used(cols + 1);
  for (std::size_t r = 1; r <= rows; ++r) {
    row_of[0] = r;
    std::size_t c0 = 0;
    std::fill(min_slack.begin(), min_slack.end(), kInf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[c0] = 1;
      const std::size_t r0 = row_of[c0];
      double delta = kInf;
      std::size_t c1 = 0;
      for (std::size_t c = 1; c <= cols; ++c) {
        if (used[c]) continue;
        const double cur = cost(r0 - 1, c - 1) - u[r0] - v[c];
        if (cur < min_slack[c]) {
          min_slack[c] = cur;
          way[c] = c0;
        }
        if (min_slack[c] < delta) {
          delta = min_slack[c];
          c1 = c;
        }
      }
      for (std::size_t c = 0; c <= cols; ++c) {
        if (used[c]) {
          u[row_of[c]] += delta;
          v[c] -= delta;
        } else {
          min_slack[c] -= delta;
        }
      }
      c0 = c1;
    } while (row_of[c0] != 0);
    do {
      const std::size_t c1 = way[c0];
      row_of[c0] = row_of[c1];
      c0 = c1;
    } while (c0 != 0);
  }
  std::vector<uint32_t> col_of_row(rows, 0);
  for (std::size_t c = 1; c <= cols; ++c) {
    if (row_of[c] != 0) col_of_row[row_of[c] - 1] = static_cast<uint32_t>(c - 1);
  }
  return col_of_row;
}

}  // namespace

result<std::vector<uint32_t>> balanced_capacities(std::size_t n, std::size_t k) {
  if (status s = check_counts(n, k); !s.ok()) return s;
  return std::vector<uint32_t>(k, static_cast<uint32_t>((n + k - 1) / k));
}

result<std::vector<uint32_t>> weighted_capacities(std::size_t n, std::span<const double> weights) {
  if (weights.empty()) return status::invalid_argument("no worker weights (K == 0)");
  if (status s = check_counts(n, weights.size()); !s.ok()) return s;
  double sum = 0.0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0.0) {
      return status::invalid_argument("worker weight " + std::to_string(i) + " is " +
                                      std::to_string(weights[i]) +
                                      "; weights must be finite and positive");
    }
    sum += weights[i];
  }
  if (!std::isfinite(sum)) return status::invalid_argument("worker weights overflow when summed");
  std::vector<uint32_t> caps(weights.size());
  uint64_t total = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double share = std::ceil(static_cast<double>(n) * (weights[i] / sum));
    // More than N is never usable; at least 1 because the weight is positive.
    caps[i] = static_cast<uint32_t>(std::clamp(share, 1.0, static_cast<double>(n)));
    total += caps[i];
  }
  // Floating rounding can only lose a few units; give them to the heaviest workers.
  if (total < n) {
    std::vector<std::size_t> order(weights.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return weights[a] > weights[b]; });
    for (std::size_t i = 0; total < n; i = (i + 1) % order.size()) {
      ++caps[order[i]];
      ++total;
    }
  }
  return caps;
}

result<cluster_assignment> solve_balanced_assignment(std::span<const float> similarity,
                                                     std::size_t n, std::size_t k,
                                                     std::span<const uint32_t> capacities) {
  if (status s = check_problem(similarity, n, k, capacities); !s.ok()) return s;
  cluster_graph_solver solver(similarity.data(), n, k, capacities);
  return finish(similarity, k, solver.solve());
}

result<cluster_assignment> solve_balanced_assignment_exact(std::span<const float> similarity,
                                                           std::size_t n, std::size_t k,
                                                           std::span<const uint32_t> capacities) {
  if (status s = check_problem(similarity, n, k, capacities); !s.ok()) return s;
  if (n > kMaxExactRows) {
    return status::out_of_range("exact assignment is cubic; N = " + std::to_string(n) +
                                " exceeds its limit of " + std::to_string(kMaxExactRows));
  }
  // One column per unit of capacity; more than N slots of one cluster can never be used.
  std::vector<uint32_t> slot_cluster;
  for (std::size_t c = 0; c < k; ++c) {
    const std::size_t slots = std::min<std::size_t>(capacities[c], n);
    if (slot_cluster.size() + slots > kMaxExactSlots) {
      return status::out_of_range("exact assignment needs more than " +
                                  std::to_string(kMaxExactSlots) + " capacity slots");
    }
    slot_cluster.insert(slot_cluster.end(), slots, static_cast<uint32_t>(c));
  }
  const float* sim = similarity.data();
  const std::vector<uint32_t> slot_of_point =
      hungarian(n, slot_cluster.size(), [&](std::size_t r, std::size_t c) {
        return -static_cast<double>(sim[r * k + slot_cluster[c]]);
      });
  std::vector<uint32_t> cluster_of(n);
  for (std::size_t i = 0; i < n; ++i)
    cluster_of[i] = slot_cluster[slot_of_point[i]];
  return finish(similarity, k, std::move(cluster_of));
}

result<std::vector<uint32_t>> solve_linear_assignment(std::span<const double> cost,
                                                      std::size_t rows, std::size_t cols) {
  if (rows == 0) return status::invalid_argument("linear assignment with no rows");
  if (rows > cols) {
    return status::invalid_argument("linear assignment needs rows <= cols, got " +
                                    std::to_string(rows) + " x " + std::to_string(cols));
  }
  if (rows > kMaxExactRows) {
    return status::out_of_range("linear assignment is cubic; " + std::to_string(rows) +
                                " rows exceed its limit of " + std::to_string(kMaxExactRows));
  }
  if (cost.size() / cols != rows || cost.size() % cols != 0) {
    return status::invalid_argument("cost matrix has " + std::to_string(cost.size()) +
                                    " values, expected " + std::to_string(rows) + " x " +
                                    std::to_string(cols));
  }
  for (std::size_t i = 0; i < cost.size(); ++i) {
    if (!std::isfinite(cost[i])) {
      return status::invalid_argument("cost[" + std::to_string(i / cols) + "][" +
                                      std::to_string(i % cols) + "] is not finite");
    }
  }
  return hungarian(rows, cols, [&](std::size_t r, std::size_t c) { return cost[r * cols + c]; });
}

}  // namespace eldr
