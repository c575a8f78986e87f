// Reductions and argmax on CUDA. Every sum is taken in a fixed order (per-thread strides, then
// a fixed tree), so results do not change between runs.
#include <limits>
#include <vector>

#include "tensor/cuda/common.cuh"

namespace pipit {
namespace cuda {
namespace reduce {

template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

// The sum rounded to T: through the compute type, as the CPU rounds half results.
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> acc) {
  return round_to<T>(static_cast<compute_t<T>>(acc));
}

template <typename A>
__device__ __forceinline__ A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::max:
      return (a > b || a != a) ? a : b;
    default:
      return (a < b || a != a) ? a : b;
  }
}

// Combines v over a group of Lanes consecutive threads (1, 32, or the whole block of
// kThreads); the first thread of the group gets the result.
template <int Lanes, typename A>
__device__ A group_combine(ReduceOp op, A v) {
  if constexpr (Lanes == 1) {
    return v;
  } else {
    for (int o = 16; o > 0; o /= 2) v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (Lanes == 32) {
      return v;
    } else {
      __shared__ A partial[kThreads / 32];
      if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
      __syncthreads();
      A total = partial[0];
      for (int w = 1; w < kThreads / 32; ++w) total = combine(op, total, partial[w]);
      __syncthreads();  // partial is reused by the next output
      return total;
    }
  }
}

// out[k] = reduce over r of in[kept(k) + reduced(r)], Lanes threads per output.
template <int Lanes, typename T>
__global__ void reduce_kernel(ReduceOp op, const T* in, Indexer<1> kept, Indexer<1> reduced,
                              int64_t K, int64_t R, acc_t<T> identity, T* out) {
  const int64_t groups_per_block = kThreads / Lanes;
  const int lane = threadIdx.x % Lanes;
  for (int64_t k0 = static_cast<int64_t>(blockIdx.x) * groups_per_block; k0 < K;
       k0 += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    // Every thread of the block walks the same k0 so the block-wide combine stays uniform.
    const int64_t k = k0 + threadIdx.x / Lanes;
    acc_t<T> acc = identity;
    if (k < K) {
      int64_t base[1];
      kept.offsets(k, base);
      for (int64_t r = lane; r < R; r += Lanes) {
        int64_t off[1];
        reduced.offsets(r, off);
        acc = combine(op, acc, acc_t<T>(widen(in[base[0] + off[0]])));
      }
    }
    acc = group_combine<Lanes>(op, acc);
    if (k < K && lane == 0) out[k] = from_acc<T>(acc);
  }
}

// The indexers of `in` restricted to the dims with flag == want.
Indexer<1> sub_indexer(const Tensor& in, const std::vector<bool>& flag, bool want) {
  Shape shape, strides;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (flag[static_cast<size_t>(d)] != want) continue;
    shape.push_back(in.shape()[d]);
    strides.push_back(in.strides()[d]);
  }
  Tensor view = Tensor::from_storage(in.storage(), shape, strides, in.offset(), in.dtype());
  return make_indexer<1>("reduce", shape, {&view});
}

template <int Lanes>
int64_t grid_for(int64_t K) {
  return std::max<int64_t>(1, std::min<int64_t>((K * Lanes + kThreads - 1) / kThreads, 65535));
}

// Reductions over the leading dims of a contiguous tensor, viewed as [R, K] (bias gradients:
// sums over batch and time). reduce_kernel would give each output lanes reading elements K
// apart, a memory transaction each; here a warp reads 32 neighbouring columns of one row. Each
// block reduces a chunk of rows of a column tile to partial results, which a second kernel
// combines in chunk order, so the order is fixed.
constexpr int kTileColumns = 32, kTileRows = 8;
constexpr int64_t kRowsPerChunk = 256;

template <typename T>
__global__ void column_partials_kernel(ReduceOp op, const T* in, int64_t R, int64_t K,
                                       int64_t rows_per_chunk, acc_t<T> identity,
                                       acc_t<T>* partial) {
  __shared__ acc_t<T> tile[kTileRows][kTileColumns];
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kTileColumns + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < R ? begin + rows_per_chunk : R;
  acc_t<T> acc = identity;
  if (k < K) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kTileRows) {
      acc = combine(op, acc, acc_t<T>(widen(in[r * K + k])));
    }
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && k < K) {
    for (int y = 1; y < kTileRows; ++y) acc = combine(op, acc, tile[y][threadIdx.x]);
    partial[blockIdx.y * K + k] = acc;
  }
}

template <typename T>
__global__ void column_finish_kernel(ReduceOp op, const acc_t<T>* partial, int64_t chunks,
                                     int64_t K, T* out) {
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < K;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t<T> acc = partial[k];
    for (int64_t c = 1; c < chunks; ++c) acc = combine(op, acc, partial[c * K + k]);
    out[k] = from_acc<T>(acc);
  }
}

// True when `in` is contiguous and, size-1 dims aside, every reduced dim precedes every kept one.
bool leading_reduction(const Tensor& in, const std::vector<bool>& reduced) {
  if (!in.is_contiguous()) return false;
  bool seen_kept = false;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (in.shape()[d] == 1) continue;
    if (!reduced[static_cast<size_t>(d)]) {
      seen_kept = true;
    } else if (seen_kept) {
      return false;
    }
  }
  return true;
}

