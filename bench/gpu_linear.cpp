// pipit's half of bench/gpu_linear.py: Linear forward and backward on cuda:0 through autograd
// (`linear`), as a training step runs it: an f32 input that requires grad, f32 weight and
// bias, the gradient of the output given. The bias rides in cuBLASLt's epilogues
// (Backend::matmul_bias, matmul_bias_grad). Prints one JSON line per (mode, shape):
// {"mode", "m", "k", "n", "forward_ms": [...], "step_ms": [...]}, step = forward + backward.
// modes: f32, tf32 (set_float32_matmul_precision("high")), bf16 (AutocastGuard(bf16)).
//
// usage: gpu_linear [--modes bf16,tf32,f32] [--shapes 8192x768x2304,...] [--warmup 3]
//                   [--repeats 10]
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "autograd/autocast.h"
#include "bench/gpu_bench.h"
#include "pipit.h"
#include "support/flags.h"
#include "tensor/precision.h"
#include "tensor/stream.h"

using namespace pipit;

namespace {

nlohmann::json time_linear(const std::string& mode, const std::string& shape, int64_t warmup,
                           int64_t repeats) {
  int64_t M = 0, K = 0, N = 0;
  PIPIT_CHECK(std::sscanf(shape.c_str(), "%ldx%ldx%ld", &M, &K, &N) == 3, "shape '", shape,
              "' is not MxKxN");
  const Device device = Device::cuda(0);
  set_float32_matmul_precision(mode == "tf32" ? "high" : "highest");
  Generator generator(0);
  const Tensor x = randn({M, K}, &generator, {DType::f32, device}).requires_grad_();
  const Tensor weight = (randn({N, K}, &generator, {DType::f32, device}) * 0.02).requires_grad_();
  const Tensor bias = zeros({N}, {DType::f32, device}).requires_grad_();
  const DType out_dtype = mode == "bf16" ? DType::bf16 : DType::f32;
  const Tensor grad = randn({M, N}, &generator, {DType::f32, device}).to(out_dtype);
  AutocastGuard autocast(out_dtype);
  auto zero_grads = [&] {
    for (Tensor t : {x, weight, bias}) t.zero_grad();
  };
  const auto forward_ms = bench::time_ms(warmup, repeats, [&] {
    NoGradGuard no_grad;
    linear(x, weight, bias);
    synchronize(device);
  });
  const auto step_ms = bench::time_ms(warmup, repeats, [&] {
    zero_grads();
    linear(x, weight, bias).backward(grad);
    synchronize(device);
  });
  set_float32_matmul_precision("highest");
  return {{"mode", mode},      {"m", M}, {"k", K}, {"n", N}, {"forward_ms", forward_ms},
          {"step_ms", step_ms}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("gpu_linear", "Linear forward and backward on one GPU, per mode.");
    flags.add("modes", "bf16,tf32,f32", "precision modes to time (f32, tf32, bf16)");
    // GPT-2 small's Linears at batch 8, context 1024: qkv, proj, fc, fc2 and the padded head.
    flags.add("shapes", "8192x768x2304,8192x768x768,8192x768x3072,8192x3072x768,8192x768x50304",
              "MxKxN shapes: M rows of K inputs to N outputs");
    bench::add_timing_flags(flags);
    flags.parse(argc, argv);
    const auto modes = flags.choices("modes", {"f32", "tf32", "bf16"});
    const auto shapes = flags.items("shapes");
    const auto [warmup, repeats] = bench::timing(flags);
    if (!bench::has_cuda_device("gpu_linear")) return 0;
    for (const auto& mode : modes) {
      for (const auto& shape : shapes) {
        bench::print_row(time_linear(mode, shape, warmup, repeats));
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_linear: %s\n", e.what());
    return 1;
  }
}
