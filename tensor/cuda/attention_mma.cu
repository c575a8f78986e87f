// Fused attention on tensor cores for bf16/f16 (FlashAttention-2's scheme, sm_80 and later).
// Each warp owns 16 rows and multiplies with mma.sync m16n8k16 (f32 accumulation); a block of
// four warps shares tiles of the other operand in shared memory. The layouts of mma's
// fragments are PTX's (ISA, "Matrix Fragments for mma.m16n8k16"): with g = lane / 4 and
// t = lane % 4,
//   A (16 x 16, row-major): regs {(g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)}, each
//     holding that element and the next column;
//   B (16 x 8, k x n): regs {(k = 2t, n = g), (k = 2t + 8, n = g)}, each with the next k;
//   C (16 x 8, f32): c0, c1 at (g, 2t), (g, 2t + 1); c2, c3 at (g + 8, 2t), (g + 8, 2t + 1).
// So two C tiles side by side are, rounded to 16 bits, the A fragment of the next product:
// softmax weights never leave registers. Tiles are stored so that every fragment register is
// one aligned 32-bit shared-memory load (B operands as [n][k]: k-pairs adjacent), with rows
// padded by 8 elements so a warp's loads hit 32 different banks.
//
// The backward runs two kernels, one over key blocks (dK, dV) and one over query blocks (dQ),
// each summing over the other side in order: no atomics, the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "tensor/cuda/attention.cuh"
#include "tensor/cuda/common.cuh"

namespace pipit::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kRowsPerBlock = kWarps * 16;
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&bits, &v, 4);
  }
  return bits;
}

// Two C tiles side by side (columns 16 kk to 16 kk + 15), rounded to T, as the A fragment of
// the next product: the layouts line up, so the values never leave their registers.
template <typename T, int N>
__device__ __forceinline__ void as_a_fragment(const float (&c)[N][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // attention_mma_supports sends older GPUs to the SIMT kernels
#endif
}

__device__ __forceinline__ uint32_t word(const void* p) {
  return *static_cast<const uint32_t*>(p);
}

// The A fragment of rows [row0, row0 + 16) x cols [k0, k0 + 16) of a row-major tile (pitch in
// elements) in shared memory.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int pitch, int row0,
                                       int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const T* p = tile + (row0 + g) * pitch + k0 + 2 * t;
  a[0] = word(p);
  a[1] = word(p + 8 * pitch);
  a[2] = word(p + 8);
  a[3] = word(p + 8 * pitch + 8);
}

// The A fragment of 16 rows of a head in global memory (rows past `rows` read as 0).
template <typename T>
__device__ __forceinline__ void load_a_global(uint32_t (&a)[4], const HeadView<const T>& x,
                                              int64_t bh, int64_t heads, int64_t row0, int64_t rows,
                                              int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int64_t r0 = row0 + g, r1 = row0 + g + 8;
  const T* p0 = x.row(bh, heads, r0) + k0 + 2 * t;
  const T* p1 = x.row(bh, heads, r1) + k0 + 2 * t;
  a[0] = r0 < rows ? word(p0) : 0u;
  a[1] = r1 < rows ? word(p1) : 0u;
  a[2] = r0 < rows ? word(p0 + 8) : 0u;
  a[3] = r1 < rows ? word(p1 + 8) : 0u;
}

// The B fragment (k16 x n8) at (n0, k0) of a tile stored [n][k] with the given pitch.
template <typename T>
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const T* tile, int pitch, int n0,
                                       int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const T* p = tile + (n0 + g) * pitch + k0 + 2 * t;
  b0 = word(p);
  b1 = word(p + 8);
}

// Copies rows [first, first + rows) of a head into shared memory, row-major with `pitch`
// (`transposed`: as [D][rows] with pitch), 16 bytes at a time; rows past `valid` become 0.
template <typename T, int D>
__device__ void load_tile(T* tile, int pitch, bool transposed, const HeadView<const T>& x,
                          int64_t bh, int64_t heads, int64_t first, int rows, int64_t valid) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < rows * kChunks; c += blockDim.x) {
    const int r = c / kChunks, col = c % kChunks * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (first + r < valid) v = *reinterpret_cast<const uint4*>(x.row(bh, heads, first + r) + col);
    if (!transposed) {
      *reinterpret_cast<uint4*>(tile + r * pitch + col) = v;
    } else {
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) tile[(col + i) * pitch + r] = e[i];
    }
  }
}

