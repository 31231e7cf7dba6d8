// vector_math: the few dense kernels every hot loop in eldr is built from.
//
// They are compiled for baseline x86-64 and for AVX2+FMA, and the loader picks the best one the
// CPU has (GCC function multiversioning), so binaries stay portable and still fast.
#pragma once

#include <cstddef>

namespace eldr {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, std::size_t n);
// sum_i a[i]^2
float squared_norm(const float* a, std::size_t n);
// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, std::size_t n);
// Scales a to unit L2 norm; returns its norm before scaling. An all-zero vector stays zero.
float normalize(float* a, std::size_t n);

}  // namespace eldr
