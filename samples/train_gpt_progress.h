#pragma once
// What train_gpt measures as it goes: the held-out batches of the validation loss, model
// FLOPs against a peak (MFU), and peak memory.
#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nn/builders.h"
#include "pipit.h"
#include "support/peak_flops.h"
#include "tensor/cpu/cpu_allocator.h"
#include "tensor/cpu/cpu_backend.h"
#include "train/gpu_peak.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#endif

namespace samples::train_gpt {

using pipit::Tensor;

// `count` batches of `batch` windows of context + 1 tokens, consecutive from the start of
// `tokens` and wrapping around: the same held-out batches at every evaluation, so the
// validation curve moves with the model alone. None when `tokens` are fewer than context + 1.
inline std::vector<std::pair<Tensor, Tensor>> validation_batches(const std::vector<int64_t>& tokens,
                                                                 int64_t count, int64_t batch,
                                                                 int64_t context) {
  std::vector<std::pair<Tensor, Tensor>> batches;
  if (tokens.size() < static_cast<size_t>(context) + 1) return batches;  // no validation
  const size_t windows = (tokens.size() - 1) / static_cast<size_t>(context);
  size_t window = 0;
  for (int64_t b = 0; b < count; ++b) {
    std::vector<int64_t> x, y;
    for (int64_t row = 0; row < batch; ++row, window = (window + 1) % windows) {
      const auto start = tokens.begin() + static_cast<int64_t>(window) * context;
      x.insert(x.end(), start, start + context);
      y.insert(y.end(), start + 1, start + context + 1);
    }
    batches.emplace_back(pipit::from_vector(x, {batch, context}),
                         pipit::from_vector(y, {batch, context}));
  }
  return batches;
}

// Training FLOPs per token: 6 per parameter (forward, and the backward's two products) plus
// attention's 6 * layers * width * context (PaLM's appendix B; llm.c counts the same).
inline double flops_per_token(const pipit::GptConfig& shape, int64_t parameters) {
  return 6.0 * static_cast<double>(parameters) +
         6.0 * static_cast<double>(shape.layers * shape.width * shape.context);
}

// FLOP/s the run's devices could do at most: --peak-tflops; or, with the stages in this
// process, on the CPU the measured FMA peak of one core times the cores the stages use, on
// GPUs the dense peak of each GPU used for `dtype` (train/gpu_peak.h); unknown otherwise.
inline std::optional<double> peak_flops(std::optional<double> peak_tflops,
                                        const std::vector<std::string>& devices,
                                        const std::string& dtype, bool stages_here,
                                        int cores_used) {
  if (peak_tflops) return *peak_tflops * 1e12;
  if (!stages_here) return std::nullopt;
  std::vector<int> gpus;
  bool cpu = devices.empty();
  for (const std::string& name : devices) {
    const pipit::Device device = pipit::Device::parse(name);
    if (device.is_cpu()) cpu = true;
    if (!device.is_cpu() && std::ranges::count(gpus, device.index) == 0)
      gpus.push_back(device.index);
  }
  if (cpu && !gpus.empty()) return std::nullopt;
  if (cpu) {
    const int cores = std::min<int>(cores_used, std::max(1u, std::thread::hardware_concurrency()));
    // bf16 products on the dot product run at its own peak, twice the FMA's.
    const bool bf16_dot = dtype == "bf16" && pipit::cpu_bf16_dot();
    const pipit::support::Peak peak = bf16_dot ? pipit::support::measure_bf16_peak_gflops()
                                               : pipit::support::measure_peak_gflops();
    return peak.gflops * 1e9 * cores;
  }
  double total = 0;
  for (const int gpu : gpus) {
    const std::optional<double> peak = pipit::cuda_dense_peak_flops(gpu, dtype);
    if (!peak) return std::nullopt;
    total += *peak;
  }
  return total;
}

// The most bytes held at once by this process's stages on `devices` since the start, summed
// over the devices they use; unknown when no stage runs in this process.
inline std::optional<int64_t> peak_memory(const std::vector<std::string>& devices,
                                          bool stages_here) {
  if (!stages_here) return std::nullopt;
  int64_t bytes = 0;
  bool cpu = devices.empty();
  std::vector<int> gpus;
  for (const std::string& name : devices) {
    const pipit::Device device = pipit::Device::parse(name);
    if (device.is_cpu()) cpu = true;
    if (!device.is_cpu() && std::ranges::count(gpus, device.index) == 0)
      gpus.push_back(device.index);
  }
  if (cpu) bytes += static_cast<int64_t>(pipit::cpu_memory_stats().peak_allocated);
#ifdef PIPIT_WITH_CUDA
  for (const int gpu : gpus) {
    bytes += static_cast<int64_t>(pipit::cuda::memory_stats(gpu).peak_allocated);
  }
#endif
  return bytes;
}

}  // namespace samples::train_gpt