// Query `row` sees key `col` (both in range and, when causal, col <= row + offset).
__device__ __forceinline__ bool visible(const AttentionGeometry& g, int64_t row, int64_t col) {
  return row < g.queries && col < g.keys && (!g.causal || col <= row + g.offset());
}

// Row `row`'s fragment register e (0..3) of a C tile: rows g and g + 8, columns 2t and 2t + 1.
__device__ __forceinline__ int c_row(int e) {
  return threadIdx.x % 32 / 4 + (e >= 2 ? 8 : 0);
}
__device__ __forceinline__ int c_col(int e) {
  return threadIdx.x % 4 * 2 + (e & 1);
}

// Keys the block's last query row sees: all of them, or up to its diagonal.
__device__ __forceinline__ int64_t keys_seen(const AttentionGeometry& g, int64_t last_row) {
  return g.causal ? min(g.keys, last_row + 1 + g.offset()) : g.keys;
}

template <typename T>
__device__ __forceinline__ void store2(T* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = pack2<T>(lo, hi);
}

// Blocks own kRowsPerBlock query rows of one (batch, head); causal blocks near the end of the
// sequence have the most keys, so they are numbered first and start first.
__device__ __forceinline__ void block_rows(int64_t rows, int64_t& bh, int64_t& first_row) {
  const int64_t blocks_per_head = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  bh = blockIdx.x / blocks_per_head;
  first_row = (blocks_per_head - 1 - blockIdx.x % blocks_per_head) * kRowsPerBlock;
}

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, HeadView<T> out,
                   float* lse, AttentionGeometry geo) {
  constexpr int kKeys = 64, kPitch = D + 8, kPitchT = kKeys + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem);  // [kKeys][kPitch]
  T* v_tile = k_tile + kKeys * kPitch;     // transposed: [D][kPitchT]
  int64_t bh, block_row;
  block_rows(geo.queries, bh, block_row);
  const int warp = threadIdx.x / 32;
  const int64_t row0 = block_row + warp * 16;
  const float scale2 = static_cast<float>(geo.scale) * kLog2e;

  uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    load_a_global(qf[ks], q, bh, geo.heads, row0, geo.queries, ks * 16);
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t keys = keys_seen(geo, block_row + kRowsPerBlock - 1);
  for (int64_t key0 = 0; key0 < keys; key0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<T, D>(k_tile, kPitch, false, k, bh, geo.heads, key0, kKeys, geo.keys);
    load_tile<T, D>(v_tile, kPitchT, true, v, bh, geo.heads, key0, kKeys, geo.keys);
    __syncthreads();
    float s[kKeys / 8][4] = {};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b0, b1;
        load_b(b0, b1, k_tile, kPitch, nt * 8, ks * 16);
        mma<T>(s[nt], qf[ks], b0, b1);
      }
    }
    // Online softmax in base 2: scores scaled by scale * log2(e), masked to -inf.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool seen = visible(geo, row0 + c_row(e), key0 + nt * 8 + c_col(e));
        s[nt][e] = seen ? s[nt][e] * scale2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
      }
    }
    float shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      shift[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing seen yet stays 0
      const float correction = exp2f(m[r] - shift[r]);
      l[r] *= correction;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] *= correction;
        o[dt][2 * r + 1] *= correction;
      }
      m[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - shift[e / 2]);
        l[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a[4];
      as_a_fragment<T>(s, kk, a);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        uint32_t b0, b1;
        load_b(b0, b1, v_tile, kPitchT, dt * 8, kk * 16);
        mma<T>(o[dt], a, b0, b1);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = row0 + c_row(2 * r);
    if (row >= geo.queries) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* dst = out.row(bh, geo.heads, row);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2(dst + dt * 8 + c_col(0), o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
    if (threadIdx.x % 4 == 0) lse[bh * geo.queries + row] = (m[r] + log2f(l[r])) / kLog2e;
  }
}

