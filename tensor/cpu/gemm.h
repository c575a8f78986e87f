#pragma once
// One single-threaded GEMM call through the library matmul.cpp picks for its size (oneDNN or
// OpenBLAS): row-major C[M, N] = op(A) op(B) + beta C, op transposing where ta / tb. The choice
// depends only on the sizes, so callers that split work by shape get the same bits whatever
// the thread count. Internal to the CPU backend's kernels.
#include <cstdint>
#include <vector>

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

// out[j][i] = in[i][j] for a rows x cols matrix of 32-bit elements (f32, or pairs of bf16), rows
// in_stride and out_stride bytes apart; 16 x 16 blocks at a time where the CPU has AVX-512.
void transpose_words(const void* in, int64_t in_stride, int64_t rows, int64_t cols, void* out,
                     int64_t out_stride);

// B [K, N] (stored as B^T [N, K] when tb) packed once for several products, as the bf16
// kernel reads it: panels of `width` (32 or 64 for gemm_bf16_panels) columns, each a run of
// 32-bit words holding pairs of consecutive k, an odd depth padded with zero. One panel as wide
// as N lays out an A operand pair by pair (pair p of row i is word p N + i).
struct Bf16Panels {
  std::vector<uint32_t> words;
  int64_t columns = 0, depth = 0, width = 64;
};
void pack_bf16(bool tb, int64_t K, int64_t N, const uint16_t* b, int64_t ldb, int64_t width,
               Bf16Panels& out);
// C[M, N] = A B + beta C for the first N <= b.columns columns of b, in one pass over the whole
// depth. A's pair p of row i is the 32-bit word at a + i a_row + p a_pair (in bf16 elements):
// rows where they lie (a_row = lda, a_pair = 2), or packed pair by pair (2, 2 M). A row holds
// b.depth elements rounded up to even: the one past an odd depth must be finite (a zero).
void gemm_bf16_panels(int64_t M, int64_t N, const uint16_t* a, int64_t a_row, int64_t a_pair,
                      const Bf16Panels& b, float beta, float* c, int64_t ldc);

}  // namespace pipit::cpu
