// vector_math: the few dense kernels every hot loop in eldr is built from.
//
// They are compiled for baseline x86-64 and for AVX2+FMA, and the loader picks the best one the
// CPU has (GCC function multiversioning), so binaries stay portable and still fast.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eldr {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, std::size_t n);
// sum_i a[i]^2
float squared_norm(const float* a, std::size_t n);
// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, std::size_t n);
// Scales a to unit L2 norm; returns its norm before scaling. An all-zero vector stays zero.
float normalize(float* a, std::size_t n);
// out[j] = sum_i weight[i] * rows[index[i] * stride + j] for j < n: a sparse vector (index, weight;
// count entries) times a row-major matrix with `stride` floats per row. The caller guarantees every
// index[i] names a row and stride >= n. Blocks of up to 64 columns stay in registers while the
// nonzeros stream past, so the matrix is read once; rows start 32-byte aligned when rows is and
// stride is a multiple of 8, which keeps every load inside one cache line.
void weighted_row_sum(const uint32_t* index, const float* weight, std::size_t count,
                      const float* rows, std::size_t stride, float* out, std::size_t n);

}  // namespace eldr
