// centroid_set: validation, normalisation, the transposed copy, and scoring.
#include "core/centroid_set.hpp"

#include <cassert>
#include <cmath>
#include <string>

#include "core/base/vector_math.hpp"

namespace eldr {
namespace {

// Names the first structural problem of a signature for the error message. Only called once the
// fast check has failed, so it may be slow and allocate.
status describe_bad_signature(const signature& v, uint32_t width) {
  if (v.index.size() != v.value.size())
    return status::invalid_argument("signature has " + std::to_string(v.index.size()) +
                                    " indices but " + std::to_string(v.value.size()) + " values");
  for (std::size_t i = 0; i < v.index.size(); ++i) {
    if (v.index[i] >= width)
      return status::invalid_argument("signature index " + std::to_string(v.index[i]) +
                                      " at position " + std::to_string(i) +
                                      " is outside its width " + std::to_string(width));
    if (i > 0 && v.index[i] <= v.index[i - 1])
      return status::invalid_argument("signature indices are not strictly increasing at position " +
                                      std::to_string(i) + " (" + std::to_string(v.index[i - 1]) +
                                      " then " + std::to_string(v.index[i]) + ")");
  }
  return status::invalid_argument("signature is malformed");
}

// ok when every score is finite; a NaN or infinite input value spreads to every score, so this
// K-long check stands in for a pass over all nnz input values.
status check_scores(std::span<const float> out, const char* what) {
  for (float s : out)
    if (!std::isfinite(s))
      return status::invalid_argument(std::string(what) +
                                      " has a non-finite value (or values so large that a score "
                                      "overflows)");
  return {};
}

}  // namespace

result<centroid_set> centroid_set::make(uint32_t k, uint32_t width, std::vector<float> row_major,
                                        uint64_t epoch) {
  if (k == 0) return status::invalid_argument("centroid set: K must be >= 1, got 0");
  if (width == 0) return status::invalid_argument("centroid set: width must be >= 1, got 0");
  const uint64_t expected = static_cast<uint64_t>(k) * width;
  if (row_major.size() != expected)
    return status::invalid_argument(
        "centroid set: expected K * width = " + std::to_string(k) + " * " + std::to_string(width) +
        " = " + std::to_string(expected) + " values, got " + std::to_string(row_major.size()));

  for (uint32_t r = 0; r < k; ++r) {
    float* row = row_major.data() + static_cast<std::size_t>(r) * width;
    double squared = 0.0;  // double: a float sum over 6,144 values would lose the last digits
    for (uint32_t d = 0; d < width; ++d) {
      if (!std::isfinite(row[d]))
        return status::invalid_argument("centroid set: centroid " + std::to_string(r) +
                                        " has a non-finite value at dimension " +
                                        std::to_string(d));
      squared += static_cast<double>(row[d]) * row[d];
    }
    if (squared == 0.0)
      return status::invalid_argument("centroid set: centroid " + std::to_string(r) +
                                      " is all zero and has no direction");
    const double inv = 1.0 / std::sqrt(squared);
    for (uint32_t d = 0; d < width; ++d)
      row[d] = static_cast<float>(row[d] * inv);
  }

  centroid_set set;
  set.k_ = k;
  set.width_ = width;
  set.stride_ = (k + 7u) / 8u * 8u;
  set.epoch_ = epoch;
  set.by_dimension_.assign(static_cast<std::size_t>(width) * set.stride_, 0.0f);
  for (uint32_t r = 0; r < k; ++r)
    for (uint32_t d = 0; d < width; ++d)
      set.by_dimension_[static_cast<std::size_t>(d) * set.stride_ + r] =
          row_major[static_cast<std::size_t>(r) * width + d];
  set.rows_ = std::move(row_major);
  return set;
}

std::span<const float> centroid_set::row(uint32_t worker) const {
  assert(worker < k_);
  return std::span<const float>(rows_).subspan(static_cast<std::size_t>(worker) * width_, width_);
}

status centroid_set::score(const signature& v, std::span<float> out) const {
  if (v.width != width_)
    return status::invalid_argument(
        "signature width " + std::to_string(v.width) + " does not match the centroid set's width " +
        std::to_string(width_) + " (epoch " + std::to_string(epoch_) + ")");
  if (out.size() != k_)
    return status::invalid_argument("score output has " + std::to_string(out.size()) +
                                    " slots, expected K = " + std::to_string(k_));
  const std::size_t n = v.index.size();
  // Structure check without branches in the loop (it vectorises): strictly increasing indices
  // whose last one is in range are all in range, which is what keeps the kernel's reads in bounds.
  bool well_formed = v.value.size() == n && (n == 0 || v.index[n - 1] < width_);
  if (well_formed) {
    unsigned increasing = 1;
    for (std::size_t i = 1; i < n; ++i)
      increasing &= v.index[i] > v.index[i - 1] ? 1u : 0u;
    well_formed = increasing != 0;
  }
  if (!well_formed) return describe_bad_signature(v, width_);

  weighted_row_sum(v.index.data(), v.value.data(), n, by_dimension_.data(), stride_, out.data(),
                   k_);
  return check_scores(out, "signature");
}

status centroid_set::score_dense(std::span<const float> v, std::span<float> out) const {
  if (v.size() != width_)
    return status::invalid_argument("dense vector has " + std::to_string(v.size()) +
                                    " values, expected the centroid set's width " +
                                    std::to_string(width_));
  if (out.size() != k_)
    return status::invalid_argument("score output has " + std::to_string(out.size()) +
                                    " slots, expected K = " + std::to_string(k_));
  for (uint32_t r = 0; r < k_; ++r)
    out[r] = dot(rows_.data() + static_cast<std::size_t>(r) * width_, v.data(), width_);
  return check_scores(out, "dense vector");
}

}  // namespace eldr
