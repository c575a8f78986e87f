// pipit's part of bench/cpu_vs_torch.py: times training steps of one model and prints one
// JSON line {"model": ..., "threads": ..., "ms": [per-step times]}. The driver alternates
// this program with the same model in PyTorch and JAX and reports medians and ratios.
// `cpu_vs_torch --model peak` prints the FP32 peak of one core, {"gflops": ..., "isa": ...}.
// --dtype bf16 runs mlp and gpt under autocast (bf16 products, f32 weights and optimizer).
// --profile adds "ops": each backend op's ms per step (OpTimer) over one more step.
#include <chrono>
#include <cstdio>
#include <string>

#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/peak_flops.h"
#include "support/run_flags.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/op_timer.h"

using namespace pipit;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct RunOptions {
  int warmup = 2, steps = 10;
  DType dtype = DType::f32;  // bf16: the step runs under autocast
  bool profile = false;
};

// Each backend op's ms in one step, most first (RunOptions::profile).
std::vector<OpTimer::Op> g_profile;

template <typename Step>
std::vector<double> time_steps(const RunOptions& options, Step step) {
  AutocastGuard autocast(options.dtype);
  for (int i = 0; i < options.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < options.steps; ++i) {
    auto start = Clock::now();
    step();
    times.push_back(ms_since(start));
  }
  if (options.profile) {
    OpTimer timer(backend(Device::cpu()));
    Backend* previous = set_backend_override(Device::cpu(), &timer);
    timer.set_enabled(true);
    step();
    set_backend_override(Device::cpu(), previous);
    g_profile = timer.report();
  }
  return times;
}

std::vector<double> bench_mlp(const RunOptions& options) {
  Generator generator(0);
  auto model = mlp({784, 1024, 1024, 10}, "relu", &generator);
  SGD optimizer(model->named_parameters(), {0.01, 0.9, 0.0});
  CrossEntropyLoss loss_fn;
  Tensor x = randn({256, 784}, &generator);
  std::vector<int64_t> labels(256);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  Tensor y = from_vector(labels, {256});
  return time_steps(options, [&] {
    optimizer.zero_grad();
    loss_fn.compute_loss(model->forward(x), y).backward();
    optimizer.step();
  });
}

std::vector<double> bench_gpt(const RunOptions& options) {
  Generator generator(0);
  auto model = gpt({65, 128, 4, 4, 128, 0.0}, &generator);
  AdamW optimizer(model->named_parameters(), {3e-4, 0.9, 0.95, 1e-8, 0.01});
  CrossEntropyLoss loss_fn;
  std::vector<int64_t> tokens(16 * 128), targets(16 * 128);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 7) % 65);
    targets[i] = static_cast<int64_t>((i * 7 + 3) % 65);
  }
  Tensor x = from_vector(tokens, {16, 128}), y = from_vector(targets, {16, 128});
  return time_steps(options, [&] {
    optimizer.zero_grad();
    loss_fn.compute_loss(model->forward(x), y).backward();
    optimizer.step();
  });
}

// Microseconds per 1-element add, measured over batches of 10000 adds.
std::vector<double> bench_tiny_op(const RunOptions& options) {
  Tensor a = tensor({1.0f}), b = tensor({2.0f});
  constexpr int kOps = 10000;
  std::vector<double> ms = time_steps(options, [&] {
    for (int i = 0; i < kOps; ++i) a = add(a, b);
  });
  for (double& v : ms) v = v * 1000.0 / kOps;
  return ms;
}

// Milliseconds for add, mul and gelu of bf16 [4096, 1024] tensors: elementwise ops on half
// activations, computed in f32 and rounded once.
std::vector<double> bench_bf16_ops(const RunOptions& options) {
  Generator generator(0);
  Tensor a = randn({4096, 1024}, &generator).to(DType::bf16);
  Tensor b = randn({4096, 1024}, &generator).to(DType::bf16);
  return time_steps(options,
                    [&] { Tensor sum = add(a, b), product = mul(a, b), activated = gelu(a); });
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("cpu_vs_torch",
                       "Times training steps of one model and prints them as a JSON line.");
  flags.add("model", "mlp", "mlp, gpt, tiny_op, bf16_ops, or peak: one core's FP32 peak");
  support::add_threads_flag(flags, "1");
  flags.add("warmup", "2", "untimed steps first");
  flags.add("steps", "10", "timed steps");
  flags.add("gemm", "auto", "GEMM provider: auto, onednn or openblas");
  flags.add("dtype", "f32", "mlp and gpt: f32, or bf16 under autocast");
  flags.add_switch("bf16-widened", "bf16 products widened to f32 (set_cpu_bf16_dot(false))");
  flags.add_switch("profile", "time every backend op (OpTimer) in one more step");
  flags.parse(argc, argv);
  const std::string model = flags.choice("model", {"mlp", "gpt", "tiny_op", "bf16_ops", "peak"});
  const std::string gemm = flags.choice("gemm", {"auto", "onednn", "openblas"});
  if (model == "peak") {
    const support::Peak peak = support::measure_peak_gflops();
    std::printf("{\"gflops\": %.1f, \"isa\": \"%s\"}\n", peak.gflops, peak.isa.c_str());
    return 0;
  }
  const auto threads = static_cast<int>(flags.integer("threads"));
  RunOptions options;
  options.warmup = static_cast<int>(flags.integer("warmup", 0));
  options.steps = static_cast<int>(flags.integer("steps"));
  options.dtype = flags.choice("dtype", {"f32", "bf16"}) == "bf16" ? DType::bf16 : DType::f32;
  options.profile = flags.on("profile");
  if (flags.on("bf16-widened")) set_cpu_bf16_dot(false);
  set_num_threads(threads);
  if (gemm != "auto") {
    set_cpu_gemm_provider(gemm == "onednn" ? GemmProvider::onednn : GemmProvider::openblas);
  }
  std::vector<double> times;
  if (model == "mlp") {
    times = bench_mlp(options);
  } else if (model == "gpt") {
    times = bench_gpt(options);
  } else if (model == "tiny_op") {
    times = bench_tiny_op(options);
  } else {
    times = bench_bf16_ops(options);
  }
  std::printf("{\"model\": \"%s\", \"threads\": %d, \"ms\": [", model.c_str(), threads);
  for (size_t i = 0; i < times.size(); ++i) std::printf("%s%.4f", i ? ", " : "", times[i]);
  std::printf("]");
  if (options.profile) {
    std::printf(", \"ops\": [");
    for (size_t i = 0; i < g_profile.size(); ++i) {
      std::printf("%s[\"%s\", %lld, %.4f]", i ? ", " : "", g_profile[i].name.c_str(),
                  static_cast<long long>(g_profile[i].calls), g_profile[i].ms);
    }
    std::printf("]");
  }
  std::printf("}\n");
  return 0;
}
