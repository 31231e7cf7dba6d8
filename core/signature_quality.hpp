// signature_quality: how well prefill signatures predict decode-time expert overlap (the paper's
// rho, docs/method.md section 2), and greedy forward layer selection on it (section 3).
//
// rho draws random pairs (i, j), i != j, of calibration requests and takes the Spearman rank
// correlation of x = 1 - cos(sig_i, sig_j) and y = 1 - cos(dec_i, dec_j), where dec is the
// request's decode-phase counts over all layers, L2-normalised. Both the full-signature rho and
// the layer curve use one precomputation: per-layer dot products of the pairs and per-layer
// squared norms, from which the cosine of any concatenation of layers is exact.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.hpp"
#include "core/geometry.hpp"
#include "core/signature.hpp"

namespace eldr {

// Calibration requests as dense counts: prefill and decode, N rows of L * E each.
struct calibration_counts {
  model_geometry geometry;
  std::vector<uint32_t> prefill;  // N * L * E
  std::vector<uint32_t> decode;   // N * L * E
  std::size_t size() const { return geometry.width() == 0 ? 0 : prefill.size() / geometry.width(); }
};

inline constexpr uint32_t default_rho_pairs = 30000;
inline constexpr uint64_t default_rho_seed = 0x5eed;

// Spearman rank correlation (average ranks for ties). Errors: sizes differ, fewer than 2 values.
// A constant input gives 0 (no rank information).
result<double> spearman(std::span<const double> x, std::span<const double> y);

// The pair statistics behind rho for one transform: build once, then ask for the rho of any set
// of layers. Requests without decode tokens are left out (they have no decode profile).
class rho_evaluator {
 public:
  // Errors: geometry invalid, prefill/decode sizes inconsistent, fewer than 2 usable requests,
  // pairs == 0, IDF missing for count_idf.
  static result<rho_evaluator> make(const calibration_counts& cal, signature_transform t,
                                    std::span<const float> idf, uint32_t pairs = default_rho_pairs,
                                    uint64_t seed = default_rho_seed);

  uint32_t layers() const { return layers_; }
  std::size_t usable_requests() const { return usable_; }
  // Pairs are drawn with replacement, and (i, j) is the same pair as (j, i): a trace with few
  // usable requests repeats the same few pairs, and rho over them says little. distinct_pairs()
  // is how many different unordered pairs were drawn, possible_pairs() how many exist
  // (usable * (usable - 1) / 2).
  std::size_t distinct_pairs() const { return distinct_pairs_; }
  uint64_t possible_pairs() const {
    return static_cast<uint64_t>(usable_) * (usable_ == 0 ? 0 : usable_ - 1) / 2;
  }
  // rho of the signature over the given layers (any order, no duplicates, non-empty).
  double rho(std::span<const uint32_t> layers) const;
  double rho_all_layers() const;

  // Per-pair sums over a set of layers (dot products and both squared norms): the state of a
  // greedy search, so scoring "the set plus one layer" costs one pass over the pairs.
  struct pair_sums {
    std::vector<double> dot, norm_i, norm_j;
  };
  pair_sums empty_sums() const;
  void add_layer(pair_sums& sums, uint32_t layer) const;
  // rho of the set behind `sums` plus `layer` (when layer < layers()) or of the set alone.
  double rho_with(const pair_sums& sums, uint32_t layer) const;

 private:
  double rho_from_x(std::vector<double>& x) const;
  uint32_t layers_ = 0;
  std::size_t usable_ = 0;
  std::size_t distinct_pairs_ = 0;
  std::vector<uint32_t> pair_i_, pair_j_;  // indices into the usable requests
  std::vector<double> pair_dot_;           // layers x pairs: per-layer dot of the pair's vectors
  std::vector<double> norm2_;              // layers x usable: per-layer squared norms
  std::vector<double> y_rank_;             // ranks of the decode distances, fixed per evaluator
  double y_rank_mean_ = 0.0, y_rank_ss_ = 0.0;
};

// Greedy forward selection: start empty; repeatedly add the layer that maximises rho; record rho
// after each step until all layers are in. n_star = argmax + 1 (earliest on ties); mask = the
// first n_star layers chosen, ascending.
struct layer_curve {
  std::vector<uint32_t> order;  // layers in the order chosen
  std::vector<double> rho;      // rho after each step (same length as order)
  uint32_t n_star = 0;
  std::vector<uint32_t> mask;
};

// threads: candidate layers are scored in parallel; the result does not depend on it.
layer_curve select_layers(const rho_evaluator& eval, unsigned threads = 2);

}  // namespace eldr
