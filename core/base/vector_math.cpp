// vector_math: portable kernels with an AVX2+FMA clone. Four independent accumulators let the
// compiler vectorise the reductions without -ffast-math (which would change results silently).
#include "core/base/vector_math.hpp"

#include <cmath>
#include <cstring>

#include "core/base/multiversion.hpp"

namespace eldr {

ELDR_MULTIVERSION float dot(const float* a, const float* b, std::size_t n) {
  constexpr std::size_t lanes = 16;
  float acc[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j)
      acc[j] += a[i + j] * b[i + j];
  float s = 0.0f;
  for (; i < n; ++i)
    s += a[i] * b[i];
  for (std::size_t j = 0; j < lanes; ++j)
    s += acc[j];
  return s;
}

float squared_norm(const float* a, std::size_t n) {
  return dot(a, a, n);
}

ELDR_MULTIVERSION void axpy(float alpha, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}

float normalize(float* a, std::size_t n) {
  const float norm = std::sqrt(squared_norm(a, n));
  if (norm > 0.0f) {
    const float inv = 1.0f / norm;
    for (std::size_t i = 0; i < n; ++i)
      a[i] *= inv;
  }
  return norm;
}

namespace {

// Eight floats as one value (GCC/Clang vector extension): lowered to one AVX register in the v3
// clone and to two SSE registers in the default one. Plain loops over a float[64] accumulator
// spilled it to the stack on every nonzero (measured 3x slower).
typedef float float8 __attribute__((vector_size(32)));

// One block of 8 * R columns. U independent accumulator sets consume U nonzeros per step: FMA
// latency (4 cycles) needs about 8 chains in flight, so narrow blocks interleave more nonzeros.
template <std::size_t R, std::size_t U>
inline __attribute__((always_inline)) void weighted_row_sum_block(const uint32_t* index,
                                                                  const float* weight,
                                                                  std::size_t count,
                                                                  const float* rows,
                                                                  std::size_t stride, float* out) {
  float8 acc[U][R];
  for (std::size_t u = 0; u < U; ++u)
    for (std::size_t r = 0; r < R; ++r)
      acc[u][r] = float8{};
  std::size_t i = 0;
  for (; i + U <= count; i += U) {
    for (std::size_t u = 0; u < U; ++u) {
      const float* row = rows + static_cast<std::size_t>(index[i + u]) * stride;
      const float w = weight[i + u];
      for (std::size_t r = 0; r < R; ++r) {
        float8 x;
        std::memcpy(&x, row + 8 * r, sizeof x);
        acc[u][r] += w * x;
      }
    }
  }
  for (; i < count; ++i) {
    const float* row = rows + static_cast<std::size_t>(index[i]) * stride;
    const float w = weight[i];
    for (std::size_t r = 0; r < R; ++r) {
      float8 x;
      std::memcpy(&x, row + 8 * r, sizeof x);
      acc[0][r] += w * x;
    }
  }
  for (std::size_t u = 1; u < U; ++u)
    for (std::size_t r = 0; r < R; ++r)
      acc[0][r] += acc[u][r];
  std::memcpy(out, acc[0], sizeof acc[0]);
}

}  // namespace

ELDR_MULTIVERSION void weighted_row_sum(const uint32_t* index, const float* weight,
                                        std::size_t count, const float* rows, std::size_t stride,
                                        float* out, std::size_t n) {
  std::size_t j = 0;
  for (; j + 64 <= n; j += 64)
    weighted_row_sum_block<8, 1>(index, weight, count, rows + j, stride, out + j);
  if (j + 32 <= n) {
    weighted_row_sum_block<4, 2>(index, weight, count, rows + j, stride, out + j);
    j += 32;
  }
  if (j + 16 <= n) {
    weighted_row_sum_block<2, 4>(index, weight, count, rows + j, stride, out + j);
    j += 16;
  }
  if (j + 8 <= n) {
    weighted_row_sum_block<1, 8>(index, weight, count, rows + j, stride, out + j);
    j += 8;
  }
  // Fewer than 8 columns left (K not a multiple of 8): scalar, rare.
  for (; j < n; ++j) {
    float s = 0.0f;
    for (std::size_t i = 0; i < count; ++i)
      s += weight[i] * rows[static_cast<std::size_t>(index[i]) * stride + j];
    out[j] = s;
  }
}

}  // namespace eldr
