// Fused attention on CUDA (Backend::attention): bf16/f16 go to cuDNN's fused attention where
// the build has it and it takes the call (attention_cudnn.cpp, attention_provider.h), else
// with head dims 32, 64 and 128 to pipit's tensor-core kernels (attention_mma.cu); every
// other case runs the kernels here, on CUDA cores in the
// accumulation dtype (f32, or f64 for f64). They use the same scheme: blocks of 8 warps share
// tiles of 32 rows of the other side in shared memory; a warp owns one row and its lanes take
// one tile row each for the dot products (a score each), then split the head dim to add the
// tile's rows into the warp's accumulator in row order. Sums run in one fixed order, so every
// run gives the same bits: the backward computes dK and dV per key and dQ per query, summing
// over the other side in order, with no atomics.
#include <cmath>

#include <atomic>

#include "tensor/cuda/attention.cuh"
#include "tensor/cuda/attention_provider.h"
#include "tensor/cuda/common.cuh"

namespace pipit::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kTile = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

template <typename A, typename T>
__device__ __forceinline__ A load(const T* p) {
  return static_cast<A>(to_double(*p));
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o /= 2) {
    const A other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Copies rows [first, first + kTile) of a head into `tile` (pitch D + 1, so that lanes reading
// one element of different rows hit different banks), as A; rows past `valid` become 0.
template <typename A, typename T>
__device__ void load_rows(A* tile, const HeadView<const T>& x, int64_t bh, int64_t heads,
                          int64_t first, int rows, int64_t valid, int D) {
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    tile[r * (D + 1) + d] = first + r < valid ? load<A>(x.row(bh, heads, first + r) + d) : A(0);
  }
}

template <typename A>
__device__ __forceinline__ A dot(const A* a, const A* b, int D) {
  A s = A(0);
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

__device__ __forceinline__ bool visible(const AttentionGeometry& g, int64_t row, int64_t col) {
  return row < g.queries && col < g.keys && (!g.causal || col <= row + g.offset());
}

// Blocks own kWarps rows of one (batch, head), the longest causal rows first.
__device__ __forceinline__ void block_rows(int64_t rows, int64_t& bh, int64_t& first_row) {
  const int64_t blocks_per_head = (rows + kWarps - 1) / kWarps;
  bh = blockIdx.x / blocks_per_head;
  first_row = (blocks_per_head - 1 - blockIdx.x % blocks_per_head) * kWarps;
}

__device__ __forceinline__ int64_t keys_seen(const AttentionGeometry& g, int64_t last_row) {
  return g.causal ? min(g.keys, last_row + 1 + g.offset()) : g.keys;
}

template <typename A>
__device__ __forceinline__ A exp_of(A x) {
  return exp_(x);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, HeadView<T> out,
                   A* lse, AttentionGeometry geo) {
  const int D = static_cast<int>(geo.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  A* k_tile = reinterpret_cast<A*>(smem);  // [kTile][D + 1]
  A* v_tile = k_tile + kTile * (D + 1);    // [kTile][D + 1]
  A* q_rows = v_tile + kTile * (D + 1);    // [kWarps][D + 1]
  int64_t bh, block_row;
  block_rows(geo.queries, bh, block_row);
  const int64_t row = block_row + warp;
  load_rows<A>(q_rows, q, bh, geo.heads, block_row, kWarps, geo.queries, D);
  const A scale = static_cast<A>(geo.scale);
  A acc[kPerLane] = {};
  A m = -A(INFINITY), l = A(0);
  const int64_t keys = keys_seen(geo, block_row + kWarps - 1);
  for (int64_t key0 = 0; key0 < keys; key0 += kTile) {
    __syncthreads();
    load_rows<A>(k_tile, k, bh, geo.heads, key0, kTile, geo.keys, D);
    load_rows<A>(v_tile, v, bh, geo.heads, key0, kTile, geo.keys, D);
    __syncthreads();
    const bool seen = visible(geo, row, key0 + lane);
    const A s =
        seen ? dot(q_rows + warp * (D + 1), k_tile + lane * (D + 1), D) * scale : -A(INFINITY);
    const A m_new = max(m, warp_max(s));
    const A shift = m_new == -A(INFINITY) ? A(0) : m_new;
    const A correction = exp_of(m - shift);
    const A p = seen ? exp_of(s - shift) : A(0);
    l = l * correction + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] *= correction;
    for (int j = 0; j < kTile; ++j) {
      const A pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < D) acc[c] += pj * v_tile[j * (D + 1) + d];
      }
    }
  }
  if (row >= geo.queries) return;
  T* dst = out.row(bh, geo.heads, row);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < D) dst[d] = from_double<T>(static_cast<double>(acc[c] / l));
  }
  if (lane == 0) lse[bh * geo.queries + row] = m + log_(l);
}

