// pipit's half of bench/gpu_attention.py: causal attention forward and backward on cuda:0
// through Backend::attention and attention_backward into preallocated outputs, so the time
// is the kernels and nothing of autograd. q, k, v are [B, H, T, D] views of one packed
// [B, T, 3, H, D] projection, as CausalSelfAttention reads them. Prints one JSON line per
// (dtype, shape): {"dtype", "batch", "heads", "context", "head_dim", "forward_ms": [...],
// "provider", "step_ms": [...]} with step = forward + backward. --provider picks pipit's kernels
// or cuDNN's fused attention (tensor/cuda/attention_provider.h) for bf16/f16.
//
// usage: gpu_attention [--dtypes bf16,f16,f32] [--shapes 8x12x1024x64,2x12x4096x64]
//                      [--provider pipit|cudnn] [--warmup 3] [--repeats 10]
#include <cmath>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "bench/gpu_bench.h"
#include "pipit.h"
#include "support/flags.h"
#include "tensor/cuda/attention_provider.h"
#include "tensor/kernel_layout.h"
#include "tensor/stream.h"

using namespace pipit;

namespace {

nlohmann::json time_attention(const std::string& dtype_name, const std::string& shape,
                              const std::string& provider, int64_t warmup, int64_t repeats) {
  const DType dtype = dtype_name == "bf16"  ? DType::bf16
                      : dtype_name == "f16" ? DType::f16
                                            : DType::f32;
  int64_t B = 0, H = 0, T = 0, D = 0;
  PIPIT_CHECK(std::sscanf(shape.c_str(), "%ldx%ldx%ldx%ld", &B, &H, &T, &D) == 4, "shape '", shape,
              "' is not BxHxTxD");
  const Device device = Device::cuda(0);
  Generator generator(0);
  const Tensor packed = randn({B, T, 3, H, D}, &generator, {DType::f32, device}).to(dtype);
  const Tensor heads = permute(packed, {2, 0, 3, 1, 4});
  const Tensor q = squeeze(narrow(heads, 0, 0, 1), 0), k = squeeze(narrow(heads, 0, 1, 1), 0),
               v = squeeze(narrow(heads, 0, 2, 1), 0);
  const Tensor grad = randn({B, H, T, D}, &generator, {DType::f32, device}).to(dtype);
  const Tensor out = transpose(empty({B, T, H, D}, {dtype, device}), 1, 2);
  const Tensor lse = empty({B, H, T}, {accumulate_dtype(dtype), device});
  const Tensor dq = empty({B, H, T, D}, {dtype, device}), dk = empty({B, H, T, D}, {dtype, device}),
               dv = empty({B, H, T, D}, {dtype, device});
  Backend& kernels = backend(device);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto forward_ms = bench::time_ms(warmup, repeats, [&] {
    kernels.attention(q, k, v, scale, true, out, lse);
    synchronize(device);
  });
  const auto step_ms = bench::time_ms(warmup, repeats, [&] {
    kernels.attention(q, k, v, scale, true, out, lse);
    kernels.attention_backward(grad, q, k, v, out, lse, scale, true, dq, dk, dv);
    synchronize(device);
  });
  return {{"dtype", dtype_name},
          {"provider", provider},
          {"batch", B},
          {"heads", H},
          {"context", T},
          {"head_dim", D},
          {"forward_ms", forward_ms},
          {"step_ms", step_ms}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("gpu_attention",
                         "Fused causal attention on one GPU, forward and backward.");
    flags.add("dtypes", "bf16,f16,f32", "dtypes to time");
    flags.add("shapes", "8x12x1024x64,2x12x4096x64", "BxHxTxD shapes");
    flags.add("provider", "pipit", "pipit or cudnn");
    bench::add_timing_flags(flags);
    flags.parse(argc, argv);
    const auto dtypes = flags.choices("dtypes", {"bf16", "f16", "f32"});
    const auto shapes = flags.items("shapes");
    const std::string provider = flags.choice("provider", {"pipit", "cudnn"});
    const auto [warmup, repeats] = bench::timing(flags);
    if (!bench::has_cuda_device("gpu_attention")) return 0;
    cuda::set_attention_provider(provider == "cudnn" ? cuda::AttentionProvider::cudnn
                                                     : cuda::AttentionProvider::pipit);
    for (const auto& dtype : dtypes) {
      for (const auto& shape : shapes) {
        bench::print_row(time_attention(dtype, shape, provider, warmup, repeats));
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_attention: %s\n", e.what());
    return 1;
  }
}
