// Fused attention on tensor cores for bf16/f16 (FlashAttention-2's scheme, sm_80 and later):
// the forward. Each warp owns 16 query rows and multiplies with mma.sync m16n8k16 (f32
// accumulation, mma_tiles.cuh); a block of four warps shares tiles of keys and values in
// shared memory. The backward is attention_mma_backward.cu.
#include "tensor/cuda/mma_tiles.cuh"

namespace pipit::cuda {
namespace {

using namespace mma_tiles;

// One tile of scores s (scaled to base 2, masked to -inf) into the online softmax of this
// thread's two rows: the running max m and sum l, and the output o rescaled to the new max;
// s becomes the tile's weights.
template <int D, int N>
__device__ __forceinline__ void online_softmax(float (&s)[N / 8][4], float (&m)[2], float (&l)[2],
                                               float (&o)[D / 8][4]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
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
  for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - shift[e / 2]);
      l[e / 2] += s[nt][e];
    }
  }
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
  const int64_t row0 = block_row + threadIdx.x / 32 * 16;
  const float scale2 = static_cast<float>(geo.scale) * kLog2e;
  uint32_t qf[D / 16][4];
  load_rows<T, D>(qf, q, bh, geo.heads, row0, geo.queries);
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t keys = keys_seen(geo, block_row + kRowsPerBlock - 1);
  for (int64_t key0 = 0; key0 < keys; key0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<T, D>(k_tile, kPitch, false, k, bh, geo.heads, key0, kKeys, geo.keys);
    load_tile<T, D>(v_tile, kPitchT, true, v, bh, geo.heads, key0, kKeys, geo.keys);
    __syncthreads();
    float s[kKeys / 8][4] = {};
    mma_rows<T, D, kKeys>(s, qf, k_tile, kPitch);
    // Online softmax in base 2: scores scaled by scale * log2(e), masked to -inf.
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool seen = visible(geo, row0 + c_row(e), key0 + nt * 8 + c_col(e));
        s[nt][e] = seen ? s[nt][e] * scale2 : -INFINITY;
      }
    }
    online_softmax<D, kKeys>(s, m, l, o);
    mma_scores<T, D, kKeys>(o, s, v_tile, kPitchT);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = row0 + c_row(2 * r);
    if (row >= geo.queries) continue;
    store_row<T, D>(out.row(bh, geo.heads, row), o, r, l[r] > 0.f ? 1.f / l[r] : 0.f);
    if (threadIdx.x % 4 == 0) lse[bh * geo.queries + row] = (m[r] + log2f(l[r])) / kLog2e;
  }
}

template <typename T, int D>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeometry& g,
             const Tensor& out, float* lse) {
  const size_t smem = (64 * (D + 8) + D * (64 + 8)) * sizeof(T);
  launch<forward_kernel<T, D>>("attention", smem, g, g.queries, head_view<const T>(q),
                               head_view<const T>(k), head_view<const T>(v), head_view<T>(out),
                               lse);
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

}  // namespace pipit::cuda
