// Copies, fills, random numbers and elementwise maps on CUDA.
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/host_staging.h"
#include "tensor/cuda/index_check.h"

namespace pipit {
namespace cuda {

namespace elementwise {

// GELU, tanh form, with the same overflow-free terms as tensor/cpu/vec_math.h.
template <typename T>
struct GeluTerms {
  T s, s_one_minus_s;
};

template <typename T>
__device__ __forceinline__ GeluTerms<T> gelu_terms(T x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  constexpr double kGeluCoeff = 0.044715;
  const T z = T(2 * kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
  const T e = exp_(-(z < T(0) ? -z : z));
  const T q = T(1) / (T(1) + e);
  return {z >= T(0) ? q : e * q, e * q * q};
}

template <typename T>
__device__ __forceinline__ T gelu_derivative(T x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  constexpr double kGeluCoeff = 0.044715;
  const GeluTerms<T> t = gelu_terms(x);
  const T dz = T(2 * kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
  return t.s + x * t.s_one_minus_s * dz;
}

// Elements each thread moves per access in the contiguous case: 16 bytes of the wider type,
// so loads and stores are single 128-bit instructions.
template <typename... T>
constexpr int vector_width() {
  return static_cast<int>(16 / std::max({sizeof(T)...}));
}

template <int W, typename... Ptr>
bool packs_aligned(const Ptr*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % (sizeof(Ptr) * W) == 0) && ...);
}

template <typename O, typename I, int W, typename F>
__global__ void map1_packed(int64_t packs, const I* x, O* o, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const Pack<I, W> in = reinterpret_cast<const Pack<I, W>*>(x)[p];
    Pack<O, W> out;
    for (int k = 0; k < W; ++k) out.v[k] = f(in.v[k]);
    reinterpret_cast<Pack<O, W>*>(o)[p] = out;
  }
}

template <typename O, typename A, typename B, int W, typename F>
__global__ void map2_packed(int64_t packs, const A* x, const B* y, O* o, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const Pack<A, W> a = reinterpret_cast<const Pack<A, W>*>(x)[p];
    const Pack<B, W> b = reinterpret_cast<const Pack<B, W>*>(y)[p];
    Pack<O, W> out;
    for (int k = 0; k < W; ++k) out.v[k] = f(a.v[k], b.v[k]);
    reinterpret_cast<Pack<O, W>*>(o)[p] = out;
  }
}

unsigned grid_for_packs(int64_t packs) {
  return static_cast<unsigned>(
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{1} << 16));
}

// Contiguous operands go through the packed kernel, then the few trailing elements through the
// strided path; everything else through the strided path alone.
template <typename O, typename I, typename F>
void map1(const char* op, const Tensor& in, const Tensor& out, F f) {
  const I* x = ptr<I>(in);
  O* o = ptr<O>(out);
  constexpr int W = vector_width<O, I>();
  const int64_t n = out.numel();
  int64_t done = 0;
  if (make_indexer<2>(op, out.shape(), {&out, &in}).contiguous && packs_aligned<W>(x, o)) {
    const int64_t packs = n / W;
    if (packs > 0) {
      map1_packed<O, I, W><<<grid_for_packs(packs), kThreads, 0, stream()>>>(packs, x, o, f);
      PIPIT_CUDA_CHECK_LAUNCH(op);
    }
    done = packs * W;
    for_each(op, n - done, [=] __device__(int64_t i) { o[done + i] = f(x[done + i]); });
    return;
  }
  for_each_strided<2>(op, out.shape(), {&out, &in},
                      [=] __device__(const int64_t(&off)[2]) { o[off[0]] = f(x[off[1]]); });
}

// Same-dtype copies move the element's bytes, so every value (i64 above 2^53 included)
// arrives exactly. Copies, autocast's casts among them, take map1's 16-byte accesses where
// both sides are contiguous.
template <typename Word>
void copy_words(const Tensor& src, const Tensor& dst) {
  map1<Word, Word>("copy", src, dst, [] __device__(Word w) { return w; });
}

template <typename D, typename S>
void convert(const Tensor& src, const Tensor& dst) {
  map1<D, S>("copy", src, dst, [] __device__(S x) { return from_double<D>(to_double(x)); });
}

// dst = src with both on the current device.
void copy_on_device(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    switch (dtype_size(src.dtype())) {
      case 1:
        return copy_words<uint8_t>(src, dst);
      case 2:
        return copy_words<uint16_t>(src, dst);
      case 4:
        return copy_words<uint32_t>(src, dst);
      default:
        return copy_words<uint64_t>(src, dst);
    }
  }
  PIPIT_CUDA_DISPATCH_ALL(dst.dtype(), "copy", {
    using D = scalar_t;
    PIPIT_CUDA_DISPATCH_ALL(src.dtype(), "copy", convert<D, scalar_t>(src, dst));
  });
}

