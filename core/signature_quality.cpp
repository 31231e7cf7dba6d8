// signature_quality: rho and greedy layer selection.
#include "core/signature_quality.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <thread>

#include "core/base/random.hpp"

namespace eldr {
namespace {

// Average ranks (1-based), ties sharing the mean of their positions. Sorts (value, index) pairs
// held together: a comparator that chases indices into the values is several times slower, and
// layer selection ranks 30,000 distances about L^2 / 2 times.
void average_ranks(std::span<const double> v, std::vector<std::pair<double, uint32_t>>& sorted,
                   std::vector<double>& rank) {
  sorted.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    sorted[i] = {v[i], static_cast<uint32_t>(i)};
  std::sort(sorted.begin(), sorted.end());
  rank.resize(v.size());
  std::size_t i = 0;
  while (i < sorted.size()) {
    std::size_t j = i + 1;
    while (j < sorted.size() && sorted[j].first == sorted[i].first)
      ++j;
    const double r = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2.0 + 1.0;
    for (std::size_t t = i; t < j; ++t)
      rank[sorted[t].second] = r;
    i = j;
  }
}

double transform_value(signature_transform t, uint32_t c, float idf) {
  switch (t) {
    case signature_transform::count:
      return c;
    case signature_transform::sqrt:
      return std::sqrt(static_cast<double>(c));
    case signature_transform::count_idf:
      return static_cast<double>(c) * idf;
    case signature_transform::binary:
      return c > 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

}  // namespace

result<double> spearman(std::span<const double> x, std::span<const double> y) {
  if (x.size() != y.size())
    return status::invalid_argument("spearman: " + std::to_string(x.size()) + " x values but " +
                                    std::to_string(y.size()) + " y values");
  if (x.size() < 2) return status::invalid_argument("spearman needs at least 2 pairs");
  std::vector<std::pair<double, uint32_t>> order;
  std::vector<double> rx, ry;
  average_ranks(x, order, rx);
  average_ranks(y, order, ry);
  const double mean = (static_cast<double>(x.size()) + 1.0) / 2.0;
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (rx[i] - mean) * (ry[i] - mean);
    sxx += (rx[i] - mean) * (rx[i] - mean);
    syy += (ry[i] - mean) * (ry[i] - mean);
  }
  if (sxx == 0 || syy == 0) return 0.0;
  return sxy / std::sqrt(sxx * syy);
}

result<rho_evaluator> rho_evaluator::make(const calibration_counts& cal, signature_transform t,
                                          std::span<const float> idf, uint32_t pairs,
                                          uint64_t seed) {
  const model_geometry& g = cal.geometry;
  if (status s = g.validate(); !s.ok()) return s;
  const std::size_t w = g.width();
  if (cal.prefill.size() % w != 0 || cal.prefill.size() != cal.decode.size())
    return status::invalid_argument(
        "calibration counts: prefill (" + std::to_string(cal.prefill.size()) + ") and decode (" +
        std::to_string(cal.decode.size()) + ") must both hold N * layers * experts counts");
  if (pairs == 0) return status::invalid_argument("rho needs at least one pair");
  if (t == signature_transform::count_idf && idf.size() != w)
    return status::invalid_argument("count_idf needs " + std::to_string(w) + " IDF weights, got " +
                                    std::to_string(idf.size()));
  const std::size_t n = cal.size();
  std::vector<std::size_t> usable;
  for (std::size_t r = 0; r < n; ++r) {
    const uint32_t* dec = cal.decode.data() + r * w;
    if (std::any_of(dec, dec + w, [](uint32_t c) { return c > 0; })) usable.push_back(r);
  }
  if (usable.size() < 2)
    return status::invalid_argument(
        "rho needs at least 2 calibration requests with decode tokens, got " +
        std::to_string(usable.size()));

  rho_evaluator ev;
  ev.layers_ = g.layers;
  ev.usable_ = usable.size();
  rng_engine rng(seed);
  ev.pair_i_.resize(pairs);
  ev.pair_j_.resize(pairs);
  for (uint32_t p = 0; p < pairs; ++p) {
    const auto i = static_cast<uint32_t>(uniform_index(rng, usable.size()));
    auto j = static_cast<uint32_t>(uniform_index(rng, usable.size() - 1));
    if (j >= i) ++j;  // uniform over j != i
    ev.pair_i_[p] = i;
    ev.pair_j_[p] = j;
  }
  {
    std::vector<uint64_t> keys(pairs);
    for (uint32_t p = 0; p < pairs; ++p) {
      const uint64_t lo = std::min(ev.pair_i_[p], ev.pair_j_[p]);
      const uint64_t hi = std::max(ev.pair_i_[p], ev.pair_j_[p]);
      keys[p] = (hi << 32) | lo;
    }
    std::sort(keys.begin(), keys.end());
    ev.distinct_pairs_ =
        static_cast<std::size_t>(std::unique(keys.begin(), keys.end()) - keys.begin());
  }

  // Transformed prefill vectors (unnormalised: the global normalisation is applied through the
  // per-layer norms) and normalised decode profiles.
  const std::size_t u = usable.size();
  std::vector<double> sig(u * w), dec(u * w);
  for (std::size_t a = 0; a < u; ++a) {
    const uint32_t* pre = cal.prefill.data() + usable[a] * w;
    const uint32_t* de = cal.decode.data() + usable[a] * w;
    double dn = 0;
    for (std::size_t d = 0; d < w; ++d) {
      sig[a * w + d] = transform_value(t, pre[d], idf.empty() ? 0.0f : idf[d]);
      dec[a * w + d] = de[d];
      dn += static_cast<double>(de[d]) * de[d];
    }
    dn = std::sqrt(dn);
    for (std::size_t d = 0; d < w; ++d)
      dec[a * w + d] /= dn;
  }
  const uint32_t e_count = g.experts;
  ev.norm2_.assign(std::size_t{g.layers} * u, 0.0);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (std::size_t a = 0; a < u; ++a) {
      const double* v = sig.data() + a * w + std::size_t{l} * e_count;
      double s = 0;
      for (uint32_t e = 0; e < e_count; ++e)
        s += v[e] * v[e];
      ev.norm2_[l * u + a] = s;
    }
  ev.pair_dot_.assign(std::size_t{g.layers} * pairs, 0.0);
  std::vector<double> y(pairs);
  for (uint32_t p = 0; p < pairs; ++p) {
    const double* si = sig.data() + ev.pair_i_[p] * w;
    const double* sj = sig.data() + ev.pair_j_[p] * w;
    for (uint32_t l = 0; l < g.layers; ++l) {
      double s = 0;
      for (uint32_t e = 0; e < e_count; ++e)
        s += si[l * e_count + e] * sj[l * e_count + e];
      ev.pair_dot_[std::size_t{l} * pairs + p] = s;
    }
    const double* di = dec.data() + ev.pair_i_[p] * w;
    const double* dj = dec.data() + ev.pair_j_[p] * w;
    double c = 0;
    for (std::size_t d = 0; d < w; ++d)
      c += di[d] * dj[d];
    y[p] = 1.0 - c;
  }
  std::vector<std::pair<double, uint32_t>> order;
  average_ranks(y, order, ev.y_rank_);
  ev.y_rank_mean_ = (static_cast<double>(pairs) + 1.0) / 2.0;
  for (double r : ev.y_rank_)
    ev.y_rank_ss_ += (r - ev.y_rank_mean_) * (r - ev.y_rank_mean_);
  return ev;
}

double rho_evaluator::rho_from_x(std::vector<double>& x) const {
  std::vector<std::pair<double, uint32_t>> order;
  std::vector<double> rx;
  average_ranks(x, order, rx);
  double sxy = 0, sxx = 0;
  for (std::size_t p = 0; p < rx.size(); ++p) {
    const double dx = rx[p] - y_rank_mean_;
    sxy += dx * (y_rank_[p] - y_rank_mean_);
    sxx += dx * dx;
  }
  if (sxx == 0 || y_rank_ss_ == 0) return 0.0;
  return sxy / std::sqrt(sxx * y_rank_ss_);
}

rho_evaluator::pair_sums rho_evaluator::empty_sums() const {
  const std::size_t pairs = pair_i_.size();
  return {std::vector<double>(pairs, 0.0), std::vector<double>(pairs, 0.0),
          std::vector<double>(pairs, 0.0)};
}

void rho_evaluator::add_layer(pair_sums& sums, uint32_t layer) const {
  const std::size_t pairs = pair_i_.size();
  const double* pd = pair_dot_.data() + std::size_t{layer} * pairs;
  const double* nl = norm2_.data() + std::size_t{layer} * usable_;
  for (std::size_t p = 0; p < pairs; ++p) {
    sums.dot[p] += pd[p];
    sums.norm_i[p] += nl[pair_i_[p]];
    sums.norm_j[p] += nl[pair_j_[p]];
  }
}

double rho_evaluator::rho_with(const pair_sums& sums, uint32_t layer) const {
  const std::size_t pairs = pair_i_.size();
  const bool extra = layer < layers_;
  const double* pd = extra ? pair_dot_.data() + std::size_t{layer} * pairs : nullptr;
  const double* nl = extra ? norm2_.data() + std::size_t{layer} * usable_ : nullptr;
  std::vector<double> x(pairs);
  for (std::size_t p = 0; p < pairs; ++p) {
    const double dot = sums.dot[p] + (extra ? pd[p] : 0.0);
    const double ni = sums.norm_i[p] + (extra ? nl[pair_i_[p]] : 0.0);
    const double nj = sums.norm_j[p] + (extra ? nl[pair_j_[p]] : 0.0);
    const double denom = std::sqrt(ni * nj);
    // A zero vector (e.g. count_idf on experts every request uses) has no direction: distance 1.
    x[p] = 1.0 - (denom > 0 ? dot / denom : 0.0);
  }
  return rho_from_x(x);
}

double rho_evaluator::rho(std::span<const uint32_t> layers) const {
  pair_sums sums = empty_sums();
  for (uint32_t l : layers)
    add_layer(sums, l);
  return rho_with(sums, layers_);
}

double rho_evaluator::rho_all_layers() const {
  std::vector<uint32_t> all(layers_);
  std::iota(all.begin(), all.end(), 0u);
  return rho(all);
}

layer_curve select_layers(const rho_evaluator& eval, unsigned threads) {
  layer_curve curve;
  const uint32_t layers = eval.layers();
  std::vector<uint8_t> taken(layers, 0);
  threads = std::max(1u, threads);
  rho_evaluator::pair_sums chosen = eval.empty_sums();
  for (uint32_t step = 0; step < layers; ++step) {
    std::vector<uint32_t> candidates;
    for (uint32_t l = 0; l < layers; ++l)
      if (!taken[l]) candidates.push_back(l);
    std::vector<double> score(candidates.size());
    auto work = [&](std::size_t first) {
      for (std::size_t c = first; c < candidates.size(); c += threads)
        score[c] = eval.rho_with(chosen, candidates[c]);
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads && t < candidates.size(); ++t)
      pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool)
      th.join();
    // Earliest candidate (lowest layer) wins ties, so the curve is deterministic.
    const auto best =
        static_cast<std::size_t>(std::max_element(score.begin(), score.end()) - score.begin());
    curve.order.push_back(candidates[best]);
    curve.rho.push_back(score[best]);
    taken[candidates[best]] = 1;
    eval.add_layer(chosen, candidates[best]);
  }
  const auto peak = std::max_element(curve.rho.begin(), curve.rho.end());
  curve.n_star = static_cast<uint32_t>(peak - curve.rho.begin()) + 1;
  curve.mask.assign(curve.order.begin(), curve.order.begin() + curve.n_star);
  std::sort(curve.mask.begin(), curve.mask.end());
  return curve;
}

}  // namespace eldr
