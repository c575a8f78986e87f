// bf16 x bf16 -> f32 GEMM on the AVX512_BF16 dot product (vdpbf16ps: each f32 lane adds the
// products of two bf16 pairs, twice the multiply-adds of an f32 FMA per instruction), for
// CPUs that have it (Zen 4 and later, Cooper Lake, Sapphire Rapids and later). Others, and
// set_cpu_bf16_dot(false), widen the operands to f32 and run the f32 GEMM (matmul.cpp).
//
// The loops are BLIS's: for each kNc columns of B, for each kKc of the depth, B's block is
// packed (256 KB, in L2); for each kMc rows of A, A's block is packed (48 KB); then a
// kMr x kNr micro-kernel sweeps the blocks, its B panel (32 KB) staying in L1 while it walks
// down A. Packing lays each operand out as the instruction reads it: pairs of consecutive k
// in one 32-bit word, an odd depth padded with a zero. A row-major A of even depth already
// lies that way, row by row, and is read in place (its packing was a tenth of a bf16 GPT
// step); a transposed A is packed pair by pair, B^T by 16 x 16 transposes of 32-bit words.
// Block sizes are constants, so a product's bits depend only on its shape, not on how a
// caller cuts it. Attention's products (tensor/cpu/attention.cpp) take B packed once
// (Bf16Panels) and a 12 x 32 kernel for panels as wide as a head.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/gemm.h"

namespace pipit {
namespace {

std::atomic<bool> g_enabled{true};

bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
}

}  // namespace

void set_cpu_bf16_dot(bool enabled) {
  g_enabled = enabled;
}

bool cpu_bf16_dot() {
  return g_enabled.load(std::memory_order_relaxed) && cpu_has_bf16_dot();
}

namespace cpu {
namespace {

constexpr int64_t kMr = 6;           // rows of C per micro-kernel: 24 accumulators of 32 registers
constexpr int64_t kNr = 64;          // columns: four 16-lane registers
constexpr int64_t kKc = kBf16Depth;  // depth per block (128 pairs): a B panel is 32 KB
constexpr int64_t kMc = 96;          // rows of A per packed block
constexpr int64_t kNc = 512;         // columns of B per packed block

// Interleaves two runs of n bf16 (low, and high or, past an odd depth, none) into 32-bit pairs,
// 16 at a time. The zero-masked forms: GCC 12 warns that the plain ones' undefined sources are
// uninitialized.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void interleave_pairs(const uint16_t* low,
                                                                           const uint16_t* high,
                                                                           int64_t n,
                                                                           uint32_t* out) {
  constexpr __mmask16 kAll = 0xffff;
  for (int64_t r = 0; r < n; r += 16) {
    const __mmask16 valid = n - r >= 16 ? kAll : __mmask16((1u << (n - r)) - 1);
    __m512i words = _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(valid, low + r));
    if (high) {
      const __m512i upper =
          _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(valid, high + r));
      words = _mm512_or_si512(words, _mm512_maskz_slli_epi32(kAll, upper, 16));
    }
    _mm512_mask_storeu_epi32(out + r, valid, words);
  }
}

// out[j][i] = in[i][j] for 16 x 16 32-bit words, rows `in_stride` and `out_stride` bytes
// apart: unpacking pairs of rows, then pairs of those, then 128-bit lanes. The zero-masked
// forms, as in round_to_bf16.
__attribute__((target("avx512f"))) void transpose_16x16(const char* in, int64_t in_stride,
                                                        char* out, int64_t out_stride) {
  constexpr __mmask16 kAll = 0xffff;
  constexpr __mmask8 kAll8 = 0xff;
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * in_stride);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(kAll, r[i], r[i + 1]);
  }
  // r[4 g + c] now holds, in 128-bit lane L, column 4 L + c of rows 4 g .. 4 g + 3.
  for (int g = 0; g < 4; ++g) {
    r[4 * g] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i low0 = _mm512_maskz_shuffle_i32x4(kAll, r[c], r[4 + c], 0x88),
                  high0 = _mm512_maskz_shuffle_i32x4(kAll, r[c], r[4 + c], 0xdd),
                  low1 = _mm512_maskz_shuffle_i32x4(kAll, r[8 + c], r[12 + c], 0x88),
                  high1 = _mm512_maskz_shuffle_i32x4(kAll, r[8 + c], r[12 + c], 0xdd);
    const int columns[4] = {c, 8 + c, 4 + c, 12 + c};
    const __m512i results[4] = {_mm512_maskz_shuffle_i32x4(kAll, low0, low1, 0x88),
                                _mm512_maskz_shuffle_i32x4(kAll, low0, low1, 0xdd),
                                _mm512_maskz_shuffle_i32x4(kAll, high0, high1, 0x88),
                                _mm512_maskz_shuffle_i32x4(kAll, high0, high1, 0xdd)};
    for (int i = 0; i < 4; ++i) _mm512_storeu_si512(out + columns[i] * out_stride, results[i]);
  }
}