// Operands of types A and B (B = A unless named).
template <typename O, typename A, typename B = A, typename F>
void map2(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const A* x = ptr<A>(a);
  const B* y = ptr<B>(b);
  O* o = ptr<O>(out);
  constexpr int W = vector_width<O, A, B>();
  const int64_t n = out.numel();
  if (make_indexer<3>(op, out.shape(), {&out, &a, &b}).contiguous && packs_aligned<W>(x, y, o)) {
    const int64_t packs = n / W;
    if (packs > 0) {
      map2_packed<O, A, B, W><<<grid_for_packs(packs), kThreads, 0, stream()>>>(packs, x, y, o, f);
      PIPIT_CUDA_CHECK_LAUNCH(op);
    }
    const int64_t done = packs * W;
    for_each(op, n - done,
             [=] __device__(int64_t i) { o[done + i] = f(x[done + i], y[done + i]); });
    return;
  }
  for_each_strided<3>(op, out.shape(), {&out, &a, &b}, [=] __device__(const int64_t(&off)[3]) {
    o[off[0]] = f(x[off[1]], y[off[2]]);
  });
}

// The maps below compute in C = compute_t<T>: half elements widen to f32 and round once.
template <typename T, typename F>
void map1_in_compute(const Tensor& in, const Tensor& out, F f) {
  map1<T, T>("unary", in, out, InCompute<T, F>{f});
}

template <typename T, typename F>
void map2_in_compute(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  map2<T, T>("binary", a, b, out, InCompute<T, F>{f});
}

template <typename T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    case UnaryOp::neg:
      return map1_in_compute<T>(in, out, [] __device__(C x) { return C(-x); });
    case UnaryOp::abs:
      return map1_in_compute<T>(in, out, [] __device__(C x) { return C(x < 0 ? -x : x); });
    case UnaryOp::relu:
      return map1_in_compute<T>(in, out, [] __device__(C x) { return C(x > 0 ? x : 0); });
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::exp:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return exp_(x); });
      case UnaryOp::log:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return C(log(x)); });
      case UnaryOp::sqrt:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return C(sqrt(x)); });
      case UnaryOp::tanh:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return C(tanh(x)); });
      case UnaryOp::sigmoid:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return C(1) / (C(1) + exp_(-x)); });
      case UnaryOp::gelu:
        return map1_in_compute<T>(in, out, [] __device__(C x) { return x * gelu_terms(x).s; });
      default:
        break;
    }
  }
  throw Error(detail::concat("unary: op not supported for dtype ", in.dtype()));
}

template <typename T>
void compare_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::eq:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) == widen(y); });
    case BinaryOp::ne:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) != widen(y); });
    case BinaryOp::lt:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) < widen(y); });
    case BinaryOp::le:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) <= widen(y); });
    case BinaryOp::gt:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) > widen(y); });
    case BinaryOp::ge:
      return map2<bool, T>("compare", a, b, out,
                           [] __device__(T x, T y) { return widen(x) >= widen(y); });
    default:
      throw Error("compare: not a comparison");
  }
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    case BinaryOp::add:
      return map2_in_compute<T>(a, b, out, [] __device__(C x, C y) { return C(x + y); });
    case BinaryOp::sub:
      return map2_in_compute<T>(a, b, out, [] __device__(C x, C y) { return C(x - y); });
    case BinaryOp::mul:
      return map2_in_compute<T>(a, b, out, [] __device__(C x, C y) { return C(x * y); });
    case BinaryOp::maximum:
      return map2_in_compute<T>(a, b, out,
                                [] __device__(C x, C y) { return x > y || x != x ? x : y; });
    case BinaryOp::minimum:
      return map2_in_compute<T>(a, b, out,
                                [] __device__(C x, C y) { return x < y || x != x ? x : y; });
    case BinaryOp::div:
      PIPIT_CHECK(!std::is_integral_v<T>,
                  "div: integer division is not supported; convert to a float dtype");
      return map2_in_compute<T>(a, b, out, [] __device__(C x, C y) { return C(x / y); });
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case BinaryOp::pow:
        return map2_in_compute<T>(a, b, out, [] __device__(C x, C y) { return C(pow(x, y)); });
      case BinaryOp::relu_backward:
        return map2_in_compute<T>(a, b, out, [] __device__(C g, C x) { return x > 0 ? g : C(0); });
      case BinaryOp::tanh_backward:
        return map2_in_compute<T>(a, b, out,
                                  [] __device__(C g, C y) { return g * (C(1) - y * y); });
      case BinaryOp::sigmoid_backward:
        return map2_in_compute<T>(a, b, out,
                                  [] __device__(C g, C y) { return g * (y * (C(1) - y)); });
      case BinaryOp::gelu_backward:
        return map2_in_compute<T>(a, b, out,
                                  [] __device__(C g, C x) { return g * gelu_derivative(x); });
      default:
        break;
    }
  }
  throw Error(detail::concat("binary: op not supported for dtype ", a.dtype()));
}

