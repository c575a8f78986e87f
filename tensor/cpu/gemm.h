#pragma once
// One single-threaded GEMM call through the library matmul.cpp picks for its size (oneDNN or
// OpenBLAS): row-major C[M, N] = op(A) op(B) + beta C, op transposing where ta / tb. The choice
// depends only on the sizes, so callers that split work by shape get the same bits whatever
// the thread count. Internal to the CPU backend's kernels.
#include <cstdint>

namespace pipit::cpu {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

// The same for bf16 operands (their bits) and an f32 C, on the AVX512_BF16 dot product
// (gemm_bf16.cpp); only when cpu_bf16_dot().
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);
// The same into a bf16 C: each f32 sum, plus bias[j] in column j when bias is given, rounded
// once as the kernel stores it (no f32 C). Only for K <= kBf16Depth, which the kernel sums
// in one block, so every sum is whole when it is stored.
constexpr int64_t kBf16Depth = 256;
void gemm_bf16_rounded(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                       int64_t lda, const uint16_t* b, int64_t ldb, const float* bias, uint16_t* c,
                       int64_t ldc);

}  // namespace pipit::cpu
