#include "pipeline/pipeline.h"

namespace pipit {

std::vector<LayerRange> partition_model(const Sequential& model, const PipelineConfig& config) {
  validate(config);
  if (config.partition == "parameters") {
    return partition_by_parameters(model, config.stages, config.chunks_per_stage);
  }
  return stage_layer_ranges(model.size(), config.stages, config.chunks_per_stage);
}

StageSpec make_stage_spec(const Sequential& model, const std::vector<LayerRange>& ranges,
                          const PipelineConfig& config, int stage,
                          const StateDict& optimizer_state) {
  StageSpec spec;
  spec.stage = stage;
  spec.stages = config.stages;
  spec.chunks_per_stage = config.chunks_per_stage;
  spec.schedule = config.schedule;
  spec.optimizer = config.optimizer;
  for (int local = 0; local < config.chunks_per_stage; ++local) {
    const LayerRange& range = ranges.at(static_cast<size_t>(local * config.stages + stage));
    spec.chunks.push_back(model.slice(range.begin, range.end));
  }
  spec.optimizer_state = optimizer_state;
  if (!config.devices.empty()) {
    spec.device = Device::parse(config.devices[static_cast<size_t>(stage) % config.devices.size()]);
  }
  spec.compute_dtype = dtype_from_name(config.dtype == "f32"    ? "F32"
                                       : config.dtype == "bf16" ? "BF16"
                                                                : "F16");
  return spec;
}

Pipeline::Pipeline(std::shared_ptr<Sequential> model, PipelineConfig config,
                   const StateDict& optimizer_state)
    : model_(std::move(model)), hub_(LocalHub::create()) {
  PIPIT_CHECK(model_ != nullptr, "Pipeline: the model is null");
  ranges_ = partition_model(*model_, config);
  for (int s = 0; s < config.stages; ++s) {
    stages_.push_back(std::make_unique<Stage>(
        make_stage_spec(*model_, ranges_, config, s, optimizer_state), hub_->endpoint(s)));
  }
  coordinator_ = std::make_unique<Coordinator>(hub_->endpoint(kCoordinator), std::move(config));
  for (auto& stage : stages_) threads_.emplace_back([&stage] { stage->run(); });
}

Pipeline::~Pipeline() {
  coordinator_->shutdown();
  for (std::thread& thread : threads_) thread.join();
}

}  // namespace pipit
