#pragma once
// What the parameter-server tests compare against: single-process training on each step's
// large batch, computed as sequential gradient accumulation, and bitwise comparisons.
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "bitwise.h"
#include "loss/loss.h"
#include "optim/optimizer.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "ps_task.h"

namespace pipit::testing {

constexpr int kSyncWorkers = 3, kSyncSteps = 4;
inline const nlohmann::json kSgd = {
    {"type", "SGD"}, {"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 1e-3}};

// Single-process training on each step's large batch (the workers' batches in worker order),
// as sequential gradient accumulation; the loss of every worker's part of it, by step.
inline std::pair<StateDict, std::vector<std::vector<double>>> large_batch_reference(
    const nlohmann::json& optimizer, const PsTask& task, int workers = kSyncWorkers,
    int64_t steps = kSyncSteps, int64_t hidden = 32) {
  auto reference = make_ps_mlp(hidden);
  auto reference_optimizer = make_optimizer(optimizer, reference->named_parameters());
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  std::vector<std::vector<double>> losses(static_cast<size_t>(workers));
  for (int64_t step = 0; step < steps; ++step) {
    reference_optimizer->zero_grad();
    for (int w = 0; w < workers; ++w) {
      const auto [x, y] = task.batch(workers, w, step);
      Tensor out = reference->forward(x);
      losses[static_cast<size_t>(w)].push_back(loss->compute_loss(out, y).item<double>());
      out.backward(loss->compute_gradient(out, y) * (1.0 / workers));
    }
    reference_optimizer->step();
  }
  return {reference->state_dict(), losses};
}

}  // namespace pipit::testing