// dK and dV for kRowsPerBlock keys: dV = sum_i P_ij dO_i, dK = scale sum_i dS_ij q_i over the
// queries i in order, in tiles of kQueries. Each warp holds its 16 keys' k and v as A
// fragments and computes the transposed products (keys as rows).
template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    dkdv_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                HeadView<const T> grad_out, const float* lse, const float* row_dots,
                HeadView<T> grad_k, HeadView<T> grad_v, AttentionGeometry geo) {
  constexpr int kQueries = D <= 64 ? 64 : 32, kPitch = D + 8, kPitchT = kQueries + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);                              // [kQueries][kPitch]
  T* do_tile = q_tile + kQueries * kPitch;                             // [kQueries][kPitch]
  T* qt_tile = do_tile + kQueries * kPitch;                            // [D][kPitchT]
  T* dot_tile = qt_tile + D * kPitchT;                                 // [D][kPitchT]
  float* lse_tile = reinterpret_cast<float*>(dot_tile + D * kPitchT);  // [kQueries], base 2
  float* dots_tile = lse_tile + kQueries;                              // [kQueries]
  int64_t bh, block_key;
  block_rows(geo.keys, bh, block_key);
  const int warp = threadIdx.x / 32;
  const int64_t key0 = block_key + warp * 16;
  const float scale2 = static_cast<float>(geo.scale) * kLog2e;

  uint32_t kf[D / 16][4], vf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    load_a_global(kf[ks], k, bh, geo.heads, key0, geo.keys, ks * 16);
    load_a_global(vf[ks], v, bh, geo.heads, key0, geo.keys, ks * 16);
  }
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  // The first query that sees the block's first key.
  const int64_t first_seeing = block_key - geo.offset();
  const int64_t first_query =
      geo.causal && first_seeing > 0 ? first_seeing / kQueries * kQueries : 0;
  for (int64_t query0 = first_query; query0 < geo.queries; query0 += kQueries) {
    __syncthreads();
    load_tile<T, D>(q_tile, kPitch, false, q, bh, geo.heads, query0, kQueries, geo.queries);
    load_tile<T, D>(do_tile, kPitch, false, grad_out, bh, geo.heads, query0, kQueries, geo.queries);
    load_tile<T, D>(qt_tile, kPitchT, true, q, bh, geo.heads, query0, kQueries, geo.queries);
    load_tile<T, D>(dot_tile, kPitchT, true, grad_out, bh, geo.heads, query0, kQueries,
                    geo.queries);
    for (int i = threadIdx.x; i < kQueries; i += blockDim.x) {
      const int64_t row = query0 + i;
      lse_tile[i] = row < geo.queries ? lse[bh * geo.queries + row] * kLog2e : 0.f;
      dots_tile[i] = row < geo.queries ? row_dots[bh * geo.queries + row] : 0.f;
    }
    __syncthreads();
    float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};
#pragma unroll
    for (int nt = 0; nt < kQueries / 8; ++nt) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b0, b1;
        load_b(b0, b1, q_tile, kPitch, nt * 8, ks * 16);
        mma<T>(p[nt], kf[ks], b0, b1);
        load_b(b0, b1, do_tile, kPitch, nt * 8, ks * 16);
        mma<T>(ds[nt], vf[ks], b0, b1);
      }
    }
    // p holds S^T (keys x queries), ds holds dP^T; turn them into P^T and dS^T / scale.
