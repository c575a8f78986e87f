// The host's share of a training step: GPT-2 small's step (forward, backward, AdamW; bf16
// autocast by default) with every Backend op a no-op, so what is timed is pipit's own work
// between kernels (autograd, shape checks, allocation from the caching allocator, autocast's
// bookkeeping), not the kernels. On a GPU that work overlaps the kernels while it stays below
// the step's GPU time; a CUDA build adds the launches and cuBLASLt's descriptors on top, which
// this does not count. The same steps give the step's memory plan: the most bytes its tensors
// held at once (the CPU allocator's count, as a GPU's caching allocator would count them, up to
// its rounding). Prints one JSON line: {"ms": [per step], "ops": backend calls per step,
// "peak_bytes": the last step's peak}.
//
// usage: host_overhead [--layers 12] [--width 768] [--heads 12] [--context 1024]
//                      [--vocab 50257] [--vocab-multiple 64] [--tied] [--batch 8] [--dtype bf16]
//                      [--warmup 2] [--steps 5]
#include <chrono>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#include "tensor/cpu/cpu_allocator.h"

using namespace pipit;

namespace {

// Every op returns at once and is counted; memory comes from the CPU's caching allocator,
// untouched, as a GPU's comes from its own.
template <typename... T>
void ignore(const T&...) {}

class NoKernels final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override { return cpu_.allocate(nbytes); }
#define PIPIT_NO_KERNEL(name, params, args) \
  void name params override {               \
    ignore args;                            \
    ++calls;                                \
  }
  PIPIT_BACKEND_OPS(PIPIT_NO_KERNEL)
#undef PIPIT_NO_KERNEL
  int64_t calls = 0;

 private:
  Backend& cpu_ = backend(Device::cpu());
};

Tensor tokens(int64_t batch, int64_t context, int64_t vocab) {
  std::vector<int64_t> values(static_cast<size_t>(batch * context));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i * 7919) % vocab;
  return from_vector(values, {batch, context});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    support::Flags flags("host_overhead", "A training step's host work, every kernel a no-op.");
    support::add_gpt_flags(flags, support::gpt2_small(64), support::GptVocabulary::from_flag);
    flags.add("batch", "8", "sequences per step");
    flags.add("dtype", "bf16", "bf16 (autocast) or f32");
    flags.add("warmup", "2", "untimed steps first");
    flags.add("steps", "5", "timed steps");
    flags.parse(argc, argv);
    const std::string dtype = flags.choice("dtype", {"bf16", "f32"});
    const GptConfig config = support::gpt_config(flags);
    const int64_t batch = flags.integer("batch", 1);
    Generator generator(0);
    auto model = gpt(config, &generator);
    AdamW optimizer(model->named_parameters(), {3e-4, 0.9, 0.95, 1e-8, 0.1});
    CrossEntropyLoss loss_fn(-100, config.vocab_size);
    const Tensor x = tokens(batch, config.context, config.vocab_size);
    const Tensor y = tokens(batch, config.context, config.vocab_size);

    NoKernels no_kernels;
    Backend* previous = set_backend_override(Device::cpu(), &no_kernels);
    std::vector<double> ms;
    int64_t ops = 0;
    size_t peak_bytes = 0;
    for (int64_t step = 0; step < flags.integer("warmup", 0) + flags.integer("steps", 1); ++step) {
      const auto start = std::chrono::steady_clock::now();
      const int64_t calls = no_kernels.calls;
      reset_cpu_peak_memory();
      optimizer.zero_grad();
      {
        AutocastGuard autocast(dtype == "bf16" ? DType::bf16 : DType::f32);
        // Two statements, as gpu_gpt2 runs it: the logits are not held through the backward.
        Tensor loss = loss_fn.compute_loss(model->forward(x), y);
        loss.backward();
      }
      optimizer.step();
      if (step >= flags.integer("warmup", 0)) {
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
        ops = no_kernels.calls - calls;
        peak_bytes = cpu_memory_stats().peak_allocated;
      }
    }
    set_backend_override(Device::cpu(), previous);
    std::printf(
        "%s\n",
        nlohmann::json{{"ms", ms}, {"ops", ops}, {"peak_bytes", peak_bytes}}.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_overhead: %s\n", e.what());
    return 1;
  }
}
