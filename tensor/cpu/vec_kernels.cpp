// The row kernels of vec_math.h. AVX2 runs the exp polynomial eight lanes at a time instead of
// four, which more than halves GELU, softmax, sigmoid and tanh, and AVX-512 sixteen, which
// halves them again; the baseline clone keeps pipit running on any x86-64 CPU. This file is
// compiled without FMA contraction (CMakeLists.txt), so every clone gives the same bits.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/vec_math.h"
#include "tensor/dtype.h"

// Clones dispatch through an ifunc resolver, which runs before the sanitizer runtime starts.
#if defined(__x86_64__) && !defined(PIPIT_SANITIZE)
#define PIPIT_ROW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PIPIT_ROW_KERNEL
#endif

namespace pipit::cpu {

PIPIT_ROW_KERNEL void exp_shifted_row(const float* x, float shift, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fast_exp(x[i] - shift);
}

PIPIT_ROW_KERNEL void gelu_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}

PIPIT_ROW_KERNEL void gelu_backward_row(const float* grad, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = grad[i] * gelu_derivative(x[i]);
}

namespace {

// f32 x holding every bf16 value, in the order of their bits.
std::vector<float> every_bf16() {
  std::vector<float> x(1 << 16);
  for (uint32_t bits = 0; bits < x.size(); ++bits) x[bits] = bfloat16_to_float(uint16_t(bits));
  return x;
}

}  // namespace

const uint16_t* bf16_gelu_table() {
  static const std::vector<uint16_t> table = [] {
    const std::vector<float> x = every_bf16();
    std::vector<float> y(x.size());
    std::vector<uint16_t> rounded(x.size());
    gelu_row(x.data(), y.data(), int64_t(x.size()));
    round_bf16_row(y.data(), rounded.data(), int64_t(x.size()));
    return rounded;
  }();
  return table.data();
}

const float* bf16_gelu_derivative_table() {
  static const std::vector<float> table = [] {
    const std::vector<float> x = every_bf16(), ones(x.size(), 1.0f);
    std::vector<float> derivative(x.size());
    gelu_backward_row(ones.data(), x.data(), derivative.data(), int64_t(x.size()));
    return derivative;
  }();
  return table.data();
}

PIPIT_ROW_KERNEL void gelu_bf16_row(const uint16_t* table, const uint16_t* x, uint16_t* y,
                                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = table[x[i]];
}

PIPIT_ROW_KERNEL void gelu_backward_bf16_row(const float* derivative, const uint16_t* grad,
                                             const uint16_t* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = float_to_bfloat16(bfloat16_to_float(grad[i]) * derivative[x[i]]);
  }
}

PIPIT_ROW_KERNEL void widen_bf16_row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bfloat16_to_float(x[i]);
}

namespace {

PIPIT_ROW_KERNEL void round_bf16_portable(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bfloat16(x[i]);
}

#if defined(__x86_64__)
// AVX512_BF16's conversion rounds as float_to_bfloat16 does, NaNs included, but reads a
// subnormal input as zero: a vector holding one takes the scalar conversion.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_bf16_converting(
    const float* x, uint16_t* y, int64_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512i bits = _mm512_maskz_loadu_epi32(lanes, x + i);
    const __mmask16 subnormal =
        _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(bits, mantissa), bits, exponent);
    if (subnormal != 0) {
      round_bf16_portable(x + i, y + i, std::min<int64_t>(16, n - i));
      continue;
    }
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_castsi512_ps(bits));
    _mm256_mask_storeu_epi16(y + i, lanes, reinterpret_cast<const __m256i&>(rounded));
  }
}
#endif

}  // namespace

void round_bf16_row(const float* x, uint16_t* y, int64_t n) {
#if defined(__x86_64__)
  static const bool converts = __builtin_cpu_supports("avx512bf16") &&
                               __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl");
  if (converts) return round_bf16_converting(x, y, n);
#endif
  round_bf16_portable(x, y, n);
}

PIPIT_ROW_KERNEL void sigmoid_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid(x[i]);
}

PIPIT_ROW_KERNEL void tanh_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fast_tanh(x[i]);
}

