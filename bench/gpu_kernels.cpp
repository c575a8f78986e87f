// pipit's half of bench/gpu_kernels.py: GPT-2 small's memory-bound kernels on cuda:0 at batch
// 8, context 1024, through the API a training step uses. Prints one JSON line per kernel:
//   layer_norm:    f32 x [8192, 768] (the residual stream; LayerNorm runs in f32 under
//                  autocast), forward and forward + backward with the output's gradient given;
//   cross_entropy: bf16 logits [8192, 50257] (the head's output under bf16 autocast), mean
//                  loss, forward and forward + backward;
//   adamw:         one AdamW step over GPT-2 small's parameters (untied head, 163M), gradients
//                  set;
//   bias_grad:     (not in the default list, no torch side) a Linear's weight gradient with its
//                  bias gradient for each of GPT-2 small's Linear shapes, bf16 operands, f32
//                  results: cuBLASLt's BGRADB epilogue (Backend::matmul_bias_grad) against the
//                  plain product and a separate column sum of the output's gradient, and
//                  against the product split over 2 and 4 slices of the rows (a batched GEMM:
//                  more output tiles where one product's are too few to fill the GPU's SMs)
//                  whose parts are then summed in order, with the column sum; and
//                  matmul_bias_grad itself under cuda::set_weight_gradient_parts(2 and 4),
//                  which splits only outputs of fewer tiles than SMs (weight_gradient_split.h).
// {"kernel", "shape", "forward_ms": [...], "step_ms": [...]} (adamw: step_ms only; bias_grad:
// "fused_ms", "split_ms", "rows_in_2_ms", "rows_in_4_ms", "parts_2_ms" and "parts_4_ms").
//
// usage: gpu_kernels [--kernels layer_norm,cross_entropy,adamw,bias_grad] [--warmup 3]
//                    [--repeats 10] [--device cuda]
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "bench/gpu_bench.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/flags.h"
#include "tensor/cuda/weight_gradient_split.h"
#include "tensor/stream.h"

using namespace pipit;