// row_dots[i] = dO_i . O_i, one warp per row.
template <typename T, typename A>
__global__ void row_dots_kernel(HeadView<const T> grad_out, HeadView<const T> out, A* row_dots,
                                AttentionGeometry geo) {
  const int64_t rows = geo.batch * geo.heads * geo.queries;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
       r += warps) {
    const int64_t bh = r / geo.queries, i = r % geo.queries;
    const T* g = grad_out.row(bh, geo.heads, i);
    const T* o = out.row(bh, geo.heads, i);
    A s = A(0);
    for (int d = lane; d < geo.head_dim; d += 32) s += load<A>(g + d) * load<A>(o + d);
    s = warp_sum(s);
    if (lane == 0) row_dots[r] = s;
  }
}

// dK and dV for kWarps keys, one warp each: lanes take a query of the tile each.
template <typename T, typename A>
__global__ void __launch_bounds__(kWarps * 32)
    dkdv_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                HeadView<const T> grad_out, const A* lse, const A* row_dots, HeadView<T> grad_k,
                HeadView<T> grad_v, AttentionGeometry geo) {
  const int D = static_cast<int>(geo.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  A* q_tile = reinterpret_cast<A*>(smem);  // [kTile][D + 1]
  A* do_tile = q_tile + kTile * (D + 1);   // [kTile][D + 1]
  A* k_rows = do_tile + kTile * (D + 1);   // [kWarps][D + 1]
  A* v_rows = k_rows + kWarps * (D + 1);   // [kWarps][D + 1]
  int64_t bh, block_key;
  block_rows(geo.keys, bh, block_key);
  const int64_t key = block_key + warp;
  load_rows<A>(k_rows, k, bh, geo.heads, block_key, kWarps, geo.keys, D);
  load_rows<A>(v_rows, v, bh, geo.heads, block_key, kWarps, geo.keys, D);
  const A scale = static_cast<A>(geo.scale);
  A dk[kPerLane] = {}, dv[kPerLane] = {};
  const int64_t first_seeing = block_key - geo.offset();
  const int64_t first_query = geo.causal && first_seeing > 0 ? first_seeing / kTile * kTile : 0;
  for (int64_t query0 = first_query; query0 < geo.queries; query0 += kTile) {
    __syncthreads();
    load_rows<A>(q_tile, q, bh, geo.heads, query0, kTile, geo.queries, D);
    load_rows<A>(do_tile, grad_out, bh, geo.heads, query0, kTile, geo.queries, D);
    __syncthreads();
    const int64_t i = query0 + lane;
    A p = A(0), ds = A(0);
    if (key < geo.keys && visible(geo, i, key)) {
      const A s = dot(q_tile + lane * (D + 1), k_rows + warp * (D + 1), D) * scale;
      p = exp_of(s - lse[bh * geo.queries + i]);
      const A dp = dot(do_tile + lane * (D + 1), v_rows + warp * (D + 1), D);
      ds = p * (dp - row_dots[bh * geo.queries + i]);
    }
    for (int ii = 0; ii < kTile; ++ii) {
      const A pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < D) {
          dv[c] += pi * do_tile[ii * (D + 1) + d];
          dk[c] += dsi * q_tile[ii * (D + 1) + d];
        }
      }
    }
  }
  if (key >= geo.keys) return;
  T* dk_row = grad_k.row(bh, geo.heads, key);
  T* dv_row = grad_v.row(bh, geo.heads, key);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < D) {
      dk_row[d] = from_double<T>(static_cast<double>(dk[c] * scale));
      dv_row[d] = from_double<T>(static_cast<double>(dv[c]));
    }
  }
}