#pragma unroll
    for (int nt = 0; nt < kQueries / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = nt * 8 + c_col(e);
        const bool seen = visible(geo, query0 + i, key0 + c_row(e));
        p[nt][e] = seen ? exp2f(p[nt][e] * scale2 - lse_tile[i]) : 0.f;
        ds[nt][e] = p[nt][e] * (ds[nt][e] - dots_tile[i]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kQueries / 16; ++kk) {
      uint32_t pa[4];
      as_a_fragment<T>(p, kk, pa);
      uint32_t da[4];
      as_a_fragment<T>(ds, kk, da);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        uint32_t b0, b1;
        load_b(b0, b1, dot_tile, kPitchT, dt * 8, kk * 16);
        mma<T>(dv[dt], pa, b0, b1);
        load_b(b0, b1, qt_tile, kPitchT, dt * 8, kk * 16);
        mma<T>(dk[dt], da, b0, b1);
      }
    }
  }
  const float scale = static_cast<float>(geo.scale);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = key0 + c_row(2 * r);
    if (key >= geo.keys) continue;
    T* dk_row = grad_k.row(bh, geo.heads, key);
    T* dv_row = grad_v.row(bh, geo.heads, key);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2(dk_row + dt * 8 + c_col(0), dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
      store2(dv_row + dt * 8 + c_col(0), dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

// dQ for kRowsPerBlock queries: scale sum_j dS_ij k_j over the keys j in order.
template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    dq_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
              HeadView<const T> grad_out, const float* lse, const float* row_dots,
              HeadView<T> grad_q, AttentionGeometry geo) {
  constexpr int kKeys = D <= 64 ? 64 : 32, kPitch = D + 8, kPitchT = kKeys + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem);  // [kKeys][kPitch]
  T* v_tile = k_tile + kKeys * kPitch;     // [kKeys][kPitch]
  T* kt_tile = v_tile + kKeys * kPitch;    // [D][kPitchT]
  int64_t bh, block_row;
  block_rows(geo.queries, bh, block_row);
  const int warp = threadIdx.x / 32;
  const int64_t row0 = block_row + warp * 16;
  const float scale2 = static_cast<float>(geo.scale) * kLog2e;

  uint32_t qf[D / 16][4], gf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    load_a_global(qf[ks], q, bh, geo.heads, row0, geo.queries, ks * 16);
    load_a_global(gf[ks], grad_out, bh, geo.heads, row0, geo.queries, ks * 16);
  }
  float row_lse[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + c_row(2 * r);
    row_lse[r] = row < geo.queries ? lse[bh * geo.queries + row] * kLog2e : 0.f;
    row_dot[r] = row < geo.queries ? row_dots[bh * geo.queries + row] : 0.f;
  }
  float dq[D / 8][4] = {};
  const int64_t keys = keys_seen(geo, block_row + kRowsPerBlock - 1);
  for (int64_t key0 = 0; key0 < keys; key0 += kKeys) {
    __syncthreads();
    load_tile<T, D>(k_tile, kPitch, false, k, bh, geo.heads, key0, kKeys, geo.keys);
    load_tile<T, D>(v_tile, kPitch, false, v, bh, geo.heads, key0, kKeys, geo.keys);
    load_tile<T, D>(kt_tile, kPitchT, true, k, bh, geo.heads, key0, kKeys, geo.keys);
    __syncthreads();
    float p[kKeys / 8][4] = {}, ds[kKeys / 8][4] = {};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b0, b1;
        load_b(b0, b1, k_tile, kPitch, nt * 8, ks * 16);
        mma<T>(p[nt], qf[ks], b0, b1);
        load_b(b0, b1, v_tile, kPitch, nt * 8, ks * 16);
        mma<T>(ds[nt], gf[ks], b0, b1);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool seen = visible(geo, row0 + c_row(e), key0 + nt * 8 + c_col(e));
        p[nt][e] = seen ? exp2f(p[nt][e] * scale2 - row_lse[e / 2]) : 0.f;
        ds[nt][e] = p[nt][e] * (ds[nt][e] - row_dot[e / 2]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t da[4];
      as_a_fragment<T>(ds, kk, da);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        uint32_t b0, b1;
        load_b(b0, b1, kt_tile, kPitchT, dt * 8, kk * 16);
        mma<T>(dq[dt], da, b0, b1);
      }
    }
  }
  const float scale = static_cast<float>(geo.scale);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + c_row(2 * r);
    if (row >= geo.queries) continue;
    T* dst = grad_q.row(bh, geo.heads, row);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2(dst + dt * 8 + c_col(0), dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
  }
}

