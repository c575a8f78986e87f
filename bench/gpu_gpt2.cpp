// pipit's half of bench/gpu_gpt2.py: training steps of a GPT (GPT-2 small by default) on
// cuda:0, AdamW, random tokens. Prints one JSON line per mode:
// {"mode", "tokens", "parameters", "ms": [per step], "loss", "peak_bytes", "cuda_graph"}.
// modes: f32, tf32 (set_float32_matmul_precision("high")), bf16 (AutocastGuard(bf16) around
// forward and backward). With --profile, one more step per mode runs under cuda::OpTimer and
// its top ops are printed as a table before the JSON line. --attention picks the bf16
// attention provider (tensor/cuda/attention_provider.h; automatic by default). With
// --cuda-graph the warm-up steps run eagerly, then the forward and backward are captured once
// (cuda::Graph) and each timed step is a replay plus AdamW's eager step.
//
// usage: gpu_gpt2 [--modes f32,tf32,bf16] [--layers 12] [--heads 12] [--width 768]
//                 [--context 1024] [--vocab 50257] [--vocab-multiple 1] [--tied] [--batch 8]
//                 [--warmup 3] [--steps 10]
//                 [--attention automatic|pipit|cudnn] [--weight-gradient-parts 1] [--profile]
//                 [--top 25] [--cuda-graph]
#include <chrono>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>

#include "autograd/autocast.h"
#include "bench/gpu_bench.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#include "tensor/cuda/attention_provider.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/cuda_graph.h"
#include "tensor/cuda/op_timer.h"
#include "tensor/cuda/weight_gradient_split.h"
#include "tensor/precision.h"
#include "tensor/stream.h"

using namespace pipit;

