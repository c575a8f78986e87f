#pragma once
// What the tensor-core attention kernels share (attention_mma.cu, attention_mma_backward.cu):
// mma.sync m16n8k16 and its fragments, tiles of a head in shared memory, and the launch.
// The layouts of mma's fragments are PTX's (ISA, "Matrix Fragments for mma.m16n8k16"): with
// g = lane / 4 and t = lane % 4,
//   A (16 x 16, row-major): regs {(g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)}, each
//     holding that element and the next column;
//   B (16 x 8, k x n): regs {(k = 2t, n = g), (k = 2t + 8, n = g)}, each with the next k;
//   C (16 x 8, f32): c0, c1 at (g, 2t), (g, 2t + 1); c2, c3 at (g + 8, 2t), (g + 8, 2t + 1).
// So two C tiles side by side are, rounded to 16 bits, the A fragment of the next product:
// softmax weights never leave registers. Tiles are stored so that every fragment register is
// one aligned 32-bit shared-memory load (B operands as [n][k]: k-pairs adjacent), with rows
// padded by 8 elements so a warp's loads hit 32 different banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "tensor/cuda/attention.cuh"
#include "tensor/cuda/common.cuh"

namespace pipit::cuda::mma_tiles {

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

// The A fragments of 16 rows of a head in global memory, all D columns.
template <typename T, int D>
__device__ __forceinline__ void load_rows(uint32_t (&a)[D / 16][4], const HeadView<const T>& x,
                                          int64_t bh, int64_t heads, int64_t row0, int64_t rows) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) load_a_global(a[ks], x, bh, heads, row0, rows, ks * 16);
}

// acc (16 rows x N) += a (16 rows x D) times the transpose of a tile of N rows stored [N][pitch].
template <typename T, int D, int N>
__device__ __forceinline__ void mma_rows(float (&acc)[N / 8][4], const uint32_t (&a)[D / 16][4],
                                         const T* tile, int pitch) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t b0, b1;
      load_b(b0, b1, tile, pitch, nt * 8, ks * 16);
      mma<T>(acc[nt], a[ks], b0, b1);
    }
  }
}

// acc (16 rows x D) += s (16 rows x N, rounded to T) times a tile of N rows stored transposed,
// [D][pitch].
template <typename T, int D, int N>
__device__ __forceinline__ void mma_scores(float (&acc)[D / 8][4], const float (&s)[N / 8][4],
                                           const T* tile_t, int pitch) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[4];
    as_a_fragment<T>(s, kk, a);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      uint32_t b0, b1;
      load_b(b0, b1, tile_t, pitch, dt * 8, kk * 16);
      mma<T>(acc[dt], a, b0, b1);
    }
  }
}

// This thread's values of row r (0: row g, 1: row g + 8) of acc (16 x D), times `factor`.
template <typename T, int D>
__device__ __forceinline__ void store_row(T* dst, const float (&acc)[D / 8][4], int r,
                                          float factor) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    store2(dst + dt * 8 + c_col(0), acc[dt][2 * r] * factor, acc[dt][2 * r + 1] * factor);
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

}  // namespace pipit::cuda::mma_tiles
