// Memory, copies, fills, random numbers and optimizer updates on the CPU.
#include "tensor/cpu/cpu_backend.h"

#include <cblas.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "tensor/cpu/cpu_allocator.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"

namespace pipit {

using cpu::byte_ptr;

namespace {

int initial_threads() {
  // OpenBLAS starts a thread per core; a second pool would spin against pipit's OpenMP threads
  // for the same cores, so GEMMs are split over pipit's threads instead (matmul.cpp).
  openblas_set_num_threads(1);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int> g_threads{initial_threads()};

template <typename D, typename S>
void copy_typed(const Tensor& src, const Tensor& dst) {
  auto loop = cpu::make_loop<2>(dst.shape(), {&dst, &src});
  cpu::for_each_row<2>(
      loop, {byte_ptr(dst), byte_ptr(src)}, {sizeof(D), sizeof(S)}, [&](auto p, int64_t n, auto s) {
        D* d = reinterpret_cast<D*>(p[0]);
        const S* x = reinterpret_cast<const S*>(p[1]);
        // Unit strides get their own loop, which the compiler vectorises: casts of a KV cache
        // or of activations under autocast are rows of unit stride.
        auto map = [&](auto f) {
          if (s[0] == 1 && s[1] == 1) {
            for (int64_t i = 0; i < n; ++i) d[i] = f(x[i]);
          } else {
            for (int64_t i = 0; i < n; ++i) d[i * s[0]] = f(x[i * s[1]]);
          }
        };
        if constexpr (std::is_same_v<D, S>) {
          // Never through double: i64 beyond 2^53 would round, and near
          // INT64_MAX convert back out of range (undefined behaviour).
          map([](S v) { return v; });
        } else if constexpr (std::is_same_v<D, cpu::BFloat16> && std::is_same_v<S, float>) {
          if (s[0] == 1 && s[1] == 1) return cpu::round_bf16_row(x, &d->bits, n);
          map([](float v) { return std::bit_cast<cpu::BFloat16>(float_to_bfloat16(v)); });
        } else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, cpu::BFloat16>) {
          if (s[0] == 1 && s[1] == 1) return cpu::widen_bf16_row(&x->bits, d, n);
          map([](cpu::BFloat16 v) { return bfloat16_to_float(v.bits); });
        } else if constexpr (std::is_same_v<D, bool>) {
          map([](S v) { return static_cast<double>(v) != 0.0; });
        } else {
          map([](S v) { return D(static_cast<double>(v)); });
        }
      });
}

template <typename T, typename F>
void fill_indexed(const Tensor& out, F value_at) {
  PIPIT_CHECK(out.is_contiguous(), "fill: output must be contiguous");
  T* o = static_cast<T*>(out.raw_data());
  int64_t n = out.numel();
  cpu::parallel_range(n, cpu::threads_for(n), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) o[i] = T(value_at(i));
  });
}

}  // namespace

void set_num_threads(int threads) {
  PIPIT_CHECK(threads >= 1, "set_num_threads: threads must be >= 1, got ", threads);
  g_threads = threads;
  openblas_set_num_threads(1);  // in case the application raised it since start-up
}

int get_num_threads() {
  return g_threads.load();
}

std::shared_ptr<Storage> CpuBackend::allocate(size_t nbytes) {
  return cpu_allocate(nbytes);
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  PIPIT_CHECK(src.shape() == dst.shape(), "copy: source shape ", shape_str(src.shape()),
              " differs from destination shape ", shape_str(dst.shape()));
  PIPIT_DISPATCH_ALL(dst.dtype(), "copy", {
    using D = scalar_t;
    PIPIT_DISPATCH_ALL(src.dtype(), "copy", copy_typed<D, scalar_t>(src, dst));
  });
}