// out (f32) = wide (f32) + half, the half operand widened as it is read: a residual joining
// autocast's half activations without an f32 copy of them. f32 addition commutes exactly, so
// either operand order gives these bits.
template <typename H>
void add_widened(const Tensor& wide, const Tensor& half, const Tensor& out) {
  map2<float, float, H>("binary", wide, half, out,
                        [] __device__(float x, H y) { return x + widen(y); });
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
         op == BinaryOp::gt || op == BinaryOp::ge;
}

// The generator's mixing function (tensor/generator.cpp), so that CUDA draws the very numbers
// the CPU draws for the same seed and counters.
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The counters one op reserved from a Generator: element i draws Generator::bits(base + i).
struct Draws {
  uint64_t mixed_seed, base;

  __device__ uint64_t bits(int64_t i) const {
    return mix64(mixed_seed + (base + static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull);
  }
  // Generator::uniform: 53 random bits scaled into [0, 1), exactly.
  __device__ double uniform(int64_t i) const {
    return static_cast<double>(bits(i) >> 11) * (1.0 / 9007199254740992.0);
  }
};

Draws reserve_draws(Generator& generator, int64_t n) {
  // The counters are the kernel's arguments: a graph would replay the same numbers each time.
  PIPIT_CHECK(!capturing(),
              "random draws inside cuda::Graph::capture would repeat at every "
              "replay; capture without dropout or other random ops");
  const uint64_t base = generator.reserve(static_cast<uint64_t>(n));
  return {mix64(generator.seed() ^ 0x632be59bd9b4e019ull), base};
}

template <typename T, typename F>
void fill_indexed(const char* op, const Tensor& out, F value_at) {
  PIPIT_CHECK(out.is_contiguous(), op, ": output must be contiguous");
  T* o = ptr<T>(out);
  for_each(op, out.numel(), [=] __device__(int64_t i) { o[i] = T(value_at(i)); });
}

}  // namespace elementwise
}  // namespace cuda

using namespace cuda::elementwise;
using cuda::DeviceGuard;
using cuda::ptr;

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  PIPIT_CHECK(src.shape() == dst.shape(), "copy: source shape ", shape_str(src.shape()),
              " differs from destination shape ", shape_str(dst.shape()));
  if (src.numel() == 0) return;
  if (src.device().is_cpu()) {
    // Host to device: convert and compact on the host, then one transfer.
    DeviceGuard guard(dst.device().index);
    Tensor host = src;
    if (src.dtype() != dst.dtype() || !src.is_contiguous()) {
      host = Tensor::empty(src.shape(), dst.dtype());
      backend(src).copy(src, host);
    }
    Tensor landing =
        dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
    cuda::copy_host_to_device(landing.raw_data(), host.raw_data(), host.nbytes());
    if (!landing.same_storage(dst)) copy_on_device(landing, dst);
    return;
  }
  if (dst.device().is_cpu()) {
    // Device to host: compact on the device, one transfer, convert on the host.
    DeviceGuard guard(src.device().index);
    Tensor compact = dense(src);
    const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
    Tensor host = direct ? dst : Tensor::empty(src.shape(), src.dtype());
    cuda::copy_device_to_host(host.raw_data(), compact.raw_data(), compact.nbytes());
    // The host has waited for the stream: a bad index queued before surfaces here.
    cuda::raise_index_faults(cuda::current_stream_handle(src.device().index));
    if (!direct) backend(dst).copy(host, dst);
    return;
  }
  if (src.device() != dst.device()) {
    // Between GPUs: compact on the source, copy the bytes across, finish on the destination.
    // cudaMemcpyPeer is not stream-ordered, so a graph would not record it.
    PIPIT_CHECK(!cuda::capturing(),
                "copy: a copy between GPUs inside cuda::Graph::capture cannot be replayed");
    Tensor compact;
    {
      DeviceGuard guard(src.device().index);
      compact = dense(src);
    }
    DeviceGuard guard(dst.device().index);
    Tensor landing = Tensor::empty(src.shape(), src.dtype(), dst.device());
    PIPIT_CUDA_CHECK("copy",
                     cudaMemcpyPeer(landing.raw_data(), dst.device().index, compact.raw_data(),
                                    src.device().index, compact.nbytes()));
    copy_on_device(landing, dst);
    return;
  }
  DeviceGuard guard(dst.device().index);
  copy_on_device(src, dst);
}