// Packs rows [0, rows) and depth [0, depth) of a matrix whose element (i, k) lies at
// x[i * i_stride + k * k_stride] as panels of `width` rows: out[panel][pair][r] holds
// (i, 2 pair) in its low half and (i, 2 pair + 1) in its high, rows and depth past the
// matrix's zero. B's panels are its columns, i being n; A's block is one panel of all its rows.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_panels(
    const uint16_t* x, int64_t i_stride, int64_t k_stride, int64_t rows, int64_t depth,
    int64_t width, uint32_t* out) {
  const int64_t pairs = (depth + 1) / 2, full_pairs = depth / 2;
  for (int64_t p0 = 0; p0 < rows; p0 += width, out += pairs * width) {
    const int64_t valid = std::min(width, rows - p0);
    if (valid < width || full_pairs < pairs) std::fill(out, out + pairs * width, 0u);
    const uint16_t* panel = x + p0 * i_stride;
    if (k_stride == 1) {
      // Each row's pairs are consecutive in memory: a transpose of 32-bit words.
      transpose_words(panel, 2 * i_stride, valid, full_pairs, out, 4 * width);
      for (int64_t r = 0; r < valid && full_pairs < pairs; ++r) {
        out[full_pairs * width + r] = panel[r * i_stride + depth - 1];
      }
    } else {
      // i_stride is 1 (a GEMM operand is row- or column-major): rows are consecutive, and each
      // pair interleaves two runs of them.
      for (int64_t pair = 0; pair < pairs; ++pair) {
        const uint16_t* low = panel + 2 * pair * k_stride;
        interleave_pairs(low, pair < full_pairs ? low + k_stride : nullptr, valid,
                         out + pair * width);
      }
    }
  }
}

// Where the micro-kernel stores: f32 c (ldc) plus beta c, or, when rounded is given, the sums
// plus bias (when given, one per column) rounded to bf16 into rounded (ldc).
struct Store {
  float beta;
  float* c;
  uint16_t* rounded;
  const float* bias;
  int64_t ldc;
};

// v rounded to bf16 as float_to_bfloat16 rounds (to nearest even, NaNs quiet), 16 lanes: by
// AVX512_BF16's conversion, which rounds so but reads a subnormal as zero, and where a lane is
// subnormal by integer steps. Their zero-masked forms: GCC 12 warns that the plain ones'
// undefined sources are uninitialized.
__attribute__((target("avx512f,avx512bf16"))) __m256i round_to_bf16(__m512 v) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512i bits = _mm512_castps_si512(v);
  const __mmask16 subnormal =
      _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff)),
                                   bits, _mm512_set1_epi32(0x7f800000));
  if (subnormal == 0) {
    const __m256bh rounded = _mm512_cvtneps_pbh(v);
    return reinterpret_cast<const __m256i&>(rounded);
  }
  const __m512i high = _mm512_maskz_srli_epi32(kAll, bits, 16);
  const __m512i bias =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_maskz_srli_epi32(kAll, _mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(kAll, _mm512_mask_mov_epi32(rounded, nan, quiet));
}