// Launches Kernel over `rows` rows of every head with `smem` bytes of dynamic shared memory,
// above the default limit of 48 KiB where needed.
template <auto Kernel, typename... Args>
void launch(const char* op, size_t smem, const AttentionGeometry& g, int64_t rows, Args... args) {
  if (smem > 48 * 1024) {
    PIPIT_CUDA_CHECK(op, cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
  }
  const int64_t blocks = g.batch * g.heads * ((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  PIPIT_CHECK(blocks < (int64_t{1} << 31), op, ": ", blocks, " blocks are too many for a grid");
  Kernel<<<static_cast<unsigned>(blocks), kBlockThreads, smem, stream()>>>(args..., g);
  PIPIT_CUDA_CHECK_LAUNCH(op);
}

template <typename T, int D>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeometry& g,
             const Tensor& out, float* lse) {
  const size_t smem = (64 * (D + 8) + D * (64 + 8)) * sizeof(T);
  launch<forward_kernel<T, D>>("attention", smem, g, g.queries, head_view<const T>(q),
                               head_view<const T>(k), head_view<const T>(v), head_view<T>(out),
                               lse);
}

template <typename T, int D>
void backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
              const float* lse, const float* row_dots, const AttentionGeometry& g,
              const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) {
  constexpr size_t kTile = D <= 64 ? 64 : 32;
  const size_t dkdv_smem =
      (2 * kTile * (D + 8) + 2 * D * (kTile + 8)) * sizeof(T) + 2 * kTile * sizeof(float);
  launch<dkdv_kernel<T, D>>("attention_backward", dkdv_smem, g, g.keys, head_view<const T>(q),
                            head_view<const T>(k), head_view<const T>(v),
                            head_view<const T>(grad_out), lse, row_dots, head_view<T>(grad_k),
                            head_view<T>(grad_v));
  const size_t dq_smem = (2 * kTile * (D + 8) + D * (kTile + 8)) * sizeof(T);
  launch<dq_kernel<T, D>>("attention_backward", dq_smem, g, g.queries, head_view<const T>(q),
                          head_view<const T>(k), head_view<const T>(v),
                          head_view<const T>(grad_out), lse, row_dots, head_view<T>(grad_q));
}

// Calls f.template operator()<T, D>() for the operands' dtype and head dim.
template <typename F>
void dispatch(DType dtype, int64_t head_dim, F&& f) {
  auto with_dim = [&]<typename T>() {
    switch (head_dim) {
      case 32:
        return f.template operator()<T, 32>();
      case 64:
        return f.template operator()<T, 64>();
      default:
        return f.template operator()<T, 128>();
    }
  };
  if (dtype == DType::bf16) return with_dim.template operator()<__nv_bfloat16>();
  return with_dim.template operator()<__half>();
}

}  // namespace

bool attention_mma_supports(std::initializer_list<const Tensor*> operands) {
  const Tensor& first = **operands.begin();
  const int64_t D = first.shape()[3];
  if (!(first.dtype() == DType::bf16 || first.dtype() == DType::f16)) return false;
  if (D != 32 && D != 64 && D != 128) return false;
  int major = 0;
  PIPIT_CUDA_CHECK("attention", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                                       first.device().index));
  if (major < 8) return false;
  for (const Tensor* t : operands) {
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
    for (int d = 0; d < 3; ++d) {
      if (t->strides()[d] % 8 != 0) return false;
    }
  }
  return true;
}

void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionGeometry& g, const Tensor& out, float* lse) {
  dispatch(q.dtype(), g.head_dim,
           [&]<typename T, int D>() { forward<T, D>(q, k, v, g, out, lse); });
}

void attention_backward_mma(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const float* lse, const float* row_dots,
                            const AttentionGeometry& g, const Tensor& grad_q, const Tensor& grad_k,
                            const Tensor& grad_v) {
  dispatch(q.dtype(), g.head_dim, [&]<typename T, int D>() {
    backward<T, D>(grad_out, q, k, v, lse, row_dots, g, grad_q, grad_k, grad_v);
  });
}

}  // namespace pipit::cuda
