// Layer norm on CUDA (Backend::layer_norm and layer_norm_backward), f32 and f64, with a half
// output and gradient for f32 inputs (autocast's operands). A warp owns a
// row and reads it 16 bytes per load where the row allows, with warp shuffles for its sums: a
// block per row with block-wide barriers spent more time waiting than reading (an H200 took
// 37 us for GPT-2's [8192, 768] f32 forward, four times its bytes over the memory's bandwidth).
// Every sum is taken in a fixed order, so results do not change between runs.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowWarps = 8;  // warps per block, each a row at a time

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Pack<T, N>& pack) {
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// Blocks for `rows` rows at kRowWarps a block, at most 65535 (each warp then loops).
unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>((rows + kRowWarps - 1) / kRowWarps, 65535));
}

// The first row of this warp and the step to its next.
__device__ __forceinline__ int64_t first_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
}
__device__ __forceinline__ int64_t row_step() {
  return static_cast<int64_t>(gridDim.x) * kRowWarps;
}

// y in TO: T, or a half type rounded once from T.
template <typename T, typename TO, int N>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, T eps, int64_t rows,
                                  int64_t C, TO* y, T* mean, T* rstd) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* xr = x + r * C;
    T s = T(0);
    for (int64_t c = lane * N; c < C; c += kWarp * N) {
      const Pack<T, N> xv = load<T, N>(xr + c);
#pragma unroll
      for (int k = 0; k < N; ++k) s += xv.v[k];
    }
    const T m = warp_sum(s) / T(C);
    T q = T(0);
    for (int64_t c = lane * N; c < C; c += kWarp * N) {
      const Pack<T, N> xv = load<T, N>(xr + c);
#pragma unroll
      for (int k = 0; k < N; ++k) q += (xv.v[k] - m) * (xv.v[k] - m);
    }
    const T rs = T(1) / sqrt(warp_sum(q) / T(C) + eps);
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    for (int64_t c = lane * N; c < C; c += kWarp * N) {
      const Pack<T, N> xv = load<T, N>(xr + c), wv = load<T, N>(w + c), bv = load<T, N>(b + c);
      Pack<TO, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = round_to<TO>((xv.v[k] - m) * rs * wv.v[k] + bv.v[k]);
      store(y + r * C + c, out);
    }
  }
}

// a + b never contracted into a multiply before it: a separate add's bits.
__device__ __forceinline__ float add_rounded(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rounded(double a, double b) {
  return __dadd_rn(a, b);
}

// g in TG: T, or a half type widened as read. residual (or null) is added to each result.
template <typename T, typename TG, int N>
__global__ void layer_norm_grad_x_kernel(const TG* g, const T* x, const T* w, const T* mean,
                                         const T* rstd, const T* residual, int64_t rows, int64_t C,
                                         T* gx) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* xr = x + r * C;
    const TG* gr = g + r * C;
    const T m = mean[r], rs = rstd[r];
    T s1 = T(0), s2 = T(0);
    for (int64_t c = lane * N; c < C; c += kWarp * N) {
      const Pack<TG, N> gv = load<TG, N>(gr + c);
      const Pack<T, N> xv = load<T, N>(xr + c), wv = load<T, N>(w + c);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const T gk = widen(gv.v[k]);
        s1 += gk * wv.v[k];
        s2 += gk * wv.v[k] * ((xv.v[k] - m) * rs);
      }
    }
    const T sum_gw = warp_sum(s1) / T(C);
    const T sum_gw_xhat = warp_sum(s2) / T(C);
    for (int64_t c = lane * N; c < C; c += kWarp * N) {
      const Pack<TG, N> gv = load<TG, N>(gr + c);
      const Pack<T, N> xv = load<T, N>(xr + c), wv = load<T, N>(w + c);
      Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const T xhat = (xv.v[k] - m) * rs;
        out.v[k] = rs * (widen(gv.v[k]) * wv.v[k] - sum_gw - xhat * sum_gw_xhat);
      }
      if (residual) {
        const Pack<T, N> rv = load<T, N>(residual + r * C + c);
#pragma unroll
        for (int k = 0; k < N; ++k) out.v[k] = add_rounded(rv.v[k], out.v[k]);
      }
      store(gx + r * C + c, out);
    }
  }
}