// C[kRows, 16 kVecs] = sum over `pairs` of A's pairs times b_panel's, stored as `out` says, A's
// pair p of row r being the 32-bit word at a + r * a_row + p * a_pair (in bf16 elements): a packed
// panel, or A's rows where they lie. Rows and columns past (rows, cols) are computed from row
// rows - 1 or B's padding and not stored.
template <int kRows, int kVecs>
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(int64_t pairs, const uint16_t* a,
                                                                int64_t a_row, int64_t a_pair,
                                                                const uint32_t* b_panel,
                                                                const Store& out, int64_t rows,
                                                                int64_t cols) {
  constexpr int64_t kCols = 16 * kVecs;
  __m512 acc[kRows][kVecs];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const uint16_t* a_rows[kRows];
  for (int64_t r = 0; r < kRows; ++r) a_rows[r] = a + std::min(r, rows - 1) * a_row;
  for (int64_t pair = 0; pair < pairs; ++pair) {
    __m512bh b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = (__m512bh)_mm512_loadu_si512(b_panel + 16 * v);
    for (int64_t r = 0; r < kRows; ++r) {
      int word;
      std::memcpy(&word, a_rows[r] + pair * a_pair, sizeof word);
      const __m512bh a_pair_r = (__m512bh)_mm512_set1_epi32(word);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_pair_r, b[v]);
    }
    b_panel += kCols;
  }
  const float beta = out.beta;
  const __m512 scale = _mm512_set1_ps(beta);
  if (rows == kRows && cols == kCols) {
    for (int64_t r = 0; r < kRows; ++r) {
      for (int v = 0; v < kVecs; ++v) {
        __m512 value = acc[r][v];
        if (out.rounded) {
          if (out.bias) value = _mm512_add_ps(value, _mm512_loadu_ps(out.bias + 16 * v));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.rounded + r * out.ldc + 16 * v),
                              round_to_bf16(value));
          continue;
        }
        float* row = out.c + r * out.ldc + 16 * v;
        if (beta != 0.0f) value = _mm512_fmadd_ps(scale, _mm512_loadu_ps(row), value);
        _mm512_storeu_ps(row, value);
      }
    }
    return;
  }
  alignas(64) float tile[kRows][kCols];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) _mm512_store_ps(tile[r] + 16 * v, acc[r][v]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      if (out.rounded) {
        out.rounded[r * out.ldc + j] =
            float_to_bfloat16(out.bias ? tile[r][j] + out.bias[j] : tile[r][j]);
        continue;
      }
      float& c = out.c[r * out.ldc + j];
      c = beta != 0.0f ? beta * c + tile[r][j] : tile[r][j];
    }
  }
}

int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// `out` moved to row i, column j.
Store store_at(const Store& out, int64_t i, int64_t j) {
  const int64_t at = i * out.ldc + j;
  return {out.beta, out.c ? out.c + at : nullptr, out.rounded ? out.rounded + at : nullptr,
          out.bias ? out.bias + j : nullptr, out.ldc};
}

// C[M, N] as `out` says, from B's packed panels (`width` columns, `pairs` deep) and A's pairs
// (a + i a_row + p a_pair): the micro-kernel down each panel. A panel 32 wide runs twice the
// rows, so that either kernel holds 24 accumulators.
void sweep(int64_t M, int64_t N, const uint16_t* a, int64_t a_row, int64_t a_pair,
           const uint32_t* panels, int64_t pairs, int64_t width, const Store& out) {
  const int64_t step = width == 32 ? 2 * kMr : kMr;
  for (int64_t j = 0; j < N; j += width) {
    const uint32_t* panel = panels + j * pairs;
    for (int64_t i = 0; i < M; i += step) {
      const int64_t rows = std::min(step, M - i), cols = std::min(width, N - j);
      if (width == 32) {
        micro_kernel<2 * kMr, 2>(pairs, a + i * a_row, a_row, a_pair, panel, store_at(out, i, j),
                                 rows, cols);
      } else {
        micro_kernel<kMr, kNr / 16>(pairs, a + i * a_row, a_row, a_pair, panel, store_at(out, i, j),
                                    rows, cols);
      }
    }
  }
}

