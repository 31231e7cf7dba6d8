// centroid_set: the K unit-norm centroids a request's signature is scored against, one per decode
// worker (centroid k belongs to worker k), stamped with the epoch of the fit that produced them
// (docs/method.md sections 4 and 5).
//
// Immutable once built, so one set is shared by pointer between the router, the simulator and the
// admin surface, and a refit replaces the whole set instead of editing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <vector>

#include "core/base/status.hpp"
#include "core/signature.hpp"

namespace eldr {

namespace detail {
// Allocator handing out 64-byte aligned storage, so that rows padded to a multiple of 8 floats
// never straddle a cache line under 32-byte loads.
template <class T>
struct cache_aligned_allocator {
  using value_type = T;
  static constexpr std::align_val_t alignment{64};
  cache_aligned_allocator() = default;
  template <class U>
  cache_aligned_allocator(const cache_aligned_allocator<U>&) {}  // NOLINT: rebind
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), alignment)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, alignment); }
  template <class U>
  bool operator==(const cache_aligned_allocator<U>&) const {
    return true;
  }
};
}  // namespace detail

class centroid_set {
 public:
  // Builds a set from K rows of `width` floats, row-major (row k is worker k's centroid).
  // Errors (invalid_argument): k or width is 0; row_major.size() != k * width; a value is NaN or
  // infinite; a row is all zero (it has no direction).
  // Rows that are not unit length are RE-NORMALISED, not rejected: a centroid means only its
  // direction (the spherical K-means re-normalises every iteration anyway), and float rounding in
  // a fit or a file must not make a valid set unloadable.
  static result<centroid_set> make(uint32_t k, uint32_t width, std::vector<float> row_major,
                                   uint64_t epoch);

  uint32_t k() const { return k_; }          // number of centroids = decode workers
  uint32_t width() const { return width_; }  // dimension D, equal to the signatures' width
  uint64_t epoch() const { return epoch_; }  // which fit produced the set

  // Centroid of worker k (unit norm, width() floats). Precondition: worker < k() (asserted).
  std::span<const float> row(uint32_t worker) const;
  // All centroids, row-major, k() * width() floats.
  std::span<const float> rows() const { return rows_; }

  // s_k = c_k . v for every worker into out[0..k()). Allocation-free; safe to call from many
  // threads at once. Every nonzero of v adds one contiguous, K-wide row of a D x K transposed copy,
  // so the cost is proportional to nnz(v) * K for sparse and near-dense signatures alike (measured
  // faster than K dense dot products even at 95% density, see bench/routing_bench.cpp).
  // Errors (invalid_argument): v.width != width(); v.index and v.value differ in length; indices
  // not strictly increasing or >= width; out.size() != k(); a non-finite value in v (detected
  // from the scores, which it turns non-finite). out is unspecified after an error.
  status score(const signature& v, std::span<float> out) const;

  // The same scores for a dense vector of width() floats (e.g. a refit's in-memory points).
  // Errors (invalid_argument): v.size() != width(); out.size() != k(); a non-finite value in v.
  status score_dense(std::span<const float> v, std::span<float> out) const;

 private:
  centroid_set() = default;

  uint32_t k_ = 0;
  uint32_t width_ = 0;
  uint32_t stride_ = 0;  // k_ rounded up to a multiple of 8: floats per row of by_dimension_
  uint64_t epoch_ = 0;
  std::vector<float> rows_;  // k x width, row-major
  // width x stride: by_dimension_[d * stride + k] = rows_[k * width + d], zero padded.
  std::vector<float, detail::cache_aligned_allocator<float>> by_dimension_;
};

}  // namespace eldr