namespace {

using Float8 = float __attribute__((vector_size(32)));
using Bits8 = uint32_t __attribute__((vector_size(32)));
using Half8 = uint16_t __attribute__((vector_size(16)));

[[gnu::always_inline]] inline float widen(float x) {
  return x;
}
[[gnu::always_inline]] inline float widen(uint16_t x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}

// sums[r * C + j] = sum_k a[r, k] w_j[k] for R rows of a (row stride K) and C weight rows w_j
// (w + j * ldw), each in lane_sum's order; each load of a row of w serves the R rows of a and
// each load of a the C rows of w. Vectors stay local: passed or returned, GCC warns that their
// ABI differs between the two clones.
template <int R, int C, typename W>
[[gnu::always_inline]] inline void rows_by_weight(const float* a, int64_t K, const W* w,
                                                  int64_t ldw, float* sums) {
  Float8 acc[R][C] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    // The next C rows of w, as far into them as these are: the hardware prefetcher loses
    // track of C interleaved streams, and generation reads w from memory, not from cache.
    __builtin_prefetch(w + C * ldw + C * k);
    Float8 wide[C];
    for (int j = 0; j < C; ++j) {
      // memcpy into locals: unaligned loads that stay in registers.
      if constexpr (std::is_same_v<W, float>) {
        Float8 loaded;
        std::memcpy(&loaded, w + j * ldw + k, sizeof loaded);
        wide[j] = loaded;
      } else {
        // bf16 is the top half of an f32: widening is a shift (the cast keeps the bits).
        Half8 half;
        std::memcpy(&half, w + j * ldw + k, sizeof half);
        wide[j] = (Float8)(__builtin_convertvector(half, Bits8) << 16);
      }
    }
    for (int r = 0; r < R; ++r) {
      Float8 x;
      std::memcpy(&x, a + r * K + k, sizeof x);
      for (int j = 0; j < C; ++j) acc[r][j] += x * wide[j];
    }
  }
  for (int l = 0; k + l < K; ++l) {
    for (int j = 0; j < C; ++j) {
      const float wide = widen(w[j * ldw + k + l]);
      for (int r = 0; r < R; ++r) acc[r][j][l] += a[r * K + k + l] * wide;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) {
      const Float8& v = acc[r][j];
      sums[r * C + j] = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
    }
  }
}

// Rows [m, m + R) by columns [n, n + C) into c.
template <int R, int C, typename W>
[[gnu::always_inline]] inline void weight_block(int64_t m, int64_t n, int64_t K, const float* a,
                                                const W* bt, int64_t ldb, float beta, float* c,
                                                int64_t ldc) {
  float sums[R * C];
  rows_by_weight<R, C>(a + m * K, K, bt + n * ldb, ldb, sums);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) {
      float& out = c[(m + r) * ldc + n + j];
      out = beta == 0.0f ? sums[r * C + j] : beta * out + sums[r * C + j];
    }
  }
}

template <typename W>
[[gnu::always_inline]] inline void columns_by_weight(int64_t M, int64_t n0, int64_t n1, int64_t K,
                                                     const float* a, const W* bt, int64_t ldb,
                                                     float beta, float* c, int64_t ldc) {
  // Blocks of 4 rows by 2 columns, or 1 row by 4 columns: a dozen vector registers at most.
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
      weight_block<4, 2>(m, n, K, a, bt, ldb, beta, c, ldc);
      weight_block<4, 2>(m, n + 2, K, a, bt, ldb, beta, c, ldc);
    }
    for (; m < M; ++m) weight_block<1, 4>(m, n, K, a, bt, ldb, beta, c, ldc);
  }
  for (; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) weight_block<4, 1>(m, n, K, a, bt, ldb, beta, c, ldc);
    for (; m < M; ++m) weight_block<1, 1>(m, n, K, a, bt, ldb, beta, c, ldc);
  }
}

}  // namespace

PIPIT_ROW_KERNEL void weight_columns(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* a,
                                     const float* bt, int64_t ldb, float beta, float* c,
                                     int64_t ldc) {
  columns_by_weight(M, n0, n1, K, a, bt, ldb, beta, c, ldc);
}

PIPIT_ROW_KERNEL void weight_columns(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* a,
                                     const uint16_t* bt, int64_t ldb, float beta, float* c,
                                     int64_t ldc) {
  columns_by_weight(M, n0, n1, K, a, bt, ldb, beta, c, ldc);
}

}  // namespace pipit::cpu