namespace {

struct Options {
  GptConfig model;
  int64_t batch, warmup, steps, top;
  bool profile, cuda_graph;
};

Tensor random_tokens(int64_t batch, int64_t context, int64_t vocab, std::mt19937_64& rng,
                     Device device) {
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> values(static_cast<size_t>(batch * context));
  for (int64_t& v : values) v = token(rng);
  return from_vector(values, {batch, context}).to(device);
}

void print_profile(const std::string& mode, const std::vector<cuda::OpTime>& ops, double step_ms,
                   int64_t top) {
  double gpu_ms = 0, host_ms = 0;
  for (const auto& op : ops) {
    gpu_ms += op.gpu_ms;
    host_ms += op.host_ms;
  }
  std::printf(
      "\npipit, %s, one step under the op timer: %.2f ms wall; backend ops %.2f ms between "
      "their events, %.2f ms on the host inside them; %.2f ms outside backend ops (autograd "
      "bookkeeping, gaps between launches)\n\n",
      mode.c_str(), step_ms, gpu_ms, host_ms, step_ms - gpu_ms);
  std::printf("| op | calls | GPU ms | share | host ms |\n| --- | --- | --- | --- | --- |\n");
  for (size_t i = 0; i < ops.size() && static_cast<int64_t>(i) < top; ++i) {
    const auto& op = ops[i];
    std::printf("| %s | %lld | %.3f | %.1f %% | %.3f |\n", op.name.c_str(),
                static_cast<long long>(op.calls), op.gpu_ms, 100.0 * op.gpu_ms / step_ms,
                op.host_ms);
  }
  std::printf("\n");
}

nlohmann::json run_mode(const std::string& mode, const Options& o) {
  const Device device = Device::cuda(0);
  set_float32_matmul_precision(mode == "tf32" ? "high" : "highest");
  cuda::reset_peak_memory(device.index);
  Generator generator(0);
  auto model = gpt(o.model, &generator);
  model->to(device);
  AdamW optimizer(model->named_parameters(), {3e-4, 0.9, 0.95, 1e-8, 0.1});
  // A padded head's extra logits take no part in the loss.
  CrossEntropyLoss loss_fn(-100, o.model.vocab_size);
  std::mt19937_64 rng(0);
  const Tensor x = random_tokens(o.batch, o.model.context, o.model.vocab_size, rng, device);
  const Tensor y = random_tokens(o.batch, o.model.context, o.model.vocab_size, rng, device);

  // Detached, so the last step's graph and activations are freed before the next forward.
  Tensor last_loss;
  auto forward_backward = [&] {
    AutocastGuard autocast(mode == "bf16" ? DType::bf16 : DType::f32);
    Tensor loss = loss_fn.compute_loss(model->forward(x), y);
    loss.backward();
    last_loss = loss.detach();
  };
  auto step = [&] {
    optimizer.zero_grad();
    forward_backward();
    optimizer.step();
    synchronize(device);
  };
  std::vector<double> times;
  if (o.cuda_graph) {
    bench::time_ms(o.warmup, 0, step);
    optimizer.zero_grad();
    cuda::Graph graph(device);
    graph.capture(forward_backward);
    times = bench::time_ms(1, o.steps, [&] {
      graph.replay();
      optimizer.step();
      synchronize(device);
    });
  } else {
    times = bench::time_ms(o.warmup, o.steps, step);
  }
  const float loss = last_loss.to(Device::cpu()).item<float>();
  const size_t peak = cuda::memory_stats(device.index).peak_allocated;

  if (o.profile) {
    cuda::OpTimer timer(backend(device));
    Backend* previous = set_backend_override(device, &timer);
    timer.set_enabled(true);
    const double step_ms = bench::time_ms(0, 1, step)[0];
    timer.set_enabled(false);
    set_backend_override(device, previous);
    print_profile(mode, timer.report(), step_ms, o.top);
  }
  return {{"mode", mode},
          {"tokens", o.batch * o.model.context},
          // The unpadded model's: padded rows compute nothing useful.
          {"parameters", model->parameter_count() -
                             (padded_vocab(o.model) - o.model.vocab_size) * (o.model.width + 1)},
          {"ms", times},
          {"loss", loss},
          {"peak_bytes", peak},
          {"cuda_graph", o.cuda_graph}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("gpu_gpt2", "GPT-2 training steps on one GPU, per precision mode.");
    flags.add("modes", "f32,tf32,bf16", "precision modes to time (f32, tf32, bf16)");
    support::add_gpt_flags(flags, support::gpt2_small(1), support::GptVocabulary::from_flag);
    flags.add("batch", "8", "sequences per step");
    flags.add("warmup", "3", "untimed steps first");
    flags.add("steps", "10", "timed steps");
    flags.add("top", "25", "ops listed by --profile");
    flags.add_switch("profile", "time every backend op (cuda::OpTimer) in one more step");
    flags.add_switch("cuda-graph",
                     "replay the forward and backward as one captured CUDA graph (cuda::Graph)");
    flags.add("attention", "automatic", "fused attention provider: automatic, pipit or cudnn");
    flags.add("weight-gradient-parts", "1",
              "runs of rows a small weight gradient is split over: 1, 2 or 4 "
              "(cuda::set_weight_gradient_parts)");
    flags.parse(argc, argv);
    const auto modes = flags.choices("modes", {"f32", "tf32", "bf16"});
    Options o;
    o.model = support::gpt_config(flags);
    o.batch = flags.integer("batch");
    o.warmup = flags.integer("warmup", 0);
    o.steps = flags.integer("steps");
    o.top = flags.integer("top", 0);
    o.profile = flags.on("profile");
    o.cuda_graph = flags.on("cuda-graph");
    if (o.cuda_graph && o.warmup < 1) flags.fail("--cuda-graph needs --warmup 1 or more");
    const std::string attention = flags.choice("attention", {"automatic", "pipit", "cudnn"});
    const int64_t parts = flags.integer("weight-gradient-parts");
    if (parts != 1 && parts != 2 && parts != 4) {
      flags.fail("--weight-gradient-parts takes 1, 2 or 4, got " + std::to_string(parts));
    }
    if (!bench::has_cuda_device("gpu_gpt2")) return 0;
    cuda::set_weight_gradient_parts(static_cast<int>(parts));
    cuda::set_attention_provider(attention == "cudnn"   ? cuda::AttentionProvider::cudnn
                                 : attention == "pipit" ? cuda::AttentionProvider::pipit
                                                        : cuda::AttentionProvider::automatic);
    for (const auto& mode : modes) {
      bench::print_row(run_mode(mode, o));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_gpt2: %s\n", e.what());
    return 1;
  }
}