// dQ for kWarps queries, one warp each: lanes take a key of the tile each.
template <typename T, typename A>
__global__ void __launch_bounds__(kWarps * 32)
    dq_kernel(HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
              HeadView<const T> grad_out, const A* lse, const A* row_dots, HeadView<T> grad_q,
              AttentionGeometry geo) {
  const int D = static_cast<int>(geo.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  A* k_tile = reinterpret_cast<A*>(smem);  // [kTile][D + 1]
  A* v_tile = k_tile + kTile * (D + 1);    // [kTile][D + 1]
  A* q_rows = v_tile + kTile * (D + 1);    // [kWarps][D + 1]
  A* do_rows = q_rows + kWarps * (D + 1);  // [kWarps][D + 1]
  int64_t bh, block_row;
  block_rows(geo.queries, bh, block_row);
  const int64_t row = block_row + warp;
  load_rows<A>(q_rows, q, bh, geo.heads, block_row, kWarps, geo.queries, D);
  load_rows<A>(do_rows, grad_out, bh, geo.heads, block_row, kWarps, geo.queries, D);
  const A scale = static_cast<A>(geo.scale);
  const A row_lse = row < geo.queries ? lse[bh * geo.queries + row] : A(0);
  const A row_dot = row < geo.queries ? row_dots[bh * geo.queries + row] : A(0);
  A dq[kPerLane] = {};
  const int64_t keys = keys_seen(geo, block_row + kWarps - 1);
  for (int64_t key0 = 0; key0 < keys; key0 += kTile) {
    __syncthreads();
    load_rows<A>(k_tile, k, bh, geo.heads, key0, kTile, geo.keys, D);
    load_rows<A>(v_tile, v, bh, geo.heads, key0, kTile, geo.keys, D);
    __syncthreads();
    A ds = A(0);
    if (visible(geo, row, key0 + lane)) {
      const A s = dot(q_rows + warp * (D + 1), k_tile + lane * (D + 1), D) * scale;
      const A p = exp_of(s - row_lse);
      const A dp = dot(do_rows + warp * (D + 1), v_tile + lane * (D + 1), D);
      ds = p * (dp - row_dot);
    }
    for (int j = 0; j < kTile; ++j) {
      const A dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < D) dq[c] += dsj * k_tile[j * (D + 1) + d];
      }
    }
  }
  if (row >= geo.queries) return;
  T* dst = grad_q.row(bh, geo.heads, row);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < D) dst[d] = from_double<T>(static_cast<double>(dq[c] * scale));
  }
}

// Launches Kernel over `rows` rows of every head, kWarps rows a block, with `tiles` row tiles
// of (D + 1) A's in shared memory.
template <auto Kernel, typename A, typename... Args>
void launch(const char* op, int tiles, const AttentionGeometry& g, int64_t rows, Args... args) {
  const size_t smem = static_cast<size_t>(tiles) * (g.head_dim + 1) * sizeof(A);
  if (smem > 48 * 1024) {
    PIPIT_CUDA_CHECK(op, cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
  }
  const int64_t blocks = g.batch * g.heads * ((rows + kWarps - 1) / kWarps);
  PIPIT_CHECK(blocks < (int64_t{1} << 31), op, ": ", blocks, " blocks are too many for a grid");
  Kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream()>>>(args..., g);
  PIPIT_CUDA_CHECK_LAUNCH(op);
}

// Calls f.template operator()<T, A>() with the storage and accumulation types of `dtype`.
template <typename F>
void dispatch(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f.template operator()<float, float>();
    case DType::f64:
      return f.template operator()<double, double>();
    case DType::bf16:
      return f.template operator()<__nv_bfloat16, float>();
    case DType::f16:
      return f.template operator()<__half, float>();
    default:
      throw Error(detail::concat(op, ": dtype ", dtype, " is not supported"));
  }
}

std::atomic<AttentionProvider> provider{AttentionProvider::automatic};

// Whether this call goes to cuDNN: decided from q, k and the geometry alone, so a forward and
// its backward take the same road.
bool use_cudnn(const char* op, const Tensor& q, const Tensor& k, const AttentionGeometry& g) {
  switch (provider.load(std::memory_order_relaxed)) {
    case AttentionProvider::pipit:
      return false;
    case AttentionProvider::automatic:
      return cudnn_attention_built() && attention_cudnn_supports(q, k, g);
    case AttentionProvider::cudnn:
      break;
  }
  PIPIT_CHECK(
      attention_cudnn_supports(q, k, g), op,
      ": cuDNN's fused attention (set_attention_provider) takes bf16/f16 with as many "
      "queries as keys (at least 2) and a head dim that is a multiple of 8 up to 128, on sm_80 or "
      "newer; got ",
      q.dtype(), ", ", g.queries, " queries, ", g.keys, " keys, head dim ", g.head_dim);
  return true;
}

}  // namespace