template <typename T>
void reduce_columns(ReduceOp op, const Tensor& in, int64_t R, int64_t K, acc_t<T> identity,
                    const Tensor& out) {
  const int64_t rows_per_chunk = std::max<int64_t>(kRowsPerChunk, (R + 65534) / 65535);
  const int64_t chunks = (R + rows_per_chunk - 1) / rows_per_chunk;
  const DType partial_dtype = std::is_floating_point_v<acc_t<T>> ? DType::f64 : DType::i64;
  Tensor partial = Tensor::empty({chunks, K}, partial_dtype, in.device());
  const dim3 grid(static_cast<unsigned>((K + kTileColumns - 1) / kTileColumns),
                  static_cast<unsigned>(chunks));
  column_partials_kernel<T><<<grid, dim3(kTileColumns, kTileRows), 0, cuda::stream()>>>(
      op, ptr<T>(in), R, K, rows_per_chunk, identity, ptr<acc_t<T>>(partial));
  PIPIT_CUDA_CHECK_LAUNCH("reduce");
  column_finish_kernel<T><<<grid_for<1>(K), kThreads, 0, cuda::stream()>>>(
      op, ptr<acc_t<T>>(partial), chunks, K, ptr<T>(out));
  PIPIT_CUDA_CHECK_LAUNCH("reduce");
}

template <typename T>
void reduce_typed(ReduceOp op, const Tensor& in, const std::vector<bool>& reduced,
                  const Tensor& out) {
  const Indexer<1> kept_ix = sub_indexer(in, reduced, false);
  const Indexer<1> reduced_ix = sub_indexer(in, reduced, true);
  int64_t R = 1;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (reduced[static_cast<size_t>(d)]) R *= in.shape()[d];
  }
  const int64_t K = out.numel();
  if (K == 0) return;
  const acc_t<T> identity = op == ReduceOp::sum ? acc_t<T>(0)
                            : op == ReduceOp::max
                                ? acc_t<T>(std::numeric_limits<compute_t<T>>::lowest())
                                : acc_t<T>(std::numeric_limits<compute_t<T>>::max());
  if (K >= kTileColumns && R >= 2 * kTileRows && leading_reduction(in, reduced)) {
    reduce_columns<T>(op, in, R, K, identity, out);
    return;
  }
  const T* x = ptr<T>(in);
  T* o = ptr<T>(out);
  // Enough lanes per output to keep threads busy without leaving most of them idle.
  if (R >= 1024) {
    reduce_kernel<kThreads, T><<<grid_for<kThreads>(K), kThreads, 0, cuda::stream()>>>(
        op, x, kept_ix, reduced_ix, K, R, identity, o);
  } else if (R >= 32) {
    reduce_kernel<32, T><<<grid_for<32>(K), kThreads, 0, cuda::stream()>>>(
        op, x, kept_ix, reduced_ix, K, R, identity, o);
  } else {
    reduce_kernel<1, T><<<grid_for<1>(K), kThreads, 0, cuda::stream()>>>(op, x, kept_ix, reduced_ix,
                                                                         K, R, identity, o);
  }
  PIPIT_CUDA_CHECK_LAUNCH("reduce");
}

// argmax over contiguous rows of R: the first index of the largest value, as on the CPU.
template <typename T>
__global__ void argmax_kernel(const T* x, int64_t K, int64_t R, int64_t* out) {
  using C = compute_t<T>;
  __shared__ C best_value[kThreads];
  __shared__ int64_t best_index[kThreads];
  for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
    const T* row = x + k * R;
    int64_t bi = -1;
    C bv = C(0);
    for (int64_t r = threadIdx.x; r < R; r += kThreads) {
      if (bi < 0 || widen(row[r]) > bv) {
        bv = widen(row[r]);
        bi = r;
      }
    }
    best_value[threadIdx.x] = bv;
    best_index[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) {
        const int64_t oi = best_index[threadIdx.x + s];
        const C ov = best_value[threadIdx.x + s];
        const int64_t mi = best_index[threadIdx.x];
        if (oi >= 0 && (mi < 0 || ov > best_value[threadIdx.x] ||
                        (ov == best_value[threadIdx.x] && oi < mi))) {
          best_value[threadIdx.x] = ov;
          best_index[threadIdx.x] = oi;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[k] = best_index[0] < 0 ? 0 : best_index[0];
    __syncthreads();
  }
}

}  // namespace reduce
}  // namespace cuda

using namespace cuda::reduce;
using cuda::DeviceGuard;
using cuda::ptr;
using cuda::rows_grid;

void CudaBackend::reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
                         const Tensor& out) {
  DeviceGuard guard(index_);
  PIPIT_CHECK(out.is_contiguous(), "reduce: output must be contiguous");
  std::vector<bool> reduced(static_cast<size_t>(in.dim()), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(in.dtype(), "reduce",
                                       reduce_typed<scalar_t>(op, in, reduced, out));
}

void CudaBackend::argmax(const Tensor& in, int64_t dim, const Tensor& out) {
  DeviceGuard guard(index_);
  Tensor rows = dense(dim_last(in, dim));
  const int64_t R = in.shape()[dim];
  const int64_t K = out.numel();
  if (K == 0) return;
  PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(in.dtype(), "argmax", {
    argmax_kernel<scalar_t><<<rows_grid(K), cuda::kThreads, 0, cuda::stream()>>>(
        ptr<scalar_t>(rows), K, R, ptr<int64_t>(out));
  });
  PIPIT_CUDA_CHECK_LAUNCH("argmax");
}

}  // namespace pipit