// The loops at the top of this file over a whole product, each tile stored as `out` says.
void gemm_blocks(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
                 const uint16_t* b, int64_t ldb, const Store& out) {
  // Reused across calls on this thread: allocating them per call would cost more than a
  // small product.
  thread_local std::vector<uint32_t> a_pack, b_pack;
  a_pack.resize(static_cast<size_t>(round_up(std::min(M, kMc), kMr) * (kKc / 2)));
  b_pack.resize(static_cast<size_t>(round_up(std::min(N, kNc), kNr) * (kKc / 2)));
  for (int64_t n0 = 0; n0 < N; n0 += kNc) {
    const int64_t cols = std::min(kNc, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t depth = std::min(kKc, K - k0), pairs = (depth + 1) / 2;
      const uint16_t* b_block = tb ? b + n0 * ldb + k0 : b + k0 * ldb + n0;
      pack_panels(b_block, tb ? ldb : 1, tb ? 1 : ldb, cols, depth, kNr, b_pack.data());
      for (int64_t m0 = 0; m0 < M; m0 += kMc) {
        const int64_t rows = std::min(kMc, M - m0);
        const uint16_t* a_block = ta ? a + k0 * lda + m0 : a + m0 * lda + k0;
        Store block_out = store_at(out, m0, n0);
        block_out.beta = k0 == 0 ? out.beta : 1.0f;
        // A row-major A's rows already hold its pairs, as the micro-kernel reads them: it reads
        // them in place unless the depth is odd (the last pair needs a zero).
        if (!ta && depth % 2 == 0) {
          sweep(rows, cols, a_block, lda, 2, b_pack.data(), pairs, kNr, block_out);
        } else {
          pack_panels(a_block, ta ? 1 : lda, ta ? lda : 1, rows, depth, rows, a_pack.data());
          sweep(rows, cols, reinterpret_cast<const uint16_t*>(a_pack.data()), 2, 2 * rows,
                b_pack.data(), pairs, kNr, block_out);
        }
      }
    }
  }
}

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_blocks(ta, tb, M, N, K, a, lda, b, ldb, {beta, c, nullptr, nullptr, ldc});
}

void gemm_bf16_rounded(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                       int64_t lda, const uint16_t* b, int64_t ldb, const float* bias, uint16_t* c,
                       int64_t ldc) {
  PIPIT_CHECK(K <= kBf16Depth, "gemm_bf16_rounded: depth ", K, " is over one block");
  gemm_blocks(ta, tb, M, N, K, a, lda, b, ldb, {0.0f, nullptr, c, bias, ldc});
}

void transpose_words(const void* in, int64_t in_stride, int64_t rows, int64_t cols, void* out,
                     int64_t out_stride) {
  const auto* from = static_cast<const char*>(in);
  auto* to = static_cast<char*>(out);
  const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  for (int64_t i = 0; i < full_rows; i += 16) {
    for (int64_t j = 0; j < full_cols; j += 16) {
      transpose_16x16(from + i * in_stride + 4 * j, in_stride, to + j * out_stride + 4 * i,
                      out_stride);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = i < full_rows ? full_cols : 0; j < cols; ++j) {
      std::memcpy(to + j * out_stride + 4 * i, from + i * in_stride + 4 * j, 4);
    }
  }
}

void pack_bf16(bool tb, int64_t K, int64_t N, const uint16_t* b, int64_t ldb, int64_t width,
               Bf16Panels& out) {
  out.columns = N;
  out.depth = K;
  out.width = width;
  out.words.resize(static_cast<size_t>(round_up(N, width) * ((K + 1) / 2)));
  pack_panels(b, tb ? ldb : 1, tb ? 1 : ldb, N, K, width, out.words.data());
}

void gemm_bf16_panels(int64_t M, int64_t N, const uint16_t* a, int64_t a_row, int64_t a_pair,
                      const Bf16Panels& b, float beta, float* c, int64_t ldc) {
  PIPIT_CHECK(N <= b.columns, "gemm_bf16_panels: ", N, " columns of ", b.columns, " packed");
  PIPIT_CHECK(b.width == 32 || b.width == 64, "gemm_bf16_panels: panels ", b.width, " wide");
  sweep(M, N, a, a_row, a_pair, b.words.data(), (b.depth + 1) / 2, b.width,
        {beta, c, nullptr, nullptr, ldc});
}

}  // namespace cpu
}  // namespace pipit
