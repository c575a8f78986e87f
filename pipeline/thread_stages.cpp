#include "pipeline/thread_stages.h"

#include <cstdio>

#include "autograd/grad_mode.h"
#include "nn/registry.h"
#include "pipeline/coordinator.h"
#include "pipeline/gradients/replica_group.h"

namespace pipit {
namespace {

// A model of the same config and weights, sharing no tensor with `model` (a replica's).
std::shared_ptr<Sequential> copy_model(const Sequential& model) {
  std::shared_ptr<Module> built;
  {
    // Every weight is overwritten below: drawing them first would only cost time.
    SkipInitGuard skip_init;
    built = build_module(model.config());
  }
  auto copy = std::dynamic_pointer_cast<Sequential>(built);
  PIPIT_CHECK(copy != nullptr, "copy_model: the config builds no Sequential");
  NoGradGuard no_grad;
  StateDict weights;
  for (const auto& [name, tensor] : model.state_dict()) weights[name] = tensor.clone();
  copy->load_state_dict(weights);
  copy->to(model.parameters().empty() ? Device::cpu() : model.parameters().front().device());
  return copy;
}

}  // namespace

ThreadStages::ThreadStages(std::shared_ptr<Sequential> model, const PipelineConfig& config,
                           const std::vector<LayerRange>& ranges, const StateDict& optimizer_state)
    : model_(std::move(model)), timeout_(config.timeout), hub_(LocalHub::create()) {
  for (int k = 0; k < config.replicas; ++k) {
    const Sequential& model = k == 0 ? *model_ : *replica_models_.emplace_back(copy_model(*model_));
    for (int s = 0; s < config.stages; ++s) {
      stages_.push_back(
          std::make_shared<Stage>(make_stage_spec(model, ranges, config, s, optimizer_state, k),
                                  hub_->endpoint(replica_endpoint(k, s, config.stages))));
    }
  }
  for (const auto& stage : stages_) {
    auto stopped = std::make_shared<std::promise<void>>();
    stopped_.push_back(stopped->get_future());
    // The thread owns its stage too, so a stage that outlives stop()'s deadline stays valid.
    threads_.emplace_back([stage, stopped] {
      stage->run();
      stopped->set_value();
    });
  }
}

std::shared_ptr<Communicator> ThreadStages::coordinator_endpoint() {
  return hub_->endpoint(kCoordinator);
}

void ThreadStages::coordinate(Coordinator& coordinator) {
  coordinator.on_remap([this] { adopt_stage_modules(); });
}

std::vector<Stage*> ThreadStages::stages() {
  std::vector<Stage*> stages;
  for (const auto& stage : stages_) stages.push_back(stage.get());
  return stages;
}

void ThreadStages::adopt_stage_modules() {
  // Layers that changed stage were rebuilt there: the model takes those modules, so it
  // still holds the weights being trained. (The stage threads are idle between steps, and
  // each stage's RemapDone came after its new chunks were in place.)
  for (const auto& stage : stages_) {
    if (stage->spec().replica != 0) continue;
    for (const auto& chunk : stage->spec().chunks) {
      for (size_t i = 0; i < chunk->size(); ++i) {
        model_->replace(chunk->first_index() + i, (*chunk)[i]);
      }
    }
  }
}

void ThreadStages::stop() {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (size_t s = 0; s < threads_.size(); ++s) {
    if (stopped_[s].wait_until(deadline) == std::future_status::ready) {
      threads_[s].join();
    } else {
      std::fprintf(stderr,
                   "pipit: stage %zu did not stop within %lld ms of the pipeline's end; its "
                   "thread is left running\n",
                   s, static_cast<long long>(timeout_.count()));
      threads_[s].detach();
    }
  }
}

}  // namespace pipit