namespace {

constexpr int64_t kRows = 8 * 1024, kWidth = 768, kVocab = 50257, kLayers = 12;
// cuda:0 unless --device cpu (a check of this program on a machine without a GPU).
Device g_device = Device::cuda(0);

template <typename Forward>
nlohmann::json time_forward_and_step(const std::string& kernel, const std::string& shape,
                                     const std::vector<Tensor>& leaves, const Tensor& grad,
                                     int64_t warmup, int64_t repeats, Forward forward) {
  const auto forward_ms = bench::time_ms(warmup, repeats, [&] {
    NoGradGuard no_grad;
    forward();
    synchronize(g_device);
  });
  const auto step_ms = bench::time_ms(warmup, repeats, [&] {
    for (Tensor t : leaves) t.zero_grad();
    if (grad.defined()) {
      forward().backward(grad);
    } else {
      forward().backward();
    }
    synchronize(g_device);
  });
  return {{"kernel", kernel}, {"shape", shape}, {"forward_ms", forward_ms}, {"step_ms", step_ms}};
}

nlohmann::json time_layer_norm(int64_t warmup, int64_t repeats) {
  Generator generator(0);
  const Tensor x = randn({kRows, kWidth}, &generator, {DType::f32, g_device}).requires_grad_();
  const Tensor weight = ones({kWidth}, {DType::f32, g_device}).requires_grad_();
  const Tensor bias = zeros({kWidth}, {DType::f32, g_device}).requires_grad_();
  const Tensor grad = randn({kRows, kWidth}, &generator, {DType::f32, g_device});
  return time_forward_and_step("layer_norm", "8192x768 f32", {x, weight, bias}, grad, warmup,
                               repeats, [&] { return layer_norm(x, weight, bias); });
}

nlohmann::json time_cross_entropy(int64_t warmup, int64_t repeats) {
  Generator generator(0);
  const Tensor logits =
      randn({kRows, kVocab}, &generator, {DType::f32, g_device}).to(DType::bf16).requires_grad_();
  std::vector<int64_t> ids(kRows);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = (i * 7919) % kVocab;
  const Tensor targets = from_vector(ids, {kRows}).to(g_device);
  return time_forward_and_step("cross_entropy", "8192x50257 bf16", {logits}, Tensor(), warmup,
                               repeats, [&] { return cross_entropy(logits, targets); });
}

nlohmann::json time_adamw(int64_t warmup, int64_t repeats) {
  Generator generator(0);
  std::vector<Shape> shapes = {{kVocab, kWidth}, {1024, kWidth}, {kWidth}, {kWidth}};
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (const Shape& s : std::vector<Shape>{{kWidth},
                                             {kWidth},
                                             {3 * kWidth, kWidth},
                                             {3 * kWidth},
                                             {kWidth, kWidth},
                                             {kWidth},
                                             {kWidth},
                                             {kWidth},
                                             {4 * kWidth, kWidth},
                                             {4 * kWidth},
                                             {kWidth, 4 * kWidth},
                                             {kWidth}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({kVocab, kWidth});
  NamedParameters parameters;
  int64_t count = 0;
  for (const Shape& s : shapes) {
    Tensor p = (randn(s, &generator, {DType::f32, g_device}) * 0.02).requires_grad_();
    p.set_grad(randn(s, &generator, {DType::f32, g_device}) * 1e-3);
    std::string name = "p";
    name += std::to_string(parameters.size());  // "p" + to_string trips GCC 12's -Wrestrict
    parameters.emplace_back(name, p);
    count += p.numel();
  }
  AdamW optimizer(parameters, {3e-4, 0.9, 0.95, 1e-8, 0.1});
  const auto step_ms = bench::time_ms(warmup, repeats, [&] {
    optimizer.step();
    synchronize(g_device);
  });
  return {{"kernel", "adamw"},
          {"shape", std::to_string(parameters.size()) + " tensors, " + std::to_string(count) +
                        " parameters"},
          {"step_ms", step_ms}};
}

// got (on the device) is want (on the host) up to the f32 sums' order.
void check_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const double scale = max(abs(want)).item<double>();
  const double off = max(abs(got.to(Device::cpu()) - want)).item<double>();
  PIPIT_CHECK(off <= 1e-4 * scale, "bias_grad: ", what, " is off by ", off, " (largest element ",
              scale, ")");
}

// One row per Linear shape (out features x in features); prints each as it goes.
void time_bias_grad(int64_t warmup, int64_t repeats) {
  Generator generator(0);
  Backend& device = backend(g_device);
  for (const auto& [N, K] : std::vector<std::pair<int64_t, int64_t>>{{3 * kWidth, kWidth},
                                                                     {kWidth, kWidth},
                                                                     {4 * kWidth, kWidth},
                                                                     {kWidth, 4 * kWidth},
                                                                     {50304, kWidth}}) {
    const Tensor grad_out = randn({kRows, N}, &generator, {DType::f32, g_device}).to(DType::bf16);
    const Tensor input = randn({kRows, K}, &generator, {DType::f32, g_device}).to(DType::bf16);
    const Tensor a = transpose(grad_out, 0, 1);
    const Tensor weight_grad = Tensor::empty({N, K}, DType::f32, g_device);
    const Tensor bias_grad = Tensor::empty({N}, DType::f32, g_device);
    const Tensor column_sums = Tensor::empty({N}, DType::bf16, g_device);
    const int64_t rows[] = {0};
    const auto fused_ms = bench::time_ms(warmup, repeats, [&] {
      device.matmul_bias_grad(a, input, weight_grad, bias_grad);
      synchronize(g_device);
    });
    const auto split_ms = bench::time_ms(warmup, repeats, [&] {
      device.matmul(a, input, weight_grad, false);
      device.reduce(ReduceOp::sum, grad_out, rows, column_sums);
      synchronize(g_device);
    });
    const Tensor product = weight_grad.to(Device::cpu());
    nlohmann::json row = {{"kernel", "bias_grad"},
                          {"shape", std::to_string(N) + "x" + std::to_string(K)},
                          {"fused_ms", fused_ms},
                          {"split_ms", split_ms}};
    for (const int64_t parts : {2, 4}) {
      // a's columns (grad_out's rows) in `parts` slices, each a transposed [N, rows / parts].
      const int64_t slice = kRows / parts;
      const Tensor a_parts = Tensor::from_storage(
          grad_out.storage(), {parts, N, slice}, {slice * N, 1, N}, grad_out.offset(), DType::bf16);
      const Tensor input_parts = reshape(input, {parts, slice, K});
      const Tensor partial = Tensor::empty({parts, N, K}, DType::f32, g_device);
      const Tensor summed = reshape(weight_grad, {1, N, K});
      row["rows_in_" + std::to_string(parts) + "_ms"] = bench::time_ms(warmup, repeats, [&] {
        device.matmul(a_parts, input_parts, partial, false);
        device.reduce(ReduceOp::sum, partial, rows, summed);
        device.reduce(ReduceOp::sum, grad_out, rows, column_sums);
        synchronize(g_device);
      });
      check_close(weight_grad, product,
                  "the product over " + std::to_string(parts) + " slices of the rows");
    }
    const Tensor bias_product = bias_grad.to(Device::cpu());
    for (const int parts : {2, 4}) {
      cuda::set_weight_gradient_parts(parts);
      row["parts_" + std::to_string(parts) + "_ms"] = bench::time_ms(warmup, repeats, [&] {
        device.matmul_bias_grad(a, input, weight_grad, bias_grad);
        synchronize(g_device);
      });
      cuda::set_weight_gradient_parts(1);
      const std::string what = "matmul_bias_grad in " + std::to_string(parts) + " parts";
      check_close(weight_grad, product, what);
      check_close(bias_grad, bias_product, what + " (bias)");
    }
    bench::print_row(row);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("gpu_kernels", "GPT-2 small's LayerNorm, cross-entropy and AdamW.");
    flags.add("kernels", "layer_norm,cross_entropy,adamw", "kernels to time");
    bench::add_timing_flags(flags);
    flags.add("device", "cuda", "cuda (cuda:0), or cpu to check this program without a GPU");
    flags.parse(argc, argv);
    const auto kernels =
        flags.choices("kernels", {"layer_norm", "cross_entropy", "adamw", "bias_grad"});
    const auto [warmup, repeats] = bench::timing(flags);
    if (flags.choice("device", {"cuda", "cpu"}) == "cpu") {
      g_device = Device::cpu();
    } else if (!bench::has_cuda_device("gpu_kernels")) {
      return 0;
    }
    for (const auto& kernel : kernels) {
      if (kernel == "bias_grad") {
        time_bias_grad(warmup, repeats);
        continue;
      }
      const nlohmann::json row = kernel == "layer_norm"      ? time_layer_norm(warmup, repeats)
                                 : kernel == "cross_entropy" ? time_cross_entropy(warmup, repeats)
                                                             : time_adamw(warmup, repeats);
      bench::print_row(row);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels: %s\n", e.what());
    return 1;
  }
}