void set_attention_provider(AttentionProvider p) {
  PIPIT_CHECK(p != AttentionProvider::cudnn || cudnn_attention_built(),
              "set_attention_provider: this build of pipit has no cuDNN frontend "
              "(tools/install_deps.sh installs its headers; then rebuild)");
  provider.store(p, std::memory_order_relaxed);
}

AttentionProvider attention_provider() {
  return provider.load(std::memory_order_relaxed);
}

}  // namespace pipit::cuda

namespace pipit {

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            bool causal, const Tensor& out, const Tensor& lse) {
  using namespace cuda;
  const char* op = "attention";
  DeviceGuard guard(index_);
  const AttentionSizes n = check_attention(op, q, k, v, lse, causal, {&out});
  PIPIT_CHECK(n.head_dim <= kMaxHeadDim, op, ": head dim ", n.head_dim,
              " is larger than the CUDA kernels' ", kMaxHeadDim);
  if (n.batch * n.heads * n.queries == 0) return;
  const AttentionGeometry g = geometry(n, scale, causal);
  if (use_cudnn(op, q, k, g)) return attention_forward_cudnn(q, k, v, g, out, lse);
  if (attention_mma_supports({&q, &k, &v, &out})) {
    return attention_forward_mma(q, k, v, g, out, lse.data<float>());
  }
  dispatch(q.dtype(), op, [&]<typename T, typename A>() {
    launch<forward_kernel<T, A>, A>(op, 2 * kTile + kWarps, g, n.queries, head_view<const T>(q),
                                    head_view<const T>(k), head_view<const T>(v), head_view<T>(out),
                                    lse.data<A>());
  });
}

void CudaBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     double scale, bool causal, const Tensor& grad_q,
                                     const Tensor& grad_k, const Tensor& grad_v) {
  using namespace cuda;
  const char* op = "attention_backward";
  DeviceGuard guard(index_);
  const AttentionSizes n = check_attention(op, q, k, v, lse, causal, {&grad_q, &grad_k, &grad_v});
  check_attention(op, q, k, v, lse, causal, {&out});
  check_attention(op, q, k, v, lse, causal, {&grad_out});
  PIPIT_CHECK(n.head_dim <= kMaxHeadDim, op, ": head dim ", n.head_dim,
              " is larger than the CUDA kernels' ", kMaxHeadDim);
  if (n.batch * n.heads == 0) return;
  if (n.queries == 0) {
    fill(grad_k, 0);
    fill(grad_v, 0);
    return;
  }
  const AttentionGeometry g = geometry(n, scale, causal);
  if (use_cudnn(op, q, k, g)) {
    return attention_backward_cudnn(grad_out, q, k, v, out, lse, g, grad_q, grad_k, grad_v);
  }
  const Tensor row_dots = Tensor::empty(lse.shape(), lse.dtype(), lse.device());
  dispatch(q.dtype(), op, [&]<typename T, typename A>() {
    const int64_t rows = n.batch * n.heads * n.queries;
    const int64_t blocks = std::min<int64_t>((rows + 7) / 8, int64_t{1} << 16);
    row_dots_kernel<T, A><<<static_cast<unsigned>(blocks), 256, 0, stream()>>>(
        head_view<const T>(grad_out), head_view<const T>(out), row_dots.data<A>(), g);
    PIPIT_CUDA_CHECK_LAUNCH(op);
  });
  if (attention_mma_supports({&q, &k, &v, &grad_out, &grad_q, &grad_k, &grad_v})) {
    return attention_backward_mma(grad_out, q, k, v, lse.data<float>(), row_dots.data<float>(), g,
                                  grad_q, grad_k, grad_v);
  }
  dispatch(q.dtype(), op, [&]<typename T, typename A>() {
    const A* lse_data = lse.data<A>();
    const A* dots = row_dots.data<A>();
    launch<dkdv_kernel<T, A>, A>(op, 2 * kTile + 2 * kWarps, g, n.keys, head_view<const T>(q),
                                 head_view<const T>(k), head_view<const T>(v),
                                 head_view<const T>(grad_out), lse_data, dots, head_view<T>(grad_k),
                                 head_view<T>(grad_v));
    launch<dq_kernel<T, A>, A>(op, 2 * kTile + 2 * kWarps, g, n.queries, head_view<const T>(q),
                               head_view<const T>(k), head_view<const T>(v),
                               head_view<const T>(grad_out), lse_data, dots, head_view<T>(grad_q));
  });
}

}  // namespace pipit
