// vector_math: portable kernels with an AVX2+FMA clone. Four independent accumulators let the
// compiler vectorise the reductions without -ffast-math (which would change results silently).
#include "core/vector_math.hpp"

#include <cmath>

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define ELDR_MULTIVERSION __attribute__((target_clones("avx2,fma", "default")))
#else
#define ELDR_MULTIVERSION
#endif

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

}  // namespace eldr
