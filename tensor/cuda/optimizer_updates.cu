// Optimizer updates on CUDA: SGD per parameter, AdamW over every parameter in one launch.
#include <cmath>
#include <span>
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/host_staging.h"

namespace pipit {
namespace cuda {
namespace {

// AdamW over many parameters in one launch: the host cuts every parameter into chunks of
// kAdamWChunk elements and ships the chunk table to the device; block b updates chunk b.
constexpr int64_t kAdamWChunk = 16 * kThreads;

template <typename T>
struct AdamWChunk {
  T* p;
  const T* g;
  T* m;
  T* v;
  int64_t n;
};

template <typename T>
struct AdamWScalars {
  T step_size, bc2_sqrt, decay, b1, b2, eps;
};

template <typename T>
__global__ void adamw_kernel(const AdamWChunk<T>* chunks, AdamWScalars<T> s) {
  const AdamWChunk<T> c = chunks[blockIdx.x];
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    T p = c.p[i] * s.decay;
    const T g = c.g[i];
    const T m = s.b1 * c.m[i] + (T(1) - s.b1) * g;
    const T v = s.b2 * c.v[i] + (T(1) - s.b2) * g * g;
    c.m[i] = m;
    c.v[i] = v;
    c.p[i] = p - s.step_size * m / (T(sqrt(v)) / s.bc2_sqrt + s.eps);
  }
}

template <typename T>
void adamw_multi(std::span<const AdamWSlot> slots, const AdamWParams& a) {
  std::vector<AdamWChunk<T>> chunks;
  for (const AdamWSlot& slot : slots) {
    T* p = slot.param.data<T>();
    const T* g = slot.grad.data<T>();
    T* m = slot.exp_avg.data<T>();
    T* v = slot.exp_avg_sq.data<T>();
    for (int64_t begin = 0; begin < slot.param.numel(); begin += kAdamWChunk) {
      chunks.push_back({p + begin, g + begin, m + begin, v + begin,
                        std::min(kAdamWChunk, slot.param.numel() - begin)});
    }
  }
  if (chunks.empty()) return;
  // Scalars are formed on the host exactly as the CPU backend forms them.
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const AdamWScalars<T> s{T(a.lr / bc1), T(std::sqrt(bc2)), T(1.0 - a.lr * a.weight_decay),
                          T(a.beta1),    T(a.beta2),        T(a.eps)};
  const size_t bytes = chunks.size() * sizeof(AdamWChunk<T>);
  // The table lives in a tensor, so the caching allocator keeps it until the launch has run.
  Tensor table =
      Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::i64, slots[0].param.device());
  copy_host_to_device(table.raw_data(), chunks.data(), bytes);
  PIPIT_CHECK(chunks.size() < (size_t{1} << 31), "adamw_step: ", chunks.size(), " chunks");
  adamw_kernel<T><<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream()>>>(
      static_cast<const AdamWChunk<T>*>(table.raw_data()), s);
  PIPIT_CUDA_CHECK_LAUNCH("adamw_step");
}

}  // namespace
}  // namespace cuda

using cuda::DeviceGuard;

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                           double lr, double momentum, double weight_decay, bool first_step) {
  DeviceGuard guard(index_);
  PIPIT_DISPATCH_FLOAT(param.dtype(), "sgd_step", {
    using T = scalar_t;
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = momentum > 0 ? momentum_buffer.data<T>() : nullptr;
    cuda::for_each("sgd_step", param.numel(), [=] __device__(int64_t i) {
      T d = g[i] + T(weight_decay) * p[i];
      if (buf) {
        buf[i] = first_step ? d : T(momentum) * buf[i] + d;
        d = buf[i];
      }
      p[i] -= T(lr) * d;
    });
  });
}

void CudaBackend::adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& a) {
  DeviceGuard guard(index_);
  if (slots.empty()) return;
  const DType dtype = slots[0].param.dtype();
  for (const AdamWSlot& slot : slots) {
    PIPIT_CHECK(slot.param.dtype() == dtype, "adamw_step: parameters of dtypes ", dtype, " and ",
                slot.param.dtype(), " in one call");
  }
  PIPIT_DISPATCH_FLOAT(dtype, "adamw_step", cuda::adamw_multi<scalar_t>(slots, a));
}

}  // namespace pipit