namespace {

// Whether t's elements fill numel() consecutive slots of its storage in some order of its dims,
// as a transposed view's do.
bool fills_its_span(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size), size-1 dims left out
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] != 1) dims.emplace_back(t.strides()[d], t.shape()[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

}  // namespace

Tensor cpu::widened(const Tensor& t) {
  if (!is_half(t.dtype())) return t;
  if (!t.is_contiguous() && fills_its_span(t)) {
    // In memory order, into a copy with t's strides: a unit-stride loop rather than a strided
    // gather (a transposed gradient widened for its bias sum).
    const Tensor flat = Tensor::from_storage(t.storage(), {t.numel()}, {1}, t.offset(), t.dtype());
    Tensor wide = Tensor::empty({t.numel()}, DType::f32);
    PIPIT_DISPATCH_ALL(t.dtype(), "copy", copy_typed<float, scalar_t>(flat, wide));
    return Tensor::from_storage(wide.storage(), t.shape(), t.strides(), 0, DType::f32);
  }
  Tensor wide = Tensor::empty(t.shape(), DType::f32);
  PIPIT_DISPATCH_ALL(t.dtype(), "copy", copy_typed<float, scalar_t>(t, wide));
  return wide;
}

void cpu::copy_rounded(const Tensor& wide, const Tensor& out) {
  PIPIT_DISPATCH_ALL(out.dtype(), "copy", copy_typed<scalar_t, float>(wide, out));
}

void CpuBackend::fill(const Tensor& out, double value) {
  PIPIT_DISPATCH_ALL(out.dtype(), "fill", {
    scalar_t v = scalar_t(value);
    auto loop = cpu::make_loop<1>(out.shape(), {&out});
    cpu::for_each_row<1>(loop, {byte_ptr(out)}, {sizeof(scalar_t)}, [&](auto p, int64_t n, auto s) {
      scalar_t* o = reinterpret_cast<scalar_t*>(p[0]);
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = v;
    });
  });
}

void CpuBackend::arange(const Tensor& out, double start, double step) {
  PIPIT_DISPATCH_NUMERIC(out.dtype(), "arange", fill_indexed<scalar_t>(out, [&](int64_t i) {
                           return start + step * static_cast<double>(i);
                         }));
}

void CpuBackend::uniform(const Tensor& out, Generator& generator, double low, double high) {
  uint64_t base = generator.reserve(static_cast<uint64_t>(out.numel()));
  PIPIT_DISPATCH_FLOAT(out.dtype(), "uniform", fill_indexed<scalar_t>(out, [&](int64_t i) {
                         return low + (high - low) * generator.uniform(base + i);
                       }));
}

void CpuBackend::dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
                         const Tensor& mask) {
  PIPIT_CHECK(in.is_contiguous() && out.is_contiguous() && mask.is_contiguous(),
              "dropout: tensors must be contiguous");
  uint64_t base = generator.reserve(static_cast<uint64_t>(out.numel()));
  PIPIT_DISPATCH_FLOAT_AND_HALF(out.dtype(), "dropout", {
    using T = scalar_t;
    using C = cpu::compute_t<T>;
    const T* x = static_cast<const T*>(in.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    T* m = static_cast<T*>(mask.raw_data());
    // Half tensors draw as f32 does; the mask holds the scale rounded, and the output is the
    // input times that mask, rounded once.
    const C threshold = C(p);
    const T scale = T(1.0 / (1.0 - p));
    int64_t n = out.numel();
    cpu::parallel_range(n, cpu::threads_for(n), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        m[i] = C(generator.uniform(base + static_cast<uint64_t>(i))) >= threshold ? scale : T(0);
        o[i] = T(C(x[i]) * C(m[i]));
      }
    });
  });
}

void CpuBackend::normal(const Tensor& out, Generator& generator, double mean, double std) {
  uint64_t base = generator.reserve(static_cast<uint64_t>(out.numel()));
  // Box-Muller on the two 32-bit halves of one counter's bits.
  PIPIT_DISPATCH_FLOAT(out.dtype(), "normal", fill_indexed<scalar_t>(out, [&](int64_t i) {
                         uint64_t bits = generator.bits(base + i);
                         double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;
                         double u2 = static_cast<double>(bits & 0xffffffffu) / 4294967296.0;
                         return mean +
                                std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
                       }));
}

void CpuBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                          double lr, double momentum, double weight_decay, bool first_step) {
  PIPIT_DISPATCH_FLOAT(param.dtype(), "sgd_step", {
    using T = scalar_t;
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = momentum > 0 ? momentum_buffer.data<T>() : nullptr;
    int64_t n = param.numel();
    cpu::parallel_range(n, cpu::threads_for(n), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T d = g[i] + T(weight_decay) * p[i];
        if (buf) {
          buf[i] = first_step ? d : T(momentum) * buf[i] + d;
          d = buf[i];
        }
        p[i] -= T(lr) * d;
      }
    });
  });
}

void CpuBackend::adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& a) {
  for (const AdamWSlot& slot : slots) {
    PIPIT_DISPATCH_FLOAT(slot.param.dtype(), "adamw_step", {
      using T = scalar_t;
      T* p = slot.param.data<T>();
      const T* g = slot.grad.data<T>();
      T* m = slot.exp_avg.data<T>();
      T* v = slot.exp_avg_sq.data<T>();
      const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
      const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
      const T step_size = T(a.lr / bc1);
      const T bc2_sqrt = T(std::sqrt(bc2));
      const T decay = T(1.0 - a.lr * a.weight_decay);
      const T b1 = T(a.beta1), b2 = T(a.beta2), eps = T(a.eps);
      int64_t n = slot.param.numel();
      cpu::parallel_range(n, cpu::threads_for(n), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          p[i] *= decay;
          m[i] = b1 * m[i] + (T(1) - b1) * g[i];
          v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
          p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
        }
      });
    });
  }
}

}  // namespace pipit
