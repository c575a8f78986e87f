#include "pipeline/pipeline.h"

#include <cstdio>

#include "autograd/grad_mode.h"
#include "nn/registry.h"

namespace pipit {

std::vector<LayerRange> partition_model(const Sequential& model, const PipelineConfig& config) {
  validate(config);
  PIPIT_CHECK(!config.rebalance.enabled || model.ties().empty(),
              "rebalancing: ", remap_refusal(model));
  if (!config.layer_counts.empty()) {
    return ranges_from_counts(config.layer_counts, model.size(),
                              static_cast<size_t>(config.stages) * config.chunks_per_stage);
  }
  if (config.partition == "parameters") {
    return partition_by_parameters(model, config.stages, config.chunks_per_stage);
  }
  return stage_layer_ranges(model.size(), config.stages, config.chunks_per_stage);
}

std::vector<std::string> layer_kinds(const Sequential& model) {
  std::vector<std::string> kinds;
  for (size_t i = 0; i < model.size(); ++i) kinds.push_back(model[i]->config().dump());
  return kinds;
}

StageSpec make_stage_spec(const Sequential& model, const std::vector<LayerRange>& ranges,
                          const PipelineConfig& config, int stage, const StateDict& optimizer_state,
                          int replica) {
  StageSpec spec;
  spec.stage = stage;
  spec.stages = config.stages;
  spec.replica = replica;
  spec.replicas = config.replicas;
  spec.shard_optimizer = config.shard_optimizer && config.replicas > 1;
  spec.chunks_per_stage = config.chunks_per_stage;
  spec.schedule = config.schedule;
  spec.schedule_table = config.schedule_table;
  spec.recompute = config.recompute == "full";
  spec.max_deferred = config.max_deferred;
  spec.optimizer = config.optimizer;
  for (int local = 0; local < config.chunks_per_stage; ++local) {
    const int global = global_chunk(stage, local, config.stages, placement_of(config.schedule));
    const LayerRange& range = ranges.at(static_cast<size_t>(global));
    spec.chunks.push_back(model.untied_slice(range.begin, range.end));
  }
  for (const TiedParameter& tie : tied_parameters(model, ranges, config)) {
    if (tie.source_stage == stage || tie.copy_stage == stage) spec.ties.push_back(tie);
  }
  spec.optimizer_state = optimizer_state;
  if (!config.devices.empty()) {
    spec.device = Device::parse(config.devices[static_cast<size_t>(stage) % config.devices.size()]);
  }
  if (!config.slowdown.empty()) {
    spec.slowdown = config.slowdown[static_cast<size_t>(stage) % config.slowdown.size()];
  }
  spec.compute_dtype = dtype_from_name(config.dtype == "f32"    ? "F32"
                                       : config.dtype == "bf16" ? "BF16"
                                                                : "F16");
  return spec;
}

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

Pipeline::Pipeline(std::shared_ptr<Sequential> model, PipelineConfig config,
                   const StateDict& optimizer_state)
    : model_(std::move(model)), hub_(LocalHub::create()) {
  PIPIT_CHECK(model_ != nullptr, "Pipeline: the model is null");
  std::vector<LayerRange> ranges = partition_model(*model_, config);
  for (int k = 0; k < config.replicas; ++k) {
    const Sequential& model = k == 0 ? *model_ : *replica_models_.emplace_back(copy_model(*model_));
    for (int s = 0; s < config.stages; ++s) {
      stages_.push_back(
          std::make_shared<Stage>(make_stage_spec(model, ranges, config, s, optimizer_state, k),
                                  hub_->endpoint(replica_endpoint(k, s, config.stages))));
    }
  }
  const bool rebalance = config.rebalance.enabled;
  coordinator_ = std::make_unique<Coordinator>(hub_->endpoint(kCoordinator), std::move(config),
                                               std::move(ranges));
  coordinator_->on_remap([this] { adopt_stage_modules(); });
  coordinator_->refuse_remaps(remap_refusal(*model_));
  if (rebalance) coordinator_->enable_rebalancing(layer_kinds(*model_));
  for (const auto& stage : stages_) {
    auto stopped = std::make_shared<std::promise<void>>();
    stopped_.push_back(stopped->get_future());
    // The thread owns its stage too, so a stage that outlives the deadline below stays valid.
    threads_.emplace_back([stage, stopped] {
      stage->run();
      stopped->set_value();
    });
  }
}

void Pipeline::adopt_stage_modules() {
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

Pipeline::~Pipeline() {
  coordinator_->shutdown();
  // A stage stuck inside a layer cannot be interrupted: after the pipeline's timeout its
  // thread is left to finish on its own instead of hanging the caller here.
  const auto deadline = std::chrono::steady_clock::now() + coordinator_->config().timeout;
  for (size_t s = 0; s < threads_.size(); ++s) {
    if (stopped_[s].wait_until(deadline) == std::future_status::ready) {
      threads_[s].join();
    } else {
      std::fprintf(stderr,
                   "pipit: stage %zu did not stop within %lld ms of the pipeline's end; its "
                   "thread is left running\n",
                   s, static_cast<long long>(coordinator_->config().timeout.count()));
      threads_[s].detach();
    }
  }
}

}  // namespace pipit
