// The backward of the tensor-core attention (attention_mma.cu): two kernels, one over key
// blocks (dK, dV) and one over query blocks (dQ), each summing over the other side in order:
// no atomics, the same bits on every run.
#include "tensor/cuda/mma_tiles.cuh"

namespace pipit::cuda {
namespace {

using namespace mma_tiles;

// P and dS / scale from the scores s and dP of one tile, in place: P = 2^(s * scale2 - lse),
// dS = P (dP - rowdot), both 0 where the query does not see the key. `query(nt, e)` and
// `key(nt, e)` place fragment register e of column tile nt; lse (base 2) and dots by query.
template <int N, typename Query, typename Key, typename Lse, typename Dot>
__device__ __forceinline__ void softmax_gradients(float (&p)[N / 8][4], float (&ds)[N / 8][4],
                                                  const AttentionGeometry& geo, float scale2,
                                                  Query query, Key key, Lse lse, Dot dot) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool seen = visible(geo, query(nt, e), key(nt, e));
      p[nt][e] = seen ? exp2f(p[nt][e] * scale2 - lse(nt, e)) : 0.f;
      ds[nt][e] = p[nt][e] * (ds[nt][e] - dot(nt, e));
    }
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
  const int64_t key0 = block_key + threadIdx.x / 32 * 16;
  uint32_t kf[D / 16][4], vf[D / 16][4];
  load_rows<T, D>(kf, k, bh, geo.heads, key0, geo.keys);
  load_rows<T, D>(vf, v, bh, geo.heads, key0, geo.keys);
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
    // p holds S^T (keys x queries), ds holds dP^T; they become P^T and dS^T / scale.
    float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};
    mma_rows<T, D, kQueries>(p, kf, q_tile, kPitch);
    mma_rows<T, D, kQueries>(ds, vf, do_tile, kPitch);
    const auto column = [](int nt, int e) { return nt * 8 + c_col(e); };
    softmax_gradients<kQueries>(
        p, ds, geo, static_cast<float>(geo.scale) * kLog2e,
        [&](int nt, int e) { return query0 + column(nt, e); },
        [&](int, int e) { return key0 + c_row(e); },
        [&](int nt, int e) { return lse_tile[column(nt, e)]; },
        [&](int nt, int e) { return dots_tile[column(nt, e)]; });
    mma_scores<T, D, kQueries>(dv, p, dot_tile, kPitchT);
    mma_scores<T, D, kQueries>(dk, ds, qt_tile, kPitchT);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = key0 + c_row(2 * r);
    if (key >= geo.keys) continue;
    store_row<T, D>(grad_k.row(bh, geo.heads, key), dk, r, static_cast<float>(geo.scale));
    store_row<T, D>(grad_v.row(bh, geo.heads, key), dv, r, 1.f);
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
  const int64_t row0 = block_row + threadIdx.x / 32 * 16;
  uint32_t qf[D / 16][4], gf[D / 16][4];
  load_rows<T, D>(qf, q, bh, geo.heads, row0, geo.queries);
  load_rows<T, D>(gf, grad_out, bh, geo.heads, row0, geo.queries);
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
    mma_rows<T, D, kKeys>(p, qf, k_tile, kPitch);
    mma_rows<T, D, kKeys>(ds, gf, v_tile, kPitch);
    softmax_gradients<kKeys>(
        p, ds, geo, static_cast<float>(geo.scale) * kLog2e,
        [&](int, int e) { return row0 + c_row(e); },
        [&](int nt, int e) { return key0 + nt * 8 + c_col(e); },
        [&](int, int e) { return row_lse[e / 2]; }, [&](int, int e) { return row_dot[e / 2]; });
    mma_scores<T, D, kKeys>(dq, ds, kt_tile, kPitchT);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + c_row(2 * r);
    if (row < geo.queries) {
      store_row<T, D>(grad_q.row(bh, geo.heads, row), dq, r, static_cast<float>(geo.scale));
    }
  }
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

}  // namespace

void attention_backward_mma(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const float* lse, const float* row_dots,
                            const AttentionGeometry& g, const Tensor& grad_q, const Tensor& grad_k,
                            const Tensor& grad_v) {
  dispatch(q.dtype(), g.head_dim, [&]<typename T, int D>() {
    backward<T, D>(grad_out, q, k, v, lse, row_dots, g, grad_q, grad_k, grad_v);
  });
}

}  // namespace pipit::cuda