void CudaBackend::fill(const Tensor& out, double value) {
  DeviceGuard guard(index_);
  PIPIT_CUDA_DISPATCH_ALL(out.dtype(), "fill", {
    scalar_t* o = ptr<scalar_t>(out);
    cuda::for_each_strided<1>("fill", out.shape(), {&out}, [=] __device__(const int64_t(&off)[1]) {
      o[off[0]] = cuda::from_double<scalar_t>(value);
    });
  });
}

void CudaBackend::arange(const Tensor& out, double start, double step) {
  DeviceGuard guard(index_);
  PIPIT_DISPATCH_NUMERIC(out.dtype(), "arange", {
    fill_indexed<scalar_t>("arange", out, [=] __device__(int64_t i) {
      // Rounded multiply and add (no FMA contraction), as the CPU computes it.
      return __dadd_rn(start, __dmul_rn(step, static_cast<double>(i)));
    });
  });
}

void CudaBackend::uniform(const Tensor& out, Generator& generator, double low, double high) {
  DeviceGuard guard(index_);
  const Draws draws = reserve_draws(generator, out.numel());
  PIPIT_DISPATCH_FLOAT(out.dtype(), "uniform", {
    fill_indexed<scalar_t>("uniform", out, [=] __device__(int64_t i) {
      // No FMA contraction: the CPU's rounding.
      return __dadd_rn(low, __dmul_rn(high - low, draws.uniform(i)));
    });
  });
}

void CudaBackend::dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
                          const Tensor& mask) {
  DeviceGuard guard(index_);
  PIPIT_CHECK(in.is_contiguous() && out.is_contiguous() && mask.is_contiguous(),
              "dropout: tensors must be contiguous");
  const Draws draws = reserve_draws(generator, out.numel());
  PIPIT_CUDA_DISPATCH_FLOAT_AND_HALF(out.dtype(), "dropout", {
    using T = scalar_t;
    using C = cuda::compute_t<T>;
    const T* x = ptr<T>(in);
    T* o = ptr<T>(out);
    T* m = ptr<T>(mask);
    const C threshold = C(p), scale = C(1.0 / (1.0 - p));
    // The draw uniform(out) makes for element i, rounded to C as uniform stores it; the mask
    // holds the scale in T, and the output is the input times that mask, rounded once.
    cuda::for_each("dropout", out.numel(), [=] __device__(int64_t i) {
      const T kept = cuda::round_to<T>(C(draws.uniform(i)) >= threshold ? scale : C(0));
      m[i] = kept;
      o[i] = cuda::round_to<T>(cuda::widen(x[i]) * cuda::widen(kept));
    });
  });
}

void CudaBackend::normal(const Tensor& out, Generator& generator, double mean, double std) {
  DeviceGuard guard(index_);
  const Draws draws = reserve_draws(generator, out.numel());
  // Box-Muller on the two 32-bit halves of one counter's bits, as on the CPU.
  PIPIT_DISPATCH_FLOAT(out.dtype(), "normal", {
    fill_indexed<scalar_t>("normal", out, [=] __device__(int64_t i) {
      const uint64_t bits = draws.bits(i);
      const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;
      const double u2 = static_cast<double>(bits & 0xffffffffu) / 4294967296.0;
      return mean + std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    });
  });
}

void CudaBackend::unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  DeviceGuard guard(index_);
  PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(in.dtype(), "unary", unary_typed<scalar_t>(op, in, out));
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DeviceGuard guard(index_);
  if (is_comparison(op)) {
    if (a.dtype() == DType::b8) return compare_typed<bool>(op, a, b, out);
    PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(a.dtype(), "compare",
                                         compare_typed<scalar_t>(op, a, b, out));
    return;
  }
  if (a.dtype() != b.dtype()) {
    check_widening_add(op, a, b, out);
    const bool a_wide = a.dtype() == DType::f32;
    const Tensor& wide = a_wide ? a : b;
    const Tensor& half = a_wide ? b : a;
    if (half.dtype() == DType::bf16) return add_widened<__nv_bfloat16>(wide, half, out);
    return add_widened<__half>(wide, half, out);
  }
  PIPIT_CUDA_DISPATCH_NUMERIC_AND_HALF(a.dtype(), "binary", binary_typed<scalar_t>(op, a, b, out));
}

void CudaBackend::where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) {
  DeviceGuard guard(index_);
  PIPIT_CUDA_DISPATCH_ALL(out.dtype(), "where", {
    using T = scalar_t;
    T* o = ptr<T>(out);
    const bool* m = ptr<bool>(mask);
    const T* x = ptr<T>(a);
    const T* y = ptr<T>(b);
    cuda::for_each_strided<4>(
        "where", out.shape(), {&out, &mask, &a, &b},
        [=] __device__(const int64_t(&off)[4]) { o[off[0]] = m[off[1]] ? x[off[2]] : y[off[3]]; });
  });
}

}  // namespace pipit