// Weight and bias gradients: a block sums a chunk of rows for 32 packs of columns, its 8 row
// lanes in turn, then adds the lanes in order into one partial row; a second kernel adds the
// chunks' partials in order.
constexpr int kChunkLanes = 8;
constexpr int64_t kRowsPerChunk = 256;

template <typename T, typename TG, int N>
__global__ void layer_norm_partial_kernel(const TG* g, const T* x, const T* mean, const T* rstd,
                                          int64_t rows, int64_t C, int64_t rows_per_chunk, T* pw,
                                          T* pb) {
  __shared__ Pack<T, N> tile_w[kChunkLanes][kWarp], tile_b[kChunkLanes][kWarp];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x) * N;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  Pack<T, N> sw{}, sb{};
  if (c < C) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kChunkLanes) {
      const Pack<TG, N> gv = load<TG, N>(g + r * C + c);
      const Pack<T, N> xv = load<T, N>(x + r * C + c);
      const T m = mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const T gk = widen(gv.v[k]);
        sw.v[k] += gk * ((xv.v[k] - m) * rs);
        sb.v[k] += gk;
      }
    }
  }
  tile_w[threadIdx.y][threadIdx.x] = sw;
  tile_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int lane = 1; lane < kChunkLanes; ++lane) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      sw.v[k] += tile_w[lane][threadIdx.x].v[k];
      sb.v[k] += tile_b[lane][threadIdx.x].v[k];
    }
  }
  store(pw + blockIdx.y * C + c, sw);
  store(pb + blockIdx.y * C + c, sb);
}

template <typename T>
__global__ void layer_norm_finish_kernel(const T* pw, const T* pb, int64_t chunks, int64_t C, T* gw,
                                         T* gb) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  T sw = T(0), sb = T(0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    sw += pw[chunk * C + c];
    sb += pb[chunk * C + c];
  }
  gw[c] = sw;
  gb[c] = sb;
}

// run(std::integral_constant<int, N>) with N elements of T per load: 16 bytes when every row
// and vector starts on a 16-byte boundary, else one.
template <typename T, typename Run>
void with_pack(int64_t C, std::initializer_list<const void*> pointers, Run run) {
  constexpr int kPack = 16 / sizeof(T);
  bool fits = C % kPack == 0;
  for (const void* p : pointers) fits = fits && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (fits) {
    run(std::integral_constant<int, kPack>{});
  } else {
    run(std::integral_constant<int, 1>{});
  }
}

// run(TypeTag<U>{}) where U is T when `dtype` is T's, or f32's half types for T = float.
template <typename U>
struct TypeTag {
  using type = U;
};

template <typename T, typename Run>
void with_operand_type(DType dtype, const char* op, Run run) {
  if (dtype == DTypeOf<T>::value) return run(TypeTag<T>{});
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == DType::bf16) return run(TypeTag<__nv_bfloat16>{});
    if (dtype == DType::f16) return run(TypeTag<__half>{});
  }
  throw Error(detail::concat(op, ": ", dtype, " with an input of ", DTypeOf<T>::value,
                             " (a half dtype pairs only with F32)"));
}

template <typename T, typename TO, int N>
void layer_norm_typed(const Tensor& x, const Tensor& w, const Tensor& b, T eps, int64_t rows,
                      int64_t C, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  layer_norm_kernel<T, TO, N><<<blocks_for(rows), kRowWarps * kWarp, 0, stream()>>>(
      ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, rows, C, ptr<TO>(out), mean.data<T>(), rstd.data<T>());
  PIPIT_CUDA_CHECK_LAUNCH("layer_norm");
}

template <typename T, typename TG, int N>
void layer_norm_backward_typed(const Tensor& g, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                               int64_t rows, int64_t C, const Tensor& grad_x,
                               const Tensor& grad_weight, const Tensor& grad_bias) {
  if (rows > 0) {
    layer_norm_grad_x_kernel<T, TG, N><<<blocks_for(rows), kRowWarps * kWarp, 0, stream()>>>(
        ptr<TG>(g), ptr<T>(x), ptr<T>(w), mean.data<T>(), rstd.data<T>(),
        residual.defined() ? ptr<T>(residual) : nullptr, rows, C, grad_x.data<T>());
    PIPIT_CUDA_CHECK_LAUNCH("layer_norm_backward");
  }
  if (C == 0) return;
  const int64_t rows_per_chunk = std::max<int64_t>(kRowsPerChunk, (rows + 65534) / 65535);
  const int64_t chunks = std::max<int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk);
  // With rows == 0 the one chunk's partials are zero.
  Tensor pw = Tensor::empty({chunks, C}, x.dtype(), x.device());
  Tensor pb = Tensor::empty({chunks, C}, x.dtype(), x.device());
  const dim3 grid(static_cast<unsigned>((C / N + kWarp - 1) / kWarp),
                  static_cast<unsigned>(chunks));
  layer_norm_partial_kernel<T, TG, N><<<grid, dim3(kWarp, kChunkLanes), 0, stream()>>>(
      ptr<TG>(g), ptr<T>(x), mean.data<T>(), rstd.data<T>(), rows, C, rows_per_chunk, ptr<T>(pw),
      ptr<T>(pb));
  PIPIT_CUDA_CHECK_LAUNCH("layer_norm_backward");
  layer_norm_finish_kernel<T>
      <<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
          ptr<T>(pw), ptr<T>(pb), chunks, C, grad_weight.data<T>(), grad_bias.data<T>());
  PIPIT_CUDA_CHECK_LAUNCH("layer_norm_backward");
}

}  // namespace
}  // namespace cuda

void CudaBackend::layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                             double eps, const Tensor& out, const Tensor& mean,
                             const Tensor& rstd) {
  cuda::DeviceGuard guard(index_);
  PIPIT_DISPATCH_FLOAT(x_in.dtype(), "layer_norm", {
    using T = scalar_t;
    const Tensor x = dense(x_in), w = dense(weight), b = dense(bias);
    const int64_t C = x.shape().back();
    const int64_t rows = C == 0 ? 0 : x.numel() / C;
    if (rows == 0) break;
    cuda::with_operand_type<T>(out.dtype(), "layer_norm", [&](auto out_type) {
      using TO = typename decltype(out_type)::type;
      cuda::with_pack<T>(C, {x.raw_data(), w.raw_data(), b.raw_data(), out.raw_data()},
                         [&](auto pack) {
                           cuda::layer_norm_typed<T, TO, decltype(pack)::value>(
                               x, w, b, T(eps), rows, C, out, mean, rstd);
                         });
    });
  });
}

void CudaBackend::layer_norm_backward(const Tensor& grad_in, const Tensor& x_in,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& residual, const Tensor& grad_x,
                                      const Tensor& grad_weight, const Tensor& grad_bias) {
  cuda::DeviceGuard guard(index_);
  check_layer_norm_residual("layer_norm_backward", residual, x_in);
  PIPIT_DISPATCH_FLOAT(x_in.dtype(), "layer_norm_backward", {
    using T = scalar_t;
    const Tensor x = dense(x_in), g = dense(grad_in), w = dense(weight);
    const int64_t C = x.shape().back();
    const int64_t rows = C == 0 ? 0 : x.numel() / C;
    cuda::with_operand_type<T>(g.dtype(), "layer_norm_backward", [&](auto grad_type) {
      using TG = typename decltype(grad_type)::type;
      // An undefined residual's null pointer is 16-byte aligned.
      cuda::with_pack<T>(C,
                         {x.raw_data(), g.raw_data(), w.raw_data(), grad_x.raw_data(),
                          residual.defined() ? residual.raw_data() : nullptr},
                         [&](auto pack) {
                           cuda::layer_norm_backward_typed<T, TG, decltype(pack)::value>(
                               g, x, w, mean, rstd, residual, rows, C, grad_x, grad_weight,
                               grad_bias);
                         });
    });
  });
}

}  // namespace pipit
